// The per-element reduce operators, written once and shared by the CPU path
// and the CUDA kernels (see host_device.h). Each combine functor maps two
// elements of one storage type T to one: SumOp, ProdOp, MinOp, MaxOp. avg
// combines with SumOp and ends with AvgFinalize, which divides by the number
// of ranks.
//
// Semantics, per storage type:
// - Integers (int8_t .. uint64_t): sum and prod wrap modulo 2^bits, for signed
//   types too (computed in unsigned arithmetic, no undefined behaviour);
//   min and max are exact. AvgFinalize divides a sum by the number of ranks,
//   truncating toward zero (collectives sum an integer avg in 64 bits first,
//   see AccumulatorDType).
// - float and double: IEEE-754 arithmetic, round to nearest even. min and max
//   propagate NaN: if either operand is NaN the result is NaN (the first
//   operand's NaN when both are). Between -0 and +0, min gives -0 and max
//   gives +0, whatever the order of the operands.
// - Float16 and BFloat16: widen both operands to float, apply the float
//   operator, round the result back (half.h); avg divides in float. These
//   pairwise forms round after every step; collectives combine sum, prod
//   and avg of these types in f32 instead (AccumulatorDType in dtype.h) and
//   use them only for min and max, which are exact.
//
// All functors are stateless values (AvgFinalize holds the rank count) and
// thread-safe.
#ifndef CHORUS_SERVER_REDUCE_ELEMENT_OPS_H_
#define CHORUS_SERVER_REDUCE_ELEMENT_OPS_H_

#include <cstdint>
#include <type_traits>

#include "common/half.h"
#include "common/host_device.h"

