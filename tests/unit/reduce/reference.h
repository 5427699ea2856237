// Reference semantics for the reduce engine tests, written independently of
// the engines: float rounding by searching the format's values in double
// precision, operators spelled out with <cmath>. Slow and simple on purpose.
//
// Header-only test helper; pure functions.
#ifndef CHORUS_TESTS_UNIT_REDUCE_REFERENCE_H_
#define CHORUS_TESTS_UNIT_REDUCE_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "common/dtype.h"
#include "common/half.h"

namespace chorus {
namespace reduce_test {

// A 16-bit float format: exponent bias and mantissa width.
struct HalfFormat {
  int bias;
  int mantissa_bits;
  uint16_t infinity_bits;
};
inline constexpr HalfFormat kF16Format{15, 10, 0x7c00};
inline constexpr HalfFormat kBF16Format{127, 7, 0x7f80};

// Returns the value of the non-negative pattern `bits` (<= infinity_bits);
// infinity counts as 2^(bias+1), the point IEEE rounding measures it from.
inline double DecodeMagnitude(HalfFormat format, uint32_t bits) {
  if (bits >= format.infinity_bits) return std::ldexp(1.0, format.bias + 1);
  const uint32_t exponent = bits >> format.mantissa_bits;
  const uint32_t mantissa = bits & ((1u << format.mantissa_bits) - 1u);
  if (exponent == 0) {
    return std::ldexp(static_cast<double>(mantissa),
                      1 - format.bias - format.mantissa_bits);
  }
  return std::ldexp(
      static_cast<double>((1u << format.mantissa_bits) + mantissa),
      static_cast<int>(exponent) - format.bias - format.mantissa_bits);
}

// Returns the float value of a 16-bit pattern.
inline float DecodeHalf(HalfFormat format, uint16_t bits) {
  const bool negative = (bits & 0x8000u) != 0;
  const uint32_t magnitude = bits & 0x7fffu;
  float value;
  if (magnitude > format.infinity_bits) {
    value = std::numeric_limits<float>::quiet_NaN();
  } else if (magnitude == format.infinity_bits) {
    value = std::numeric_limits<float>::infinity();
  } else {
    value = static_cast<float>(DecodeMagnitude(format, magnitude));
  }
  return negative ? -value : value;
}

// Returns `value` rounded to the nearest pattern, ties to the even pattern,
// by binary search over the (monotonic) positive patterns. NaN gives a
// quiet NaN pattern with value's sign; the caller compares NaN-ness only.
inline uint16_t RoundToHalf(HalfFormat format, float value) {
  const uint16_t sign = std::signbit(value) ? 0x8000u : 0u;
  if (std::isnan(value)) {
    return static_cast<uint16_t>(sign | format.infinity_bits |
                                 (1u << (format.mantissa_bits - 1)));
  }
  const double magnitude = std::fabs(static_cast<double>(value));
  // Largest pattern whose value is <= magnitude, in [0, infinity_bits].
  uint32_t lo = 0;
  uint32_t hi = format.infinity_bits;
  if (magnitude >= DecodeMagnitude(format, hi)) return sign | hi;
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    if (DecodeMagnitude(format, mid) <= magnitude) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const double below = magnitude - DecodeMagnitude(format, lo);
  const double above = DecodeMagnitude(format, hi) - magnitude;
  uint32_t result = lo;
  if (above < below || (above == below && (lo & 1u))) result = hi;
  return static_cast<uint16_t>(sign | result);
}

// ---- Per-type reference operators -----------------------------------------

template <typename T>
struct Reference;

template <typename F>
struct FloatReference {
  static bool IsNaN(F v) { return std::isnan(v); }
  static F Combine(ReduceOp op, F a, F b) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        return a + b;
      case ReduceOp::kProd:
        return a * b;
      case ReduceOp::kMin:
        if (std::isnan(a)) return a;
        if (std::isnan(b)) return b;
        if (a == 0 && b == 0) return std::signbit(a) ? a : b;
        return std::min(a, b);
      case ReduceOp::kMax:
        if (std::isnan(a)) return a;
        if (std::isnan(b)) return b;
        if (a == 0 && b == 0) return std::signbit(a) ? b : a;
        return std::max(a, b);
      default:
        return std::numeric_limits<F>::quiet_NaN();
    }
  }
  static F Finalize(F v, int ranks) { return v / static_cast<F>(ranks); }
};

