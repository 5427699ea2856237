// Input generators for the reduce engine tests (CPU and GPU): random values
// of every storage type that reach the edges — full-range integers (so sums
// and products wrap), every 16-bit float pattern (NaN, infinities,
// subnormals), and floats salted with NaN, infinities, signed zeros and
// subnormals.
//
// Header-only test helper; each call owns its generator, so it is
// deterministic for a seed and thread-compatible.
#ifndef CHORUS_TESTS_UNIT_REDUCE_TEST_VALUES_H_
#define CHORUS_TESTS_UNIT_REDUCE_TEST_VALUES_H_

#include <cstdint>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "common/half.h"

namespace chorus {
namespace reduce_test {

template <typename F>
std::vector<F> SpecialFloats() {
  using L = std::numeric_limits<F>;
  return {L::quiet_NaN(), -L::quiet_NaN(), L::infinity(),   -L::infinity(),
          F(0),           -F(0),           L::denorm_min(), -L::denorm_min(),
          L::min(),       L::max(),        L::lowest(),     F(1),
          F(-1)};
}

// Returns `count` values of T from `seed`. With `specials`, floats include
// NaN, infinities, signed zeros and subnormals about one time in eight.
template <typename T>
std::vector<T> RandomValues(size_t count, uint32_t seed, bool specials = true) {
  std::mt19937_64 rng(seed);
  std::vector<T> values(count);
  if constexpr (std::is_same<T, Float16>::value ||
                std::is_same<T, BFloat16>::value) {
    for (T& v : values) {
      v.bits = static_cast<uint16_t>(rng());
      // Without specials, keep to finite values of modest size.
      if (!specials)
        v.bits = static_cast<uint16_t>((v.bits & 0x80ffu) | 0x3c00u);
    }
  } else if constexpr (std::is_floating_point<T>::value) {
    const std::vector<T> special = SpecialFloats<T>();
    std::uniform_real_distribution<T> mantissa(-2, 2);
    std::uniform_int_distribution<int> exponent(-20, 20);
    for (T& v : values) {
      const uint64_t r = rng();
      if (specials && r % 8 == 0) {
        v = special[(r >> 8) % special.size()];
      } else {
        v = std::ldexp(mantissa(rng), exponent(rng));
      }
    }
  } else {
    for (T& v : values) v = static_cast<T>(rng());
  }
  return values;
}

}  // namespace reduce_test
}  // namespace chorus

#endif  // CHORUS_TESTS_UNIT_REDUCE_TEST_VALUES_H_
