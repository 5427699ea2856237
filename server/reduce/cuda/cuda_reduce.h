// The CUDA reduce engine: element-wise sum, prod, min, max and avg over
// device buffers of any Chorus dtype, with the element semantics of
// element_ops.h, bit-identical to the CPU engine (cpu/cpu_reduce.h) except
// for NaN payloads. Kernels use 16-byte vector loads where the buffers allow.
//
// Every call enqueues work on a caller-provided stream and returns without
// waiting: an OK status means the kernel was launched. Errors that happen
// while it runs (e.g. a pointer that is not device memory) surface on the
// stream, e.g. from cudaStreamSynchronize. The default stream (nullptr,
// cudaStreamLegacy, cudaStreamPerThread) is refused. The calling thread's
// current device is switched to `device` for the launch and restored before
// returning.
//
// avg is two steps: combine with ReduceInto/Reduce passing ReduceOp::kAvg
// (which sums), then FinalizeAvg once on the total.
//
// Stateless free functions; thread-safe, with the usual stream-ordering rules
// for the buffers.
#ifndef CHORUS_SERVER_REDUCE_CUDA_CUDA_REDUCE_H_
#define CHORUS_SERVER_REDUCE_CUDA_CUDA_REDUCE_H_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace chorus {
namespace cuda_reduce {

// Enqueues dst[i] = op(dst[i], src[i]) for i in [0, count) on `stream`, a
// stream of CUDA device `device` that holds (or can access) both buffers.
// Buffers hold `count` elements of `dtype`, aligned to the element size; src
// may equal dst but must not partially overlap it. Null pointers are allowed
// when count is 0 (nothing is launched then).
// Returns OK once launched. Failure messages start with the device name,
// e.g. "Cuda(0): ", and quote the CUDA error string where there is one:
// INVALID_ARGUMENT for an invalid op or dtype, an overflowing byte count, a
// null or misaligned pointer, a partial overlap, a default stream, or a
// device index that does not exist; UNAVAILABLE when there is no CUDA driver
// or device; INTERNAL for any other CUDA error from the launch.
absl::Status ReduceInto(int device, ReduceOp op, DType dtype, void* dst,
                        const void* src, size_t count, cudaStream_t stream);

// Enqueues dst[i] = op(a[i], b[i]) for i in [0, count). dst may equal a or b
// but must not partially overlap either; a and b may overlap freely. Same
// rules and status codes as ReduceInto.
absl::Status Reduce(int device, ReduceOp op, DType dtype, void* dst,
                    const void* a, const void* b, size_t count,
                    cudaStream_t stream);

// Enqueues data[i] = data[i] / world_size for i in [0, count): the last step
// of avg (integers truncate toward zero; f16/bf16 divide in float). Same
// rules and status codes as ReduceInto, plus INVALID_ARGUMENT for
// world_size < 1.
absl::Status FinalizeAvg(int device, DType dtype, void* data, size_t count,
                         int world_size, cudaStream_t stream);

}  // namespace cuda_reduce
}  // namespace chorus

#endif  // CHORUS_SERVER_REDUCE_CUDA_CUDA_REDUCE_H_
