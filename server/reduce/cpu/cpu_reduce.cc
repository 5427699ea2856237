#include "server/reduce/cpu/cpu_reduce.h"

#include <cstring>
#include <type_traits>

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

// The value of `value` as the accumulator type A (see AccumulatorDType):
// only the pairs that function produces are ever instantiated.
template <typename A, typename T>
A Widen(T value) {
  if constexpr (std::is_same<T, Float16>::value ||
                std::is_same<T, BFloat16>::value) {
    return ToFloat(value);
  } else {
    return static_cast<A>(value);
  }
}

// The value of accumulator `value` as the storage type T, rounded once.
template <typename T, typename A>
T Narrow(A value) {
  if constexpr (std::is_same<T, Float16>::value) {
    return ToFloat16(value);
  } else if constexpr (std::is_same<T, BFloat16>::value) {
    return ToBFloat16(value);
  } else {
    return static_cast<T>(value);
  }
}

// True for the (storage, accumulator) pairs AccumulatorDType produces.
template <typename T, typename A>
constexpr bool IsAccumulatorPair() {
  constexpr bool half =
      std::is_same<T, Float16>::value || std::is_same<T, BFloat16>::value;
  if (half) return std::is_same<A, float>::value;
  if (!std::is_integral<T>::value || !std::is_integral<A>::value) return false;
  return sizeof(A) == 8 && sizeof(T) < 8 &&
         std::is_signed<T>::value == std::is_signed<A>::value;
}

template <typename T, typename A>
void WidenLoop(A* dst, const T* src, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = Widen<A>(src[i]);
}

template <typename T, typename A>
void NarrowLoop(T* dst, const A* src, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = Narrow<T>(src[i]);
}

template <typename T, typename A, typename Op>
void AccumulateLoop(Op op, A* acc, const T* src, size_t count) {
  for (size_t i = 0; i < count; ++i) acc[i] = op(acc[i], Widen<A>(src[i]));
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

absl::Status Convert(DType from, DType to, void* dst, const void* src,
                     size_t count) {
  if (absl::Status s = reduce::ValidateFinalizeArgs(from, src, count, 1);
      !s.ok()) {
    return CpuError(s);
  }
  if (absl::Status s = reduce::ValidateFinalizeArgs(to, dst, count, 1);
      !s.ok()) {
    return CpuError(s);
  }
  if (from == to) {
    if (count > 0 && dst != src) std::memmove(dst, src, count * DTypeSize(to));
    return absl::OkStatus();
  }
  bool converted = false;
  reduce::DispatchDType(from, [&](auto from_tag) {
    using F = typename decltype(from_tag)::type;
    reduce::DispatchDType(to, [&](auto to_tag) {
      using T = typename decltype(to_tag)::type;
      if constexpr (IsAccumulatorPair<F, T>()) {
        WidenLoop(static_cast<T*>(dst), static_cast<const F*>(src), count);
        converted = true;
      } else if constexpr (IsAccumulatorPair<T, F>()) {
        NarrowLoop(static_cast<T*>(dst), static_cast<const F*>(src), count);
        converted = true;
      }
    });
  });
  if (!converted) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Cpu: no conversion from ", DTypeName(from), " to ", DTypeName(to)));
  }
  return absl::OkStatus();
}

absl::Status AccumulateInto(ReduceOp op, DType dtype, void* acc,
                            const void* src, size_t count) {
  const DType acc_dtype = AccumulatorDType(dtype, op);
  if (acc_dtype == dtype) return ReduceInto(op, dtype, acc, src, count);
  if (absl::Status s =
          reduce::ValidateReduceArgs(op, dtype, src, src, src, count);
      !s.ok()) {
    return CpuError(s);
  }
  if (absl::Status s = reduce::ValidateFinalizeArgs(acc_dtype, acc, count, 1);
      !s.ok()) {
    return CpuError(s);
  }
  if (count == 0) return absl::OkStatus();
  reduce::DispatchDType(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    reduce::DispatchDType(acc_dtype, [&](auto acc_tag) {
      using A = typename decltype(acc_tag)::type;
      if constexpr (IsAccumulatorPair<T, A>()) {
        reduce::DispatchCombineOp(op, [&](auto combine) {
          AccumulateLoop(combine, static_cast<A*>(acc),
                         static_cast<const T*>(src), count);
        });
      }
    });
  });
  return absl::OkStatus();
}

absl::Status ReduceSources(ReduceOp op, DType dtype, void* dst,
                           const void* const* sources, int n, size_t count,
                           std::string* scratch) {
  if (n < 1) {
    return absl::InvalidArgumentError("Cpu: a reduction needs a source");
  }
  const DType acc_dtype = AccumulatorDType(dtype, op);
  void* acc = dst;
  if (acc_dtype != dtype) {
    scratch->resize(count * DTypeSize(acc_dtype));
    acc = scratch->data();
  }
  absl::Status status = Convert(dtype, acc_dtype, acc, sources[0], count);
  for (int i = 1; i < n && status.ok(); ++i) {
    status = AccumulateInto(op, dtype, acc, sources[i], count);
  }
  if (status.ok() && op == ReduceOp::kAvg) {
    status = FinalizeAvg(acc_dtype, acc, count, n);
  }
  if (status.ok() && acc != dst) {
    status = Convert(acc_dtype, dtype, dst, acc, count);
  }
  return status;
}

}  // namespace cpu_reduce
}  // namespace chorus
