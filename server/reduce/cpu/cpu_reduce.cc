#include "server/reduce/cpu/cpu_reduce.h"

#include "absl/strings/str_cat.h"
#include "server/reduce/dispatch.h"
#include "server/reduce/element_ops.h"
#include "server/reduce/reduce_args.h"

namespace chorus {
namespace cpu_reduce {
namespace {

// The loops below are the whole engine. They are kept free of calls that are
// not inlined so that the vectoriser sees straight-line element code; dst is
// compared with the inputs at run time by the compiler's alias checks.

template <typename T, typename Op>
void CombineInPlace(Op op, T* dst, const T* src, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = op(dst[i], src[i]);
}

template <typename T, typename Op>
void CombineOutOfPlace(Op op, T* dst, const T* a, const T* b, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = op(a[i], b[i]);
}

template <typename T>
void Finalize(reduce::AvgFinalize finalize, T* data, size_t count) {
  for (size_t i = 0; i < count; ++i) data[i] = finalize(data[i]);
}

absl::Status CpuError(const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("Cpu: ", status.message()));
}

}  // namespace

absl::Status ReduceInto(ReduceOp op, DType dtype, void* dst, const void* src,
                        size_t count) {
  return Reduce(op, dtype, dst, dst, src, count);
}

absl::Status Reduce(ReduceOp op, DType dtype, void* dst, const void* a,
                    const void* b, size_t count) {
  if (absl::Status s = reduce::ValidateReduceArgs(op, dtype, dst, a, b, count);
      !s.ok()) {
    return CpuError(s);
  }
  if (count == 0) return absl::OkStatus();
  reduce::DispatchDType(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    reduce::DispatchCombineOp(op, [&](auto combine) {
      T* out = static_cast<T*>(dst);
      const T* in_a = static_cast<const T*>(a);
      const T* in_b = static_cast<const T*>(b);
      if (out == in_a) {
        CombineInPlace(combine, out, in_b, count);
      } else {
        CombineOutOfPlace(combine, out, in_a, in_b, count);
      }
    });
  });
  return absl::OkStatus();
}

absl::Status FinalizeAvg(DType dtype, void* data, size_t count,
                         int world_size) {
  if (absl::Status s =
          reduce::ValidateFinalizeArgs(dtype, data, count, world_size);
      !s.ok()) {
    return CpuError(s);
  }
  if (count == 0 || world_size == 1) return absl::OkStatus();
  reduce::DispatchDType(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    Finalize(reduce::AvgFinalize{world_size}, static_cast<T*>(data), count);
  });
  return absl::OkStatus();
}

}  // namespace cpu_reduce
}  // namespace chorus
