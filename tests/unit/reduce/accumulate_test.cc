// Tests for reductions in an accumulator type: AccumulatorDType
// (common/dtype.h) and cpu_reduce's Convert, AccumulateInto and
// ReduceSources, which every plan uses so that f16/bf16 combine in f32 and
// integer averages sum in 64 bits before rounding once.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/dtype.h"
#include "common/half.h"
#include "gtest/gtest.h"
#include "server/reduce/cpu/cpu_reduce.h"

namespace chorus {
namespace {

TEST(AccumulatorDTypeTest, AccumulatorDType_HalfTypes_F32ExceptMinMax) {
  for (DType half : {DType::kF16, DType::kBF16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kAvg}) {
      EXPECT_EQ(AccumulatorDType(half, op), DType::kF32);
    }
    EXPECT_EQ(AccumulatorDType(half, ReduceOp::kMin), half);
    EXPECT_EQ(AccumulatorDType(half, ReduceOp::kMax), half);
  }
}

TEST(AccumulatorDTypeTest, AccumulatorDType_IntegerAvg_SixtyFourBits) {
  EXPECT_EQ(AccumulatorDType(DType::kI8, ReduceOp::kAvg), DType::kI64);
  EXPECT_EQ(AccumulatorDType(DType::kI32, ReduceOp::kAvg), DType::kI64);
  EXPECT_EQ(AccumulatorDType(DType::kI64, ReduceOp::kAvg), DType::kI64);
  EXPECT_EQ(AccumulatorDType(DType::kU8, ReduceOp::kAvg), DType::kU64);
  EXPECT_EQ(AccumulatorDType(DType::kU32, ReduceOp::kAvg), DType::kU64);
  EXPECT_EQ(AccumulatorDType(DType::kU64, ReduceOp::kAvg), DType::kU64);
  // Wrapping sums and products are the same in any width.
  EXPECT_EQ(AccumulatorDType(DType::kI8, ReduceOp::kSum), DType::kI8);
  EXPECT_EQ(AccumulatorDType(DType::kU32, ReduceOp::kProd), DType::kU32);
  EXPECT_EQ(AccumulatorDType(DType::kF32, ReduceOp::kAvg), DType::kF32);
  EXPECT_EQ(AccumulatorDType(DType::kF64, ReduceOp::kSum), DType::kF64);
}

TEST(AccumulatorDTypeTest, AccumulatorDType_Invalid_Unspecified) {
  EXPECT_EQ(AccumulatorDType(DType::kUnspecified, ReduceOp::kSum),
            DType::kUnspecified);
  EXPECT_EQ(AccumulatorDType(DType::kF16, ReduceOp::kUnspecified),
            DType::kUnspecified);
  EXPECT_EQ(AccumulatorDType(static_cast<DType>(99), ReduceOp::kSum),
            DType::kUnspecified);
}

TEST(ConvertTest, Convert_F16ToF32AndBack_RoundTripsEveryValue) {
  std::vector<uint16_t> all(1 << 16);
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  for (DType half : {DType::kF16, DType::kBF16}) {
    std::vector<float> wide(all.size());
    ASSERT_TRUE(cpu_reduce::Convert(half, DType::kF32, wide.data(), all.data(),
                                    all.size())
                    .ok());
    std::vector<uint16_t> back(all.size());
    ASSERT_TRUE(cpu_reduce::Convert(DType::kF32, half, back.data(), wide.data(),
                                    all.size())
                    .ok());
    for (uint32_t i = 0; i < all.size(); ++i) {
      const bool nan = half == DType::kF16
                           ? (i & 0x7c00) == 0x7c00 && (i & 0x3ff) != 0
                           : (i & 0x7f80) == 0x7f80 && (i & 0x7f) != 0;
      if (nan) {
        EXPECT_TRUE(wide[i] != wide[i]) << DTypeName(half) << " " << i;
      } else {
        ASSERT_EQ(back[i], all[i]) << DTypeName(half) << " " << i;
      }
    }
  }
}

TEST(ConvertTest, Convert_F32ToHalf_RoundsToNearestEven) {
  // 1 + 2^-11 lies halfway between f16 1 and 1 + 2^-10: ties to even (1);
  // a little more rounds up.
  const float values[] = {1.0f + 1.0f / 2048, 1.0f + 1.0f / 2048 + 1.0f / 8192};
  uint16_t out[2];
  ASSERT_TRUE(
      cpu_reduce::Convert(DType::kF32, DType::kF16, out, values, 2).ok());
  EXPECT_EQ(out[0], 0x3C00);
  EXPECT_EQ(out[1], 0x3C01);
}

TEST(ConvertTest, Convert_IntegersToSixtyFourBits_ExtendsAndTruncates) {
  const int8_t narrow[] = {-128, -1, 0, 127};
  int64_t wide[4];
  ASSERT_TRUE(
      cpu_reduce::Convert(DType::kI8, DType::kI64, wide, narrow, 4).ok());
  EXPECT_EQ(wide[0], -128);
  EXPECT_EQ(wide[1], -1);
  EXPECT_EQ(wide[3], 127);
  const uint64_t big[] = {0xffffffffull, 0x1ffffffffull};
  uint32_t low[2];
  ASSERT_TRUE(cpu_reduce::Convert(DType::kU64, DType::kU32, low, big, 2).ok());
  EXPECT_EQ(low[0], 0xffffffffu);
  EXPECT_EQ(low[1], 0xffffffffu);
}

TEST(ConvertTest, Convert_UnrelatedTypes_InvalidArgument) {
  float f = 0;
  int32_t i = 0;
  absl::Status s = cpu_reduce::Convert(DType::kF32, DType::kI32, &i, &f, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(s.message(), "Cpu: no conversion from f32"))
      << s;
  s = cpu_reduce::Convert(DType::kI8, DType::kU64, &i, &f, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  // A null pointer with elements to convert.
  s = cpu_reduce::Convert(DType::kF16, DType::kF32, nullptr, &i, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

TEST(ConvertTest, Convert_SameType_Copies) {
  const double in[] = {1.5, -2.25};
  double out[2] = {0, 0};
  ASSERT_TRUE(cpu_reduce::Convert(DType::kF64, DType::kF64, out, in, 2).ok());
  EXPECT_EQ(out[0], 1.5);
  EXPECT_EQ(out[1], -2.25);
}

TEST(AccumulateIntoTest, AccumulateInto_BF16Sum_CombinesInFloat) {
  float acc[1] = {1.0f};
  const uint16_t small = ToBFloat16(1.0f / 256).bits;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(
        cpu_reduce::AccumulateInto(ReduceOp::kSum, DType::kBF16, acc, &small, 1)
            .ok());
  }
  EXPECT_EQ(acc[0], 1.0f + 3.0f / 256);
}

TEST(AccumulateIntoTest, AccumulateInto_I8Avg_SumsWithoutWrapping) {
  int64_t acc[1] = {127};
  const int8_t v = 127;
  ASSERT_TRUE(
      cpu_reduce::AccumulateInto(ReduceOp::kAvg, DType::kI8, acc, &v, 1).ok());
  ASSERT_TRUE(
      cpu_reduce::AccumulateInto(ReduceOp::kAvg, DType::kI8, acc, &v, 1).ok());
  EXPECT_EQ(acc[0], 381);
}

TEST(ReduceSourcesTest, ReduceSources_I8Avg_RoundsOnceTowardZero) {
  const int8_t a[] = {127, -128, -7};
  const int8_t b[] = {127, -128, 0};
  const int8_t c[] = {127, -128, 0};
  const void* sources[] = {a, b, c};
  int8_t out[3];
  std::string scratch;
  ASSERT_TRUE(cpu_reduce::ReduceSources(ReduceOp::kAvg, DType::kI8, out,
                                        sources, 3, 3, &scratch)
                  .ok());
  EXPECT_EQ(out[0], 127);
  EXPECT_EQ(out[1], -128);
  EXPECT_EQ(out[2], -2);
}

TEST(ReduceSourcesTest, ReduceSources_F16Sum_MatchesRoundOnce) {
  const float x[] = {0.12537f, 0.43384f, -0.54297f};
  uint16_t h[3];
  float sum = 0;
  for (int i = 0; i < 3; ++i) {
    h[i] = ToFloat16(x[i]).bits;
    sum += ToFloat(Float16{h[i]});
  }
  const void* sources[] = {&h[0], &h[1], &h[2]};
  uint16_t out;
  std::string scratch;
  ASSERT_TRUE(cpu_reduce::ReduceSources(ReduceOp::kSum, DType::kF16, &out,
                                        sources, 3, 1, &scratch)
                  .ok());
  EXPECT_EQ(out, ToFloat16(sum).bits);
}

TEST(ReduceSourcesTest, ReduceSources_NoSources_InvalidArgument) {
  float out;
  std::string scratch;
  EXPECT_EQ(cpu_reduce::ReduceSources(ReduceOp::kSum, DType::kF32, &out,
                                      nullptr, 0, 1, &scratch)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace chorus
