// Element types and reduce ops as the reduce engines see them. The numeric
// values mirror chorus.v1.DType and chorus.v1.ReduceOp in
// proto/chorus/v1/types.proto, so converting from the proto is a static_cast
// followed by IsValidDType / IsValidReduceOp. Depends only on Abseil.
//
// Plain values; every function here is pure and thread-safe.
#ifndef CHORUS_COMMON_DTYPE_H_
#define CHORUS_COMMON_DTYPE_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "chorus/types.h"

namespace chorus {

// Returns true for kF16 .. kU64; false for kUnspecified and for any value
// outside the enum (e.g. a static_cast of an unknown proto value).
bool IsValidDType(DType dtype);

// Returns true for kSum .. kAvg; false for kUnspecified and out-of-range
// values.
bool IsValidReduceOp(ReduceOp op);

// Returns the size in bytes of one element (2 for f16/bf16, 4 for f32, ...),
// or 0 for an invalid dtype.
size_t DTypeSize(DType dtype);

// Returns the type `op` over `dtype` combines in across ranks, so that every
// plan computes the same result and rounds once:
// - f16 and bf16 under sum, prod and avg: f32 (partials travel as f32 and
//   are rounded to the 16-bit type once, at the end);
// - integers under avg: the 64-bit integer of the same signedness, so the
//   sum does not wrap before the single division;
// - `dtype` itself otherwise (min and max are exact in every type; integer
//   sum and prod wrap modulo 2^bits whatever width they are computed in).
// Returns kUnspecified for an invalid dtype or op.
DType AccumulatorDType(DType dtype, ReduceOp op);

// Returns the short name: "f16", "bf16", "f32", "f64", "i8", "u8", "i32",
// "i64", "u32", "u64"; "unspecified" for kUnspecified and "unknown" for values
// outside the enum.
absl::string_view DTypeName(DType dtype);

// Returns "sum", "prod", "min", "max" or "avg"; "unspecified" for
// kUnspecified and "unknown" for values outside the enum.
absl::string_view ReduceOpName(ReduceOp op);

// Parses a name as DTypeName writes it (case-insensitive). Returns
// INVALID_ARGUMENT naming the input for anything else, "unspecified" included.
absl::StatusOr<DType> ParseDType(absl::string_view name);

// Parses a name as ReduceOpName writes it (case-insensitive). Returns
// INVALID_ARGUMENT naming the input for anything else, "unspecified" included.
absl::StatusOr<ReduceOp> ParseReduceOp(absl::string_view name);

// Returns OK for a valid dtype, else INVALID_ARGUMENT with its numeric value.
absl::Status ValidateDType(DType dtype);

// Returns OK for a valid op, else INVALID_ARGUMENT with its numeric value.
absl::Status ValidateReduceOp(ReduceOp op);

}  // namespace chorus

#endif  // CHORUS_COMMON_DTYPE_H_
