// Tests for Float16 / BFloat16 conversions (common/half.h) against an
// independent reference (reference.h) and hand-picked rounding cases.
#include "common/half.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "gtest/gtest.h"
#include "tests/unit/reduce/reference.h"

namespace chorus {
namespace {

using reduce_test::kBF16Format;
using reduce_test::kF16Format;
using reduce_test::RoundToHalf;

float Bits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

uint32_t BitsOf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

uint16_t F16(float value) { return ToFloat16(value).bits; }
uint16_t BF16(float value) { return ToBFloat16(value).bits; }

// Low-bit patterns around the rounding point of a format that drops `drop`
// bits: exact, just above, just below half, half, just above half, all ones.
std::vector<uint32_t> RoundingPatterns(int drop) {
  const uint32_t half = 1u << (drop - 1);
  return {
      0, 1, half - 1, half, half + 1, (1u << drop) - 1, half + 3 * half / 4};
}

bool IsF16NaN(uint16_t bits) { return (bits & 0x7fffu) > 0x7c00u; }
bool IsBF16NaN(uint16_t bits) { return (bits & 0x7fffu) > 0x7f80u; }

TEST(Float16Test, ToFloat_EveryPattern_MatchesReferenceDecode) {
  for (uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const float got = ToFloat(Float16{static_cast<uint16_t>(bits)});
    const float want = reduce_test::DecodeHalf(kF16Format, bits);
    if (IsF16NaN(bits)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << bits;
      ASSERT_EQ(std::signbit(got), (bits & 0x8000u) != 0) << std::hex << bits;
    } else {
      ASSERT_EQ(BitsOf(got), BitsOf(want)) << std::hex << bits;
    }
  }
}

TEST(Float16Test, ToFloat16_EveryPatternWidened_RoundTripsExactly) {
  for (uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const uint16_t back = F16(ToFloat(Float16{static_cast<uint16_t>(bits)}));
    if (IsF16NaN(bits)) {
      // NaN stays NaN with its sign and payload, made quiet.
      ASSERT_EQ(back, bits | 0x0200u) << std::hex << bits;
    } else {
      ASSERT_EQ(back, bits) << std::hex << bits;
    }
  }
}

TEST(Float16Test, ToFloat16_FloatsAroundEveryRoundingPoint_MatchReference) {
  // Every float exponent and top-10 mantissa, with the dropped 13 bits set
  // to the patterns that decide rounding.
  for (uint32_t high = 0; high < (1u << 19); ++high) {
    for (uint32_t low : RoundingPatterns(13)) {
      const float value = Bits((high << 13) | low);
      const uint16_t got = F16(value);
      const uint16_t want = RoundToHalf(kF16Format, value);
      if (std::isnan(value)) {
        ASSERT_TRUE(IsF16NaN(got)) << value;
      } else {
        ASSERT_EQ(got, want) << std::hexfloat << value;
      }
    }
  }
}

#if defined(__FLT16_MAX__)
TEST(Float16Test, ToFloat16_FloatsAroundRoundingPoints_MatchCompilerFloat16) {
  for (uint32_t high = 0; high < (1u << 19); high += 7) {
    for (uint32_t low : RoundingPatterns(13)) {
      const float value = Bits((high << 13) | low);
      if (std::isnan(value)) continue;
      const _Float16 compiler = static_cast<_Float16>(value);
      uint16_t want;
      std::memcpy(&want, &compiler, sizeof(want));
      ASSERT_EQ(F16(value), want) << std::hexfloat << value;
    }
  }
}
#endif

TEST(Float16Test, ToFloat16_Ties_RoundToEven) {
  EXPECT_EQ(F16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // 1 + ulp/2
  EXPECT_EQ(F16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // 1 + 3ulp/2
  EXPECT_EQ(F16(2049.0f), 0x6800);                           // -> 2048
  EXPECT_EQ(F16(2051.0f), 0x6802);                           // -> 2052
  EXPECT_EQ(F16(-2049.0f), 0xe800);
  EXPECT_EQ(F16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);
}

TEST(Float16Test, ToFloat16_BeyondLargestFinite_BecomesInfinity) {
  EXPECT_EQ(F16(65504.0f), 0x7bff);
  EXPECT_EQ(F16(65519.996f), 0x7bff);  // Just below the tie.
  EXPECT_EQ(F16(65520.0f), 0x7c00);    // The tie goes to infinity (even).
  EXPECT_EQ(F16(1e10f), 0x7c00);
  EXPECT_EQ(F16(-1e10f), 0xfc00);
  EXPECT_EQ(F16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(F16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(F16(std::numeric_limits<float>::max()), 0x7c00);
}

TEST(Float16Test, ToFloat16_TinyValues_BecomeSubnormalsOrZero) {
  const float unit = std::ldexp(1.0f, -24);  // Smallest f16 subnormal.
  EXPECT_EQ(F16(unit), 0x0001);
  EXPECT_EQ(F16(-unit), 0x8001);
  EXPECT_EQ(F16(unit / 2), 0x0000);  // Tie between 0 and 1 unit: even, 0.
  EXPECT_EQ(F16(-unit / 2), 0x8000);
  EXPECT_EQ(F16(std::nextafter(unit / 2, 1.0f)), 0x0001);
  EXPECT_EQ(F16(3 * unit / 2), 0x0002);    // Tie between 1 and 2: even, 2.
  EXPECT_EQ(F16(5 * unit / 2), 0x0002);    // Tie between 2 and 3: even, 2.
  EXPECT_EQ(F16(1023 * unit), 0x03ff);     // Largest subnormal.
  EXPECT_EQ(F16(1023.5f * unit), 0x0400);  // Rounds up into the normals.
  EXPECT_EQ(F16(std::ldexp(1.0f, -14)), 0x0400);
  EXPECT_EQ(F16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(F16(-0.0f), 0x8000);
  EXPECT_EQ(ToFloat(Float16{0x0001}), unit);
  EXPECT_EQ(ToFloat(Float16{0x03ff}), 1023 * unit);
}

TEST(Float16Test, ToFloat16_NaN_StaysQuietNaNWithSign) {
  EXPECT_EQ(F16(std::numeric_limits<float>::quiet_NaN()), 0x7e00);
  EXPECT_EQ(F16(-std::numeric_limits<float>::quiet_NaN()), 0xfe00);
  // A NaN whose payload sits only in bits f16 drops must not become inf.
  EXPECT_TRUE(IsF16NaN(F16(Bits(0x7f800001u))));
  EXPECT_TRUE(IsF16NaN(F16(Bits(0xff800001u))));
  EXPECT_EQ(F16(Bits(0x7fa00000u)), 0x7f00);  // Payload kept, quiet bit set.
  EXPECT_TRUE(std::isnan(ToFloat(Float16{0x7c01})));
  EXPECT_TRUE(std::isnan(ToFloat(Float16{0xfe00})));
}

TEST(BFloat16Test, ToFloat_EveryPattern_MatchesReferenceDecode) {
  for (uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const float got = ToFloat(BFloat16{static_cast<uint16_t>(bits)});
    const float want = reduce_test::DecodeHalf(kBF16Format, bits);
    if (IsBF16NaN(bits)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << bits;
    } else {
      ASSERT_EQ(BitsOf(got), BitsOf(want)) << std::hex << bits;
    }
  }
}

TEST(BFloat16Test, ToBFloat16_EveryPatternWidened_RoundTripsExactly) {
  for (uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const uint16_t back = BF16(ToFloat(BFloat16{static_cast<uint16_t>(bits)}));
    if (IsBF16NaN(bits)) {
      ASSERT_EQ(back, bits | 0x0040u) << std::hex << bits;
    } else {
      ASSERT_EQ(back, bits) << std::hex << bits;
    }
  }
}

TEST(BFloat16Test, ToBFloat16_FloatsAroundEveryRoundingPoint_MatchReference) {
  for (uint32_t high = 0; high < (1u << 16); ++high) {
    for (uint32_t low : RoundingPatterns(16)) {
      const float value = Bits((high << 16) | low);
      const uint16_t got = BF16(value);
      if (std::isnan(value)) {
        ASSERT_TRUE(IsBF16NaN(got)) << std::hex << BitsOf(value);
      } else {
        ASSERT_EQ(got, RoundToHalf(kBF16Format, value))
            << std::hexfloat << value;
      }
    }
  }
}

TEST(BFloat16Test, ToBFloat16_Ties_RoundToEven) {
  EXPECT_EQ(BF16(Bits(0x3f808000u)), 0x3f80);  // Tie, 0x3f80 even: down.
  EXPECT_EQ(BF16(Bits(0x3f818000u)), 0x3f82);  // Tie, 0x3f81 odd: up.
  EXPECT_EQ(BF16(Bits(0x3f808001u)), 0x3f81);  // Just above the tie.
  EXPECT_EQ(BF16(Bits(0xbf818000u)), 0xbf82);
}

TEST(BFloat16Test, ToBFloat16_BeyondLargestFinite_BecomesInfinity) {
  EXPECT_EQ(BF16(Bits(0x7f7f7fffu)), 0x7f7f);  // Below the tie.
  EXPECT_EQ(BF16(Bits(0x7f7f8000u)), 0x7f80);  // Tie: odd 0x7f7f goes up.
  EXPECT_EQ(BF16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(BF16(-std::numeric_limits<float>::max()), 0xff80);
  EXPECT_EQ(BF16(std::numeric_limits<float>::infinity()), 0x7f80);
}

TEST(BFloat16Test, ToBFloat16_Subnormals_RoundToNearestEven) {
  EXPECT_EQ(BF16(Bits(0x00008000u)), 0x0000);  // Tie: even, 0.
  EXPECT_EQ(BF16(Bits(0x00018000u)), 0x0002);  // Tie: odd 1 goes up.
  EXPECT_EQ(BF16(Bits(0x00008001u)), 0x0001);
  EXPECT_EQ(BF16(Bits(0x007fffffu)), 0x0080);  // Up into the normals.
  EXPECT_EQ(BF16(Bits(0x80000001u)), 0x8000);
}

TEST(BFloat16Test, ToBFloat16_NaN_StaysQuietNaNWithSign) {
  EXPECT_EQ(BF16(std::numeric_limits<float>::quiet_NaN()), 0x7fc0);
  EXPECT_EQ(BF16(-std::numeric_limits<float>::quiet_NaN()), 0xffc0);
  EXPECT_EQ(BF16(Bits(0x7f800001u)), 0x7fc0);  // Low payload: still NaN.
  EXPECT_EQ(BF16(Bits(0x7fffffffu)), 0x7fff);  // Must not carry into sign.
  EXPECT_EQ(BF16(Bits(0xffffffffu)), 0xffff);
}

}  // namespace
}  // namespace chorus