template <>
struct Reference<float> : FloatReference<float> {};
template <>
struct Reference<double> : FloatReference<double> {};

template <typename H, const HalfFormat& kFormat>
struct HalfReference {
  static float Widen(H v) { return DecodeHalf(kFormat, v.bits); }
  static H Narrow(float v) { return H{RoundToHalf(kFormat, v)}; }
  static bool IsNaN(H v) { return (v.bits & 0x7fffu) > kFormat.infinity_bits; }
  static H Combine(ReduceOp op, H a, H b) {
    return Narrow(FloatReference<float>::Combine(op, Widen(a), Widen(b)));
  }
  static H Finalize(H v, int ranks) {
    return Narrow(Widen(v) / static_cast<float>(ranks));
  }
};

template <>
struct Reference<Float16> : HalfReference<Float16, kF16Format> {};
template <>
struct Reference<BFloat16> : HalfReference<BFloat16, kBF16Format> {};

template <typename I>
struct IntegerReference {
  static bool IsNaN(I) { return false; }
  static I Combine(ReduceOp op, I a, I b) {
    // uint64_t arithmetic wraps; truncating to I keeps it modulo 2^bits.
    const uint64_t ua = static_cast<uint64_t>(a);
    const uint64_t ub = static_cast<uint64_t>(b);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        return static_cast<I>(ua + ub);
      case ReduceOp::kProd:
        return static_cast<I>(ua * ub);
      case ReduceOp::kMin:
        return std::min(a, b);
      case ReduceOp::kMax:
        return std::max(a, b);
      default:
        return 0;
    }
  }
  static I Finalize(I v, int ranks) {
    if (std::is_signed<I>::value) {
      return static_cast<I>(static_cast<int64_t>(v) / ranks);
    }
    return static_cast<I>(static_cast<uint64_t>(v) /
                          static_cast<uint64_t>(ranks));
  }
};

template <>
struct Reference<int8_t> : IntegerReference<int8_t> {};
template <>
struct Reference<uint8_t> : IntegerReference<uint8_t> {};
template <>
struct Reference<int32_t> : IntegerReference<int32_t> {};
template <>
struct Reference<int64_t> : IntegerReference<int64_t> {};
template <>
struct Reference<uint32_t> : IntegerReference<uint32_t> {};
template <>
struct Reference<uint64_t> : IntegerReference<uint64_t> {};

// True when x and y have the same bits, or are both NaN.
template <typename T>
bool SameResult(T x, T y) {
  if (Reference<T>::IsNaN(x) && Reference<T>::IsNaN(y)) return true;
  return std::memcmp(&x, &y, sizeof(T)) == 0;
}

// The DType whose storage type is T.
template <typename T>
constexpr DType DTypeOf();
template <>
constexpr DType DTypeOf<Float16>() {
  return DType::kF16;
}
template <>
constexpr DType DTypeOf<BFloat16>() {
  return DType::kBF16;
}
template <>
constexpr DType DTypeOf<float>() {
  return DType::kF32;
}
template <>
constexpr DType DTypeOf<double>() {
  return DType::kF64;
}
template <>
constexpr DType DTypeOf<int8_t>() {
  return DType::kI8;
}
template <>
constexpr DType DTypeOf<uint8_t>() {
  return DType::kU8;
}
template <>
constexpr DType DTypeOf<int32_t>() {
  return DType::kI32;
}
template <>
constexpr DType DTypeOf<int64_t>() {
  return DType::kI64;
}
template <>
constexpr DType DTypeOf<uint32_t>() {
  return DType::kU32;
}
template <>
constexpr DType DTypeOf<uint64_t>() {
  return DType::kU64;
}

}  // namespace reduce_test
}  // namespace chorus

#endif  // CHORUS_TESTS_UNIT_REDUCE_REFERENCE_H_
