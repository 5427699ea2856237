// The CPU reduce engine: element-wise sum, prod, min, max and avg over host
// buffers of any Chorus dtype, with the element semantics of element_ops.h
// (bit-identical to the CUDA kernels, NaN payloads aside). Each call
// dispatches on (op, dtype) once and runs a tight loop the compiler
// vectorises.
//
// avg is two steps: combine the ranks' buffers with ReduceInto/Reduce passing
// ReduceOp::kAvg (which sums), then call FinalizeAvg once on the total.
//
// Stateless free functions; thread-safe as long as concurrent calls do not
// write buffers another call reads or writes.
#ifndef CHORUS_SERVER_REDUCE_CPU_CPU_REDUCE_H_
#define CHORUS_SERVER_REDUCE_CPU_CPU_REDUCE_H_

#include <cstddef>

#include "absl/status/status.h"
#include "server/reduce/dtype.h"

namespace chorus {
namespace cpu_reduce {

// dst[i] = op(dst[i], src[i]) for i in [0, count). Buffers hold `count`
// elements of `dtype`, aligned to the element size; src may equal dst but must
// not partially overlap it. Null pointers are allowed when count is 0.
// Returns OK, or INVALID_ARGUMENT (message starting "Cpu: ") for an invalid
// op or dtype, a byte count that overflows, a null or misaligned pointer, or
// a partial overlap; nothing is written then.
absl::Status ReduceInto(ReduceOp op, DType dtype, void* dst, const void* src,
                        size_t count);

// dst[i] = op(a[i], b[i]) for i in [0, count). dst may equal a or b but must
// not partially overlap either; a and b may overlap freely. Same alignment,
// null-pointer rules and status codes as ReduceInto.
absl::Status Reduce(ReduceOp op, DType dtype, void* dst, const void* a,
                    const void* b, size_t count);

// data[i] = data[i] / world_size for i in [0, count): the last step of avg.
// Integers divide truncating toward zero; f16/bf16 divide in float and round
// back. Returns OK, or INVALID_ARGUMENT (message starting "Cpu: ") for an
// invalid dtype, an overflowing byte count, a null or misaligned pointer, or
// world_size < 1.
absl::Status FinalizeAvg(DType dtype, void* data, size_t count, int world_size);

}  // namespace cpu_reduce
}  // namespace chorus

#endif  // CHORUS_SERVER_REDUCE_CPU_CPU_REDUCE_H_
