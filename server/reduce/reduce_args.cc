#include "server/reduce/reduce_args.h"

#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"

namespace chorus {
namespace reduce {
namespace {

// Checks count and one buffer; `what` names the buffer in the message.
absl::Status ValidateBuffer(DType dtype, const void* data, size_t count,
                            const char* what) {
  if (count == 0) return absl::OkStatus();
  if (data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is null with count ", count));
  }
  const size_t size = DTypeSize(dtype);
  if (reinterpret_cast<uintptr_t>(data) % size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not aligned to the ", size, "-byte ",
                     DTypeName(dtype), " element size"));
  }
  return absl::OkStatus();
}

absl::Status ValidateCount(DType dtype, size_t count) {
  if (count > std::numeric_limits<size_t>::max() / DTypeSize(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "count ", count, " of ", DTypeName(dtype), " overflows size_t bytes"));
  }
  return absl::OkStatus();
}

// True when [x, x + bytes) and [y, y + bytes) share a byte but x != y.
bool PartiallyOverlaps(const void* x, const void* y, size_t bytes) {
  const uintptr_t px = reinterpret_cast<uintptr_t>(x);
  const uintptr_t py = reinterpret_cast<uintptr_t>(y);
  if (px == py) return false;
  return px < py ? py - px < bytes : px - py < bytes;
}

}  // namespace

absl::Status ValidateReduceArgs(ReduceOp op, DType dtype, const void* dst,
                                const void* a, const void* b, size_t count) {
  if (absl::Status s = ValidateReduceOp(op); !s.ok()) return s;
  if (absl::Status s = ValidateDType(dtype); !s.ok()) return s;
  if (absl::Status s = ValidateCount(dtype, count); !s.ok()) return s;
  if (absl::Status s = ValidateBuffer(dtype, dst, count, "dst"); !s.ok()) {
    return s;
  }
  if (absl::Status s = ValidateBuffer(dtype, a, count, "a"); !s.ok()) return s;
  if (absl::Status s = ValidateBuffer(dtype, b, count, "b"); !s.ok()) return s;
  const size_t bytes = count * DTypeSize(dtype);
  if (PartiallyOverlaps(dst, a, bytes) || PartiallyOverlaps(dst, b, bytes)) {
    return absl::InvalidArgumentError(
        "dst partially overlaps an input; it must equal it or be disjoint");
  }
  return absl::OkStatus();
}

absl::Status ValidateFinalizeArgs(DType dtype, const void* data, size_t count,
                                  int world_size) {
  if (absl::Status s = ValidateDType(dtype); !s.ok()) return s;
  if (absl::Status s = ValidateCount(dtype, count); !s.ok()) return s;
  if (absl::Status s = ValidateBuffer(dtype, data, count, "data"); !s.ok()) {
    return s;
  }
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size ", world_size, " must be at least 1"));
  }
  return absl::OkStatus();
}

}  // namespace reduce
}  // namespace chorus
