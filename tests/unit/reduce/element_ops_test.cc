// Tests for the shared element operators (server/reduce/element_ops.h):
// integer wrap-around, NaN and signed-zero rules, avg finalize rounding.
#include "server/reduce/element_ops.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "gtest/gtest.h"

namespace chorus {
namespace reduce {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

template <typename T>
T Lowest() {
  return std::numeric_limits<T>::lowest();
}
template <typename T>
T Highest() {
  return std::numeric_limits<T>::max();
}

TEST(ElementOpsTest, Add_SignedOverflow_Wraps) {
  EXPECT_EQ(Add<int8_t>(127, 1), -128);
  EXPECT_EQ(Add<int8_t>(-128, -1), 127);
  EXPECT_EQ(Add(Highest<int32_t>(), int32_t{1}), Lowest<int32_t>());
  EXPECT_EQ(Add(Lowest<int64_t>(), int64_t{-1}), Highest<int64_t>());
}

TEST(ElementOpsTest, Add_UnsignedOverflow_Wraps) {
  EXPECT_EQ(Add<uint8_t>(255, 1), 0);
  EXPECT_EQ(Add<uint8_t>(200, 100), 44);
  EXPECT_EQ(Add(Highest<uint32_t>(), uint32_t{2}), 1u);
  EXPECT_EQ(Add(Highest<uint64_t>(), uint64_t{1}), 0u);
}

TEST(ElementOpsTest, Mul_Overflow_WrapsModuloWidth) {
  EXPECT_EQ(Mul<int8_t>(-128, -1), -128);
  EXPECT_EQ(Mul<int8_t>(16, 16), 0);
  EXPECT_EQ(Mul<int8_t>(100, 3), 44);
  EXPECT_EQ(Mul<uint8_t>(255, 255), 1);
  EXPECT_EQ(Mul<int32_t>(65536, 65536), 0);
  EXPECT_EQ(Mul<int32_t>(Lowest<int32_t>(), -1), Lowest<int32_t>());
  EXPECT_EQ(Mul<uint32_t>(65537, 65537), 131073u);
  EXPECT_EQ(Mul(Lowest<int64_t>(), int64_t{-1}), Lowest<int64_t>());
  EXPECT_EQ(Mul(Highest<uint64_t>(), Highest<uint64_t>()), 1u);
}

TEST(ElementOpsTest, MinMax_Integers_AreExact) {
  EXPECT_EQ(Min<int8_t>(-128, 127), -128);
  EXPECT_EQ(Max<int8_t>(-128, 127), 127);
  EXPECT_EQ(Min(Highest<uint64_t>(), Highest<uint64_t>() - 1),
            Highest<uint64_t>() - 1);
  EXPECT_EQ(Max(Lowest<int64_t>(), Lowest<int64_t>() + 1),
            Lowest<int64_t>() + 1);
}

TEST(ElementOpsTest, MinMax_EitherOperandNaN_ReturnsNaN) {
  EXPECT_TRUE(std::isnan(Min(kNaN, 1.0f)));
  EXPECT_TRUE(std::isnan(Min(1.0f, kNaN)));
  EXPECT_TRUE(std::isnan(Max(kNaN, 1.0f)));
  EXPECT_TRUE(std::isnan(Max(1.0f, kNaN)));
  EXPECT_TRUE(std::isnan(Min(-kInf, kNaN)));
  EXPECT_TRUE(std::isnan(Max(kInf, kNaN)));
  EXPECT_TRUE(std::isnan(Min(1.0, std::nan(""))));
  EXPECT_TRUE(std::isnan(Max(std::nan(""), 1.0)));
}

TEST(ElementOpsTest, MinMax_BothNaN_ReturnsFirstOperand) {
  const float first = -kNaN;
  EXPECT_TRUE(std::signbit(Min(first, kNaN)));
  EXPECT_TRUE(std::signbit(Max(first, kNaN)));
  EXPECT_FALSE(std::signbit(Min(kNaN, first)));
}

TEST(ElementOpsTest, MinMax_Infinities_OrderAsValues) {
  EXPECT_EQ(Min(-kInf, -1e30f), -kInf);
  EXPECT_EQ(Max(kInf, 1e30f), kInf);
  EXPECT_EQ(Min(kInf, 0.0f), 0.0f);
  EXPECT_EQ(Max(-kInf, 0.0f), 0.0f);
}

TEST(ElementOpsTest, MinMax_SignedZeros_NegativeForMinPositiveForMax) {
  EXPECT_TRUE(std::signbit(Min(0.0f, -0.0f)));
  EXPECT_TRUE(std::signbit(Min(-0.0f, 0.0f)));
  EXPECT_FALSE(std::signbit(Max(0.0f, -0.0f)));
  EXPECT_FALSE(std::signbit(Max(-0.0f, 0.0f)));
  EXPECT_TRUE(std::signbit(Min(0.0, -0.0)));
  EXPECT_FALSE(std::signbit(Max(-0.0, 0.0)));
}

TEST(ElementOpsTest, Add_Float16_CombinesInFloatAndRoundsToEven) {
  const Float16 big = ToFloat16(2048.0f);
  EXPECT_EQ(ToFloat(Add(big, ToFloat16(1.0f))), 2048.0f);  // Tie: even.
  EXPECT_EQ(ToFloat(Add(big, ToFloat16(3.0f))), 2052.0f);  // Tie: even.
  EXPECT_EQ(Add(ToFloat16(65504.0f), ToFloat16(16.0f)).bits, 0x7c00);
  EXPECT_EQ(Add(ToFloat16(1.0f), ToFloat16(-1.0f)).bits, 0x0000);
}

TEST(ElementOpsTest, Combine_BFloat16_RoundsTheFloatResult) {
  const BFloat16 one = ToBFloat16(1.0f);
  const BFloat16 tiny = ToBFloat16(std::ldexp(1.0f, -8));  // Half an ulp.
  EXPECT_EQ(Add(one, tiny).bits, one.bits);
  EXPECT_EQ(Mul(ToBFloat16(3.0f), ToBFloat16(5.0f)).bits,
            ToBFloat16(15.0f).bits);
  EXPECT_TRUE(std::isnan(ToFloat(Min(one, BFloat16{0x7fc0}))));
  EXPECT_EQ(Max(BFloat16{0x8000}, BFloat16{0x0000}).bits, 0x0000);
}

TEST(ElementOpsTest, DivideByRanks_SignedIntegers_TruncateTowardZero) {
  EXPECT_EQ(DivideByRanks<int32_t>(-7, 2), -3);
  EXPECT_EQ(DivideByRanks<int32_t>(7, 2), 3);
  EXPECT_EQ(DivideByRanks<int8_t>(-128, 3), -42);
  EXPECT_EQ(DivideByRanks<int8_t>(-128, 200), 0);  // Rank count wider than T.
  EXPECT_EQ(DivideByRanks<int64_t>(Lowest<int64_t>(), 2),
            Lowest<int64_t>() / 2);
}

TEST(ElementOpsTest, DivideByRanks_UnsignedIntegers_Truncate) {
  EXPECT_EQ(DivideByRanks<uint8_t>(255, 2), 127);
  EXPECT_EQ(DivideByRanks<uint8_t>(255, 300), 0);
  EXPECT_EQ(DivideByRanks<uint32_t>(Highest<uint32_t>(), 1000000),
            Highest<uint32_t>() / 1000000u);
  EXPECT_EQ(DivideByRanks<uint64_t>(Highest<uint64_t>(), 3),
            Highest<uint64_t>() / 3);
}

TEST(ElementOpsTest, AvgFinalize_Floats_DivideInFloatAndRound) {
  const AvgFinalize by3{3};
  EXPECT_EQ(by3(1.0f), 1.0f / 3.0f);
  EXPECT_EQ(by3(1.0), 1.0 / 3.0);
  EXPECT_EQ(by3(ToFloat16(1.0f)).bits, ToFloat16(1.0f / 3.0f).bits);
  EXPECT_EQ(by3(ToBFloat16(1.0f)).bits, ToBFloat16(1.0f / 3.0f).bits);
  // Subnormal results: f16 1 unit / 2 is a tie that rounds to even, zero.
  EXPECT_EQ(AvgFinalize{2}(Float16{0x0001}).bits, 0x0000);
  EXPECT_EQ(AvgFinalize{2}(Float16{0x0003}).bits, 0x0002);
  EXPECT_TRUE(std::isnan(by3(kNaN)));
  EXPECT_EQ(by3(kInf), kInf);
}

TEST(ElementOpsTest, Functors_ApplyTheirOperator) {
  EXPECT_EQ(SumOp{}(2, 3), 5);
  EXPECT_EQ(ProdOp{}(2.0, 3.0), 6.0);
  EXPECT_EQ(MinOp{}(uint8_t{2}, uint8_t{3}), 2);
  EXPECT_EQ(MaxOp{}(int64_t{-2}, int64_t{-3}), -2);
}

}  // namespace
}  // namespace reduce
}  // namespace chorus
