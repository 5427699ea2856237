// Maps a runtime (DType, ReduceOp) to the storage type and combine functor
// the engines' templated loops take, so each call switches once and then runs
// a loop with no per-element dispatch. Header-only; used by the CPU engine
// (host compiler) and the CUDA launchers (nvcc).
//
// Pure functions; thread-safe.
#ifndef CHORUS_SERVER_REDUCE_DISPATCH_H_
#define CHORUS_SERVER_REDUCE_DISPATCH_H_

#include <cstdint>

#include "common/dtype.h"
#include "common/half.h"
#include "server/reduce/element_ops.h"

namespace chorus {
namespace reduce {

// An empty value naming a type, to pass types through generic lambdas.
template <typename T>
struct TypeTag {
  using type = T;
};

// Calls visitor(TypeTag<T>{}) where T is the storage type of `dtype`:
// Float16, BFloat16, float, double, int8_t, uint8_t, int32_t, int64_t,
// uint32_t, uint64_t. Returns false, without calling it, for an invalid dtype.
template <typename Visitor>
bool DispatchDType(DType dtype, Visitor&& visitor) {
  switch (dtype) {
    case DType::kF16:
      visitor(TypeTag<Float16>{});
      return true;
    case DType::kBF16:
      visitor(TypeTag<BFloat16>{});
      return true;
    case DType::kF32:
      visitor(TypeTag<float>{});
      return true;
    case DType::kF64:
      visitor(TypeTag<double>{});
      return true;
    case DType::kI8:
      visitor(TypeTag<int8_t>{});
      return true;
    case DType::kU8:
      visitor(TypeTag<uint8_t>{});
      return true;
    case DType::kI32:
      visitor(TypeTag<int32_t>{});
      return true;
    case DType::kI64:
      visitor(TypeTag<int64_t>{});
      return true;
    case DType::kU32:
      visitor(TypeTag<uint32_t>{});
      return true;
    case DType::kU64:
      visitor(TypeTag<uint64_t>{});
      return true;
    case DType::kUnspecified:
      break;
  }
  return false;
}

// Calls visitor(F{}) where F is the combine functor of `op`: SumOp for sum and
// for avg (which divides afterwards, see AvgFinalize), ProdOp, MinOp, MaxOp.
// Returns false, without calling it, for an invalid op.
template <typename Visitor>
bool DispatchCombineOp(ReduceOp op, Visitor&& visitor) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      visitor(SumOp{});
      return true;
    case ReduceOp::kProd:
      visitor(ProdOp{});
      return true;
    case ReduceOp::kMin:
      visitor(MinOp{});
      return true;
    case ReduceOp::kMax:
      visitor(MaxOp{});
      return true;
    case ReduceOp::kUnspecified:
      break;
  }
  return false;
}

}  // namespace reduce
}  // namespace chorus

#endif  // CHORUS_SERVER_REDUCE_DISPATCH_H_
