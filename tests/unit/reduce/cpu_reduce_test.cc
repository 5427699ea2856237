// Tests for the CPU reduce engine (server/reduce/cpu/cpu_reduce.h): every
// dtype x op against the reference in reference.h, on sizes that exercise
// vector bodies and scalar tails, plus argument checking.
#include "server/reduce/cpu/cpu_reduce.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "common/dtype.h"
#include "common/half.h"
#include "gtest/gtest.h"
#include "tests/unit/reduce/reference.h"
#include "tests/unit/reduce/test_values.h"

namespace chorus {
namespace {

using reduce_test::DTypeOf;
using reduce_test::RandomValues;
using reduce_test::Reference;
using reduce_test::SameResult;

constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin,
                                ReduceOp::kMax, ReduceOp::kAvg};
constexpr size_t kSizes[] = {0, 1, 7, 1023};

template <typename T>
std::vector<T> ReferenceCombine(ReduceOp op, const std::vector<T>& a,
                                const std::vector<T>& b) {
  std::vector<T> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    out[i] = Reference<T>::Combine(op, a[i], b[i]);
  }
  return out;
}

template <typename T>
void ExpectSame(const std::vector<T>& got, const std::vector<T>& want,
                const std::string& context) {
  ASSERT_EQ(got.size(), want.size()) << context;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(SameResult(got[i], want[i])) << context << " at index " << i;
  }
}

template <typename T>
class CpuReduceTypedTest : public ::testing::Test {};

using AllTypes =
    ::testing::Types<Float16, BFloat16, float, double, int8_t, uint8_t, int32_t,
                     int64_t, uint32_t, uint64_t>;
TYPED_TEST_SUITE(CpuReduceTypedTest, AllTypes);

TYPED_TEST(CpuReduceTypedTest, ReduceInto_EveryOpAndSize_MatchesReference) {
  using T = TypeParam;
  const DType dtype = DTypeOf<T>();
  for (ReduceOp op : kAllOps) {
    for (size_t size : kSizes) {
      const std::vector<T> a = RandomValues<T>(size, 1 + size);
      const std::vector<T> b = RandomValues<T>(size, 2 + size);
      std::vector<T> dst = a;
      ASSERT_TRUE(
          cpu_reduce::ReduceInto(op, dtype, dst.data(), b.data(), size).ok());
      ExpectSame(dst, ReferenceCombine(op, a, b),
                 std::string(ReduceOpName(op)) + " " +
                     std::string(DTypeName(dtype)) + " size " +
                     std::to_string(size));
    }
  }
}

TYPED_TEST(CpuReduceTypedTest, Reduce_EveryOpAndSize_MatchesReference) {
  using T = TypeParam;
  const DType dtype = DTypeOf<T>();
  for (ReduceOp op : kAllOps) {
    for (size_t size : kSizes) {
      const std::vector<T> a = RandomValues<T>(size, 3 + size);
      const std::vector<T> b = RandomValues<T>(size, 4 + size);
      std::vector<T> dst(size);
      ASSERT_TRUE(
          cpu_reduce::Reduce(op, dtype, dst.data(), a.data(), b.data(), size)
              .ok());
      const std::string context = std::string(ReduceOpName(op)) + " " +
                                  std::string(DTypeName(dtype)) + " size " +
                                  std::to_string(size);
      ExpectSame(dst, ReferenceCombine(op, a, b), context);
      // dst aliasing the second input: the first operand still comes first.
      std::vector<T> in_b = b;
      ASSERT_TRUE(cpu_reduce::Reduce(op, dtype, in_b.data(), a.data(),
                                     in_b.data(), size)
                      .ok());
      ExpectSame(in_b, ReferenceCombine(op, a, b), context + " dst == b");
    }
  }
}

TYPED_TEST(CpuReduceTypedTest, ReduceInto_OffsetByOneElement_MatchesReference) {
  // Buffers one element past an allocation start reach the vector loops with
  // a different alignment than the allocator's.
  using T = TypeParam;
  const DType dtype = DTypeOf<T>();
  const size_t size = 1023;
  for (ReduceOp op : kAllOps) {
    const std::vector<T> a = RandomValues<T>(size + 1, 5);
    const std::vector<T> b = RandomValues<T>(size + 2, 6);
    std::vector<T> dst = a;
    ASSERT_TRUE(
        cpu_reduce::ReduceInto(op, dtype, dst.data() + 1, b.data() + 2, size)
            .ok());
    for (size_t i = 0; i < size; ++i) {
      ASSERT_TRUE(
          SameResult(dst[i + 1], Reference<T>::Combine(op, a[i + 1], b[i + 2])))
          << ReduceOpName(op) << " at " << i;
    }
    ASSERT_TRUE(SameResult(dst[0], a[0])) << "wrote before the range";
  }
}

