// The seam between the CUDA host API (cuda_reduce.cc, host compiler) and the
// kernels (the .cu files here, nvcc): one launcher per combine functor, each
// instantiated for every dtype in its own translation unit. Internal to
// chorus_reduce_cuda.
//
// Each launcher enqueues one kernel on `stream` for the current device and
// returns false, launching nothing, for an invalid dtype; launch errors are
// left for cudaGetLastError. Arguments are assumed checked (reduce_args.h).
// Stateless; thread-safe.
#ifndef CHORUS_SERVER_REDUCE_CUDA_REDUCE_LAUNCH_H_
#define CHORUS_SERVER_REDUCE_CUDA_REDUCE_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "common/dtype.h"

namespace chorus {
namespace cuda_reduce {
namespace internal {

// dst[i] = a[i] + b[i] (also the combine step of avg).
bool LaunchSum(DType dtype, void* dst, const void* a, const void* b,
               size_t count, int max_blocks, cudaStream_t stream);
// dst[i] = a[i] * b[i].
bool LaunchProd(DType dtype, void* dst, const void* a, const void* b,
                size_t count, int max_blocks, cudaStream_t stream);
// dst[i] = min(a[i], b[i]).
bool LaunchMin(DType dtype, void* dst, const void* a, const void* b,
               size_t count, int max_blocks, cudaStream_t stream);
// dst[i] = max(a[i], b[i]).
bool LaunchMax(DType dtype, void* dst, const void* a, const void* b,
               size_t count, int max_blocks, cudaStream_t stream);
// data[i] = data[i] / world_size.
bool LaunchFinalizeAvg(DType dtype, void* data, size_t count, int world_size,
                       int max_blocks, cudaStream_t stream);

}  // namespace internal
}  // namespace cuda_reduce
}  // namespace chorus

#endif  // CHORUS_SERVER_REDUCE_CUDA_REDUCE_LAUNCH_H_
