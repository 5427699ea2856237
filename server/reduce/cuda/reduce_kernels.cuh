// CUDA kernels of the reduce engine and their launchers, templated on storage
// type and element functor (element_ops.h). Each kernel hands its thread's
// share of the range to CombineRange / FinalizeRange (combine_range.h), which
// hold the head / 16-byte packs / tail layout. Internal to chorus_reduce_cuda:
// included only by the .cu files of this directory.
//
// Launchers are stateless and thread-safe; kernels run on the given stream.
#ifndef CHORUS_SERVER_REDUCE_CUDA_REDUCE_KERNELS_CUH_
#define CHORUS_SERVER_REDUCE_CUDA_REDUCE_KERNELS_CUH_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "server/reduce/cuda/combine_range.h"
#include "server/reduce/dispatch.h"
#include "server/reduce/element_ops.h"

namespace chorus {
namespace cuda_reduce {
namespace internal {

inline constexpr int kThreadsPerBlock = 256;

__device__ inline size_t FirstIndex() {
  return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ inline size_t GridStride() {
  return static_cast<size_t>(gridDim.x) * blockDim.x;
}

// dst[i] = op(a[i], b[i]); dst may equal a or b.
template <typename T, typename Op>
__global__ void __launch_bounds__(kThreadsPerBlock)
    CombineKernel(Op op, T* dst, const T* a, const T* b, size_t count,
                  Split split) {
  CombineRange(op, dst, a, b, count, split, FirstIndex(), GridStride());
}

// data[i] = finalize(data[i]).
template <typename T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    FinalizeKernel(reduce::AvgFinalize finalize, T* data, size_t count,
                   Split split) {
  FinalizeRange(finalize, data, count, split, FirstIndex(), GridStride());
}

// Returns the grid size for `split`: one thread per pack or per element of
// the longer scalar part, capped at max_blocks (>= 1).
template <typename T>
unsigned int GridSize(size_t count, Split split, int max_blocks) {
  size_t work = split.packs;
  if (split.head > work) work = split.head;
  if (TailCount<T>(count, split) > work) work = TailCount<T>(count, split);
  size_t blocks = (work + kThreadsPerBlock - 1) / kThreadsPerBlock;
  if (blocks > static_cast<size_t>(max_blocks)) blocks = max_blocks;
  if (blocks == 0) blocks = 1;
  return static_cast<unsigned int>(blocks);
}

template <typename T, typename Op>
void LaunchCombineKernel(Op op, T* dst, const T* a, const T* b, size_t count,
                         int max_blocks, cudaStream_t stream) {
  const Split split = SplitRange(
      sizeof(T), count, reinterpret_cast<uintptr_t>(dst),
      reinterpret_cast<uintptr_t>(a), reinterpret_cast<uintptr_t>(b));
  CombineKernel<T, Op>
      <<<GridSize<T>(count, split, max_blocks), kThreadsPerBlock, 0, stream>>>(
          op, dst, a, b, count, split);
}

template <typename T>
void LaunchFinalizeKernel(reduce::AvgFinalize finalize, T* data, size_t count,
                          int max_blocks, cudaStream_t stream) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(data);
  const Split split = SplitRange(sizeof(T), count, address, address, address);
  FinalizeKernel<T>
      <<<GridSize<T>(count, split, max_blocks), kThreadsPerBlock, 0, stream>>>(
          finalize, data, count, split);
}

// Enqueues dst = op(a, b) over `count` elements of `dtype` on `stream`.
// Returns false, launching nothing, for an invalid dtype. Launch errors are
// left for cudaGetLastError.
template <typename Op>
bool LaunchCombine(Op op, DType dtype, void* dst, const void* a, const void* b,
                   size_t count, int max_blocks, cudaStream_t stream) {
  return reduce::DispatchDType(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    LaunchCombineKernel<T>(op, static_cast<T*>(dst), static_cast<const T*>(a),
                           static_cast<const T*>(b), count, max_blocks, stream);
  });
}

}  // namespace internal
}  // namespace cuda_reduce
}  // namespace chorus

#endif  // CHORUS_SERVER_REDUCE_CUDA_REDUCE_KERNELS_CUH_
