// Float16 (IEEE-754 binary16) and BFloat16 (bfloat16): 16-bit storage types
// for the f16 and bf16 dtypes. They hold a bit pattern and do no arithmetic;
// the reduce engines widen them to float, operate, and round back. The
// conversions are integer bit manipulation (plus one exact float product for
// f16 subnormals), never the compiler's or CUDA's own conversions, so the CPU
// path and the CUDA kernels produce the same bits for the same input.
//
// Conversions from float round to nearest, ties to even; values beyond the
// largest finite number become infinity of the same sign; results below the
// smallest normal become subnormals (f16) or stay subnormal (bf16); NaN stays
// NaN with its sign and the top of its payload, made quiet. Widening to float
// is exact. Plain values; all functions are pure and thread-safe.
#ifndef CHORUS_COMMON_HALF_H_
#define CHORUS_COMMON_HALF_H_

#include <cstdint>

#include "common/host_device.h"

namespace chorus {

// IEEE-754 binary16: 1 sign bit, 5 exponent bits, 10 mantissa bits.
struct Float16 {
  uint16_t bits;
};

// bfloat16: the top 16 bits of a float (1 sign, 8 exponent, 7 mantissa).
struct BFloat16 {
  uint16_t bits;
};

static_assert(sizeof(Float16) == 2, "Float16 must be 16 bits");
static_assert(sizeof(BFloat16) == 2, "BFloat16 must be 16 bits");

// Returns the float equal to `value` (exact; NaN keeps sign and payload).
CHORUS_HOST_DEVICE inline float ToFloat(Float16 value) {
  const uint32_t sign = static_cast<uint32_t>(value.bits & 0x8000u) << 16;
  const uint32_t exponent = (value.bits >> 10) & 0x1fu;
  const uint32_t mantissa = value.bits & 0x3ffu;
  if (exponent == 0x1f) {  // Infinity or NaN.
    return reduce::FloatFromBits(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent != 0) {  // Normal: rebias 15 -> 127.
    return reduce::FloatFromBits(sign | ((exponent + 112u) << 23) |
                                 (mantissa << 13));
  }
  if (mantissa == 0) return reduce::FloatFromBits(sign);  // Signed zero.
  // Subnormal: mantissa * 2^-24, a normal float; the product is exact.
  return reduce::FloatFromBits(
      sign | reduce::FloatBits(static_cast<float>(mantissa) * 0x1p-24f));
}

// Returns `value` rounded to the nearest Float16, ties to even.
CHORUS_HOST_DEVICE inline Float16 ToFloat16(float value) {
  const uint32_t bits = reduce::FloatBits(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7fffffffu;
  uint32_t result;
  if (magnitude > 0x7f800000u) {  // NaN: keep the payload's top, set quiet.
    result = 0x7e00u | ((magnitude >> 13) & 0x3ffu);
  } else if (magnitude >= 0x477ff000u) {
    // At or above 65520, halfway between 65504 (the largest f16) and 65536:
    // the tie goes to the even neighbour, which is infinity.
    result = 0x7c00u;
  } else if (magnitude >= 0x38800000u) {  // Normal f16 (>= 2^-14).
    result = (magnitude - (112u << 23)) >> 13;
    const uint32_t rest = magnitude & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (result & 1u))) ++result;
  } else {
    // Subnormal f16 or zero: the result counts units of 2^-24.
    const uint32_t exponent = magnitude >> 23;
    // Values below 2^-25 (exponent < 102) round to zero; 2^-25 itself is a
    // tie that goes to the even neighbour, zero, too.
    if (exponent < 102) {
      result = 0;
    } else {
      const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
      const uint32_t shift = 126u - exponent;  // 14 .. 24.
      result = mantissa >> shift;
      const uint32_t rest = mantissa & ((1u << shift) - 1u);
      const uint32_t half = 1u << (shift - 1u);
      if (rest > half || (rest == half && (result & 1u))) ++result;
    }
  }
  return Float16{static_cast<uint16_t>(sign | result)};
}

// Returns the float equal to `value` (exact).
CHORUS_HOST_DEVICE inline float ToFloat(BFloat16 value) {
  return reduce::FloatFromBits(static_cast<uint32_t>(value.bits) << 16);
}

// Returns `value` rounded to the nearest BFloat16, ties to even.
CHORUS_HOST_DEVICE inline BFloat16 ToBFloat16(float value) {
  const uint32_t bits = reduce::FloatBits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN: truncate, set quiet.
    return BFloat16{static_cast<uint16_t>((bits >> 16) | 0x0040u)};
  }
  // Adding 0x7fff plus the lowest kept bit rounds half to even; a carry out
  // of the mantissa bumps the exponent, up to infinity.
  const uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
  return BFloat16{static_cast<uint16_t>(rounded >> 16)};
}

}  // namespace chorus

#endif  // CHORUS_COMMON_HALF_H_