TYPED_TEST(CpuReduceTypedTest, FinalizeAvg_ThreeRanks_MatchesReference) {
  using T = TypeParam;
  const DType dtype = DTypeOf<T>();
  for (size_t size : kSizes) {
    const std::vector<T> r0 = RandomValues<T>(size, 7, /*specials=*/false);
    const std::vector<T> r1 = RandomValues<T>(size, 8, /*specials=*/false);
    const std::vector<T> r2 = RandomValues<T>(size, 9, /*specials=*/false);
    std::vector<T> total = r0;
    ASSERT_TRUE(cpu_reduce::ReduceInto(ReduceOp::kAvg, dtype, total.data(),
                                       r1.data(), size)
                    .ok());
    ASSERT_TRUE(cpu_reduce::ReduceInto(ReduceOp::kAvg, dtype, total.data(),
                                       r2.data(), size)
                    .ok());
    ASSERT_TRUE(cpu_reduce::FinalizeAvg(dtype, total.data(), size, 3).ok());
    std::vector<T> want(size);
    for (size_t i = 0; i < size; ++i) {
      const T sum = Reference<T>::Combine(
          ReduceOp::kSum, Reference<T>::Combine(ReduceOp::kSum, r0[i], r1[i]),
          r2[i]);
      want[i] = Reference<T>::Finalize(sum, 3);
    }
    ExpectSame(total, want, "size " + std::to_string(size));
  }
}

TYPED_TEST(CpuReduceTypedTest, FinalizeAvg_OneRank_LeavesDataUnchanged) {
  using T = TypeParam;
  const std::vector<T> data = RandomValues<T>(64, 10);
  std::vector<T> copy = data;
  ASSERT_TRUE(
      cpu_reduce::FinalizeAvg(DTypeOf<T>(), copy.data(), copy.size(), 1).ok());
  EXPECT_EQ(std::memcmp(copy.data(), data.data(), data.size() * sizeof(T)), 0);
}

TEST(CpuReduceTest, ReduceInto_IntegerSumOverflow_Wraps) {
  std::vector<int32_t> dst = {INT32_MAX, INT32_MIN, -1};
  const std::vector<int32_t> src = {1, -1, 1};
  ASSERT_TRUE(cpu_reduce::ReduceInto(ReduceOp::kSum, DType::kI32, dst.data(),
                                     src.data(), dst.size())
                  .ok());
  EXPECT_EQ(dst, (std::vector<int32_t>{INT32_MIN, INT32_MAX, 0}));
}

TEST(CpuReduceTest, ReduceInto_IntegerProdOverflow_Wraps) {
  std::vector<uint8_t> dst = {16, 255, 3};
  const std::vector<uint8_t> src = {16, 255, 100};
  ASSERT_TRUE(cpu_reduce::ReduceInto(ReduceOp::kProd, DType::kU8, dst.data(),
                                     src.data(), dst.size())
                  .ok());
  EXPECT_EQ(dst, (std::vector<uint8_t>{0, 1, 44}));
}

TEST(CpuReduceTest, ReduceInto_FloatMinMaxWithNaNAndInfinity_PropagatesNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> a = {nan, 1.0f, -inf, inf, 0.0f, -0.0f};
  const std::vector<float> b = {1.0f, nan, 2.0f, -inf, -0.0f, 0.0f};
  std::vector<float> mins = a;
  std::vector<float> maxs = a;
  ASSERT_TRUE(cpu_reduce::ReduceInto(ReduceOp::kMin, DType::kF32, mins.data(),
                                     b.data(), a.size())
                  .ok());
  ASSERT_TRUE(cpu_reduce::ReduceInto(ReduceOp::kMax, DType::kF32, maxs.data(),
                                     b.data(), a.size())
                  .ok());
  EXPECT_TRUE(std::isnan(mins[0]));
  EXPECT_TRUE(std::isnan(mins[1]));
  EXPECT_EQ(mins[2], -inf);
  EXPECT_EQ(mins[3], -inf);
  EXPECT_TRUE(std::signbit(mins[4]));
  EXPECT_TRUE(std::signbit(mins[5]));
  EXPECT_TRUE(std::isnan(maxs[0]));
  EXPECT_TRUE(std::isnan(maxs[1]));
  EXPECT_EQ(maxs[2], 2.0f);
  EXPECT_EQ(maxs[3], inf);
  EXPECT_FALSE(std::signbit(maxs[4]));
  EXPECT_FALSE(std::signbit(maxs[5]));
}

TEST(CpuReduceTest, FinalizeAvg_NegativeIntegers_TruncateTowardZero) {
  std::vector<int64_t> data = {-7, 7, -1, INT64_MIN};
  ASSERT_TRUE(
      cpu_reduce::FinalizeAvg(DType::kI64, data.data(), data.size(), 2).ok());
  EXPECT_EQ(data, (std::vector<int64_t>{-3, 3, 0, INT64_MIN / 2}));
}

