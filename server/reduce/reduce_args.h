// Argument checks shared by the reduce engines (CPU and CUDA), so that both
// refuse the same calls with the same words. The engines prefix the message
// with the device that would have run the call ("Cpu: ", "Cuda(0): ").
//
// Pure functions over pointer values (never dereferenced); thread-safe.
#ifndef CHORUS_SERVER_REDUCE_REDUCE_ARGS_H_
#define CHORUS_SERVER_REDUCE_REDUCE_ARGS_H_

#include <cstddef>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace chorus {
namespace reduce {

// Checks dst = op(a, b) over `count` elements of `dtype`: op and dtype are
// valid; count * DTypeSize(dtype) fits in size_t; when count > 0 the pointers
// are non-null and aligned to the element size, and dst is either equal to or
// disjoint from each of a and b (a and b may overlap each other). Pass
// a == dst for the in-place form. Returns OK or INVALID_ARGUMENT.
absl::Status ValidateReduceArgs(ReduceOp op, DType dtype, const void* dst,
                                const void* a, const void* b, size_t count);

// Checks FinalizeAvg over `count` elements of `dtype` at `data`: dtype is
// valid, count * DTypeSize(dtype) fits, data is non-null and aligned when
// count > 0, and world_size >= 1. Returns OK or INVALID_ARGUMENT.
absl::Status ValidateFinalizeArgs(DType dtype, const void* data, size_t count,
                                  int world_size);

}  // namespace reduce
}  // namespace chorus

#endif  // CHORUS_SERVER_REDUCE_REDUCE_ARGS_H_
