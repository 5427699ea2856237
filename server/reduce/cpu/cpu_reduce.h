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
#include <string>

#include "absl/status/status.h"
#include "common/dtype.h"

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

// dst[i] = src[i] converted from `from` to `to`, for i in [0, count): the
// conversions between a dtype and its accumulator (AccumulatorDType).
// f16/bf16 -> f32 is exact; f32 -> f16/bf16 rounds to nearest even (NaN
// stays NaN); an integer -> its 64-bit integer is exact; a 64-bit integer
// -> a narrower integer keeps the low bits. from == to copies. dst and src
// must not overlap unless from == to and dst == src. Returns OK, or
// INVALID_ARGUMENT (message starting "Cpu: ") for another pair of types, an
// overflowing byte count, or a null or misaligned pointer.
absl::Status Convert(DType from, DType to, void* dst, const void* src,
                     size_t count);

// acc[i] = op(acc[i], src[i] converted to the accumulator type), for i in
// [0, count): combines `count` elements of `dtype` at `src` into `count`
// accumulators of AccumulatorDType(dtype, op) at `acc` (avg sums; finalize
// the accumulators with FinalizeAvg of the accumulator type). Same checks
// and codes as Convert().
absl::Status AccumulateInto(ReduceOp op, DType dtype, void* acc,
                            const void* src, size_t count);

// dst[i] = the reduction of sources[0][i], ..., sources[n - 1][i], combined
// in that order in AccumulatorDType(dtype, op), divided by n for avg, and
// rounded to `dtype` once. `scratch` holds the accumulators between calls
// (resized as needed). Every source holds `count` elements of `dtype`; dst
// may equal sources[0] but must not partially overlap any source. Returns
// OK, or INVALID_ARGUMENT (message starting "Cpu: ") for n < 1 and the
// cases ReduceInto() refuses.
absl::Status ReduceSources(ReduceOp op, DType dtype, void* dst,
                           const void* const* sources, int n, size_t count,
                           std::string* scratch);

}  // namespace cpu_reduce
}  // namespace chorus

#endif  // CHORUS_SERVER_REDUCE_CPU_CPU_REDUCE_H_