namespace chorus {
namespace reduce {

// The unsigned type integer sums and products are computed in: at least
// `unsigned int`, so that narrow types do not promote to signed int.
template <typename T>
using WrapType = std::conditional_t<(sizeof(T) < sizeof(unsigned int)),
                                    unsigned int, std::make_unsigned_t<T>>;

// The type an integer average divides in: wide enough to hold the rank count
// and the value, with T's signedness.
template <typename T>
using DivideType = std::conditional_t<
    (sizeof(T) < sizeof(int)),
    std::conditional_t<std::is_signed<T>::value, int, unsigned int>, T>;

template <typename T>
using EnableIfInteger = std::enable_if_t<std::is_integral<T>::value, int>;

template <typename T>
using EnableIfFloating =
    std::enable_if_t<std::is_floating_point<T>::value, int>;

template <typename T>
using EnableIfHalf = std::enable_if_t<
    std::is_same<T, Float16>::value || std::is_same<T, BFloat16>::value, int>;

// Bitwise OR and AND of two floats' patterns. For a == b they differ from a
// only for zeros of opposite sign: OR gives -0, AND gives +0.
CHORUS_HOST_DEVICE inline float OrBits(float a, float b) {
  return FloatFromBits(FloatBits(a) | FloatBits(b));
}
CHORUS_HOST_DEVICE inline float AndBits(float a, float b) {
  return FloatFromBits(FloatBits(a) & FloatBits(b));
}
CHORUS_HOST_DEVICE inline double OrBits(double a, double b) {
  return DoubleFromBits(DoubleBits(a) | DoubleBits(b));
}
CHORUS_HOST_DEVICE inline double AndBits(double a, double b) {
  return DoubleFromBits(DoubleBits(a) & DoubleBits(b));
}

// ---- Integers --------------------------------------------------------------

template <typename T, EnableIfInteger<T> = 0>
CHORUS_HOST_DEVICE inline T Add(T a, T b) {
  using U = WrapType<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
}

template <typename T, EnableIfInteger<T> = 0>
CHORUS_HOST_DEVICE inline T Mul(T a, T b) {
  using U = WrapType<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
}

template <typename T, EnableIfInteger<T> = 0>
CHORUS_HOST_DEVICE inline T Min(T a, T b) {
  return b < a ? b : a;
}

template <typename T, EnableIfInteger<T> = 0>
CHORUS_HOST_DEVICE inline T Max(T a, T b) {
  return a < b ? b : a;
}

// Requires ranks >= 1. Truncates toward zero.
template <typename T, EnableIfInteger<T> = 0>
CHORUS_HOST_DEVICE inline T DivideByRanks(T value, int ranks) {
  using D = DivideType<T>;
  return static_cast<T>(static_cast<D>(value) / static_cast<D>(ranks));
}

// ---- float and double ------------------------------------------------------

template <typename T, EnableIfFloating<T> = 0>
CHORUS_HOST_DEVICE inline T Add(T a, T b) {
  return a + b;
}

template <typename T, EnableIfFloating<T> = 0>
CHORUS_HOST_DEVICE inline T Mul(T a, T b) {
  return a * b;
}

// Written as selects on bit patterns, not branches or sign-bit tests, so
// that loops over them vectorise (also for double on plain SSE2).
template <typename T, EnableIfFloating<T> = 0>
CHORUS_HOST_DEVICE inline T Min(T a, T b) {
  T result = a < b ? a : b;
  result = (a == b) ? OrBits(a, b) : result;  // -0 wins over +0.
  result = (b != b) ? b : result;             // NaN propagates...
  return (a != a) ? a : result;               // ...a's first.
}

template <typename T, EnableIfFloating<T> = 0>
CHORUS_HOST_DEVICE inline T Max(T a, T b) {
  T result = a < b ? b : a;
  result = (a == b) ? AndBits(a, b) : result;  // +0 wins over -0.
  result = (b != b) ? b : result;
  return (a != a) ? a : result;
}

template <typename T, EnableIfFloating<T> = 0>
CHORUS_HOST_DEVICE inline T DivideByRanks(T value, int ranks) {
  return value / static_cast<T>(ranks);
}

// ---- Float16 and BFloat16: widen to float, operate, round back ------------

CHORUS_HOST_DEVICE inline Float16 FromFloat(float value, Float16) {
  return ToFloat16(value);
}
CHORUS_HOST_DEVICE inline BFloat16 FromFloat(float value, BFloat16) {
  return ToBFloat16(value);
}

template <typename H, EnableIfHalf<H> = 0>
CHORUS_HOST_DEVICE inline H Add(H a, H b) {
  return FromFloat(Add(ToFloat(a), ToFloat(b)), H{});
}

template <typename H, EnableIfHalf<H> = 0>
CHORUS_HOST_DEVICE inline H Mul(H a, H b) {
  return FromFloat(Mul(ToFloat(a), ToFloat(b)), H{});
}

template <typename H, EnableIfHalf<H> = 0>
CHORUS_HOST_DEVICE inline H Min(H a, H b) {
  return FromFloat(Min(ToFloat(a), ToFloat(b)), H{});
}

template <typename H, EnableIfHalf<H> = 0>
CHORUS_HOST_DEVICE inline H Max(H a, H b) {
  return FromFloat(Max(ToFloat(a), ToFloat(b)), H{});
}

template <typename H, EnableIfHalf<H> = 0>
CHORUS_HOST_DEVICE inline H DivideByRanks(H value, int ranks) {
  return FromFloat(DivideByRanks(ToFloat(value), ranks), H{});
}

// ---- Functors the engines instantiate their loops with ---------------------

struct SumOp {
  template <typename T>
  CHORUS_HOST_DEVICE T operator()(T a, T b) const {
    return Add(a, b);
  }
};

struct ProdOp {
  template <typename T>
  CHORUS_HOST_DEVICE T operator()(T a, T b) const {
    return Mul(a, b);
  }
};

struct MinOp {
  template <typename T>
  CHORUS_HOST_DEVICE T operator()(T a, T b) const {
    return Min(a, b);
  }
};

struct MaxOp {
  template <typename T>
  CHORUS_HOST_DEVICE T operator()(T a, T b) const {
    return Max(a, b);
  }
};

// The last step of avg: divides a sum over `ranks` ranks by `ranks` (>= 1).
struct AvgFinalize {
  int ranks;
  template <typename T>
  CHORUS_HOST_DEVICE T operator()(T value) const {
    return DivideByRanks(value, ranks);
  }
};

}  // namespace reduce
}  // namespace chorus

#endif  // CHORUS_SERVER_REDUCE_ELEMENT_OPS_H_