TEST(CpuReduceTest, ReduceInto_LargeF32_MatchesReference) {
  const size_t size = (1 << 20) + 3;
  const std::vector<float> a = RandomValues<float>(size, 11);
  const std::vector<float> b = RandomValues<float>(size, 12);
  std::vector<float> dst = a;
  ASSERT_TRUE(cpu_reduce::ReduceInto(ReduceOp::kSum, DType::kF32, dst.data(),
                                     b.data(), size)
                  .ok());
  ExpectSame(dst, ReferenceCombine(ReduceOp::kSum, a, b), "f32 sum");
}

TEST(CpuReduceTest, ReduceInto_InvalidDType_ReturnsInvalidArgument) {
  float dst[2] = {1, 2};
  const float src[2] = {3, 4};
  for (DType dtype : {DType::kUnspecified, static_cast<DType>(42)}) {
    const absl::Status status =
        cpu_reduce::ReduceInto(ReduceOp::kSum, dtype, dst, src, 2);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StartsWith(status.message(), "Cpu: "))
        << status.message();
  }
  EXPECT_EQ(dst[0], 1.0f);  // Nothing written.
}

TEST(CpuReduceTest, ReduceInto_InvalidOp_ReturnsInvalidArgument) {
  float dst[2] = {1, 2};
  const float src[2] = {3, 4};
  for (ReduceOp op : {ReduceOp::kUnspecified, static_cast<ReduceOp>(9)}) {
    EXPECT_EQ(cpu_reduce::ReduceInto(op, DType::kF32, dst, src, 2).code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(dst[1], 2.0f);
}

TEST(CpuReduceTest, ReduceInto_NullWithZeroCount_ReturnsOk) {
  EXPECT_TRUE(
      cpu_reduce::ReduceInto(ReduceOp::kSum, DType::kF64, nullptr, nullptr, 0)
          .ok());
  EXPECT_TRUE(cpu_reduce::FinalizeAvg(DType::kF64, nullptr, 0, 4).ok());
}

TEST(CpuReduceTest, Reduce_NullWithCount_ReturnsInvalidArgument) {
  float dst[1] = {0};
  const float a[1] = {1};
  EXPECT_EQ(cpu_reduce::Reduce(ReduceOp::kSum, DType::kF32, dst, a, nullptr, 1)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      cpu_reduce::Reduce(ReduceOp::kSum, DType::kF32, nullptr, a, a, 1).code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(CpuReduceTest, ReduceInto_MisalignedPointer_ReturnsInvalidArgument) {
  alignas(8) unsigned char buffer[64] = {};
  const absl::Status status = cpu_reduce::ReduceInto(
      ReduceOp::kSum, DType::kF32, buffer + 1, buffer + 32, 4);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "aligned"))
      << status.message();
}

TEST(CpuReduceTest, ReduceInto_PartialOverlap_ReturnsInvalidArgument) {
  std::vector<float> data(16, 1.0f);
  EXPECT_EQ(cpu_reduce::ReduceInto(ReduceOp::kSum, DType::kF32, data.data(),
                                   data.data() + 1, 8)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(data[0], 1.0f);
  // Adjacent, not overlapping: fine.
  EXPECT_TRUE(cpu_reduce::ReduceInto(ReduceOp::kSum, DType::kF32, data.data(),
                                     data.data() + 8, 8)
                  .ok());
  EXPECT_EQ(data[0], 2.0f);
}

TEST(CpuReduceTest, ReduceInto_SameBuffer_DoublesForSum) {
  std::vector<int32_t> data = {1, 2, 3};
  ASSERT_TRUE(cpu_reduce::ReduceInto(ReduceOp::kSum, DType::kI32, data.data(),
                                     data.data(), data.size())
                  .ok());
  EXPECT_EQ(data, (std::vector<int32_t>{2, 4, 6}));
}

TEST(CpuReduceTest, ReduceInto_CountOverflowingBytes_ReturnsInvalidArgument) {
  float dst[1] = {0};
  EXPECT_EQ(cpu_reduce::ReduceInto(ReduceOp::kSum, DType::kF32, dst, dst,
                                   SIZE_MAX / 2)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CpuReduceTest, FinalizeAvg_WorldSizeBelowOne_ReturnsInvalidArgument) {
  float data[1] = {6};
  for (int world_size : {0, -3}) {
    const absl::Status status =
        cpu_reduce::FinalizeAvg(DType::kF32, data, 1, world_size);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(status.message(), "world_size"));
  }
  EXPECT_EQ(data[0], 6.0f);
}

}  // namespace
}  // namespace chorus
