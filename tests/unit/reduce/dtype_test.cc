// Tests for DType / ReduceOp names, sizes, parsing, and that their numeric
// values mirror chorus.v1.DType / chorus.v1.ReduceOp.
#include "common/dtype.h"

#include <string>

#include "absl/status/status.h"
#include "chorus/v1/types.pb.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

TEST(DTypeTest, Values_MatchProtoEnum) {
  EXPECT_EQ(static_cast<int>(DType::kUnspecified), v1::DTYPE_UNSPECIFIED);
  EXPECT_EQ(static_cast<int>(DType::kF16), v1::DTYPE_F16);
  EXPECT_EQ(static_cast<int>(DType::kBF16), v1::DTYPE_BF16);
  EXPECT_EQ(static_cast<int>(DType::kF32), v1::DTYPE_F32);
  EXPECT_EQ(static_cast<int>(DType::kF64), v1::DTYPE_F64);
  EXPECT_EQ(static_cast<int>(DType::kI8), v1::DTYPE_I8);
  EXPECT_EQ(static_cast<int>(DType::kU8), v1::DTYPE_U8);
  EXPECT_EQ(static_cast<int>(DType::kI32), v1::DTYPE_I32);
  EXPECT_EQ(static_cast<int>(DType::kI64), v1::DTYPE_I64);
  EXPECT_EQ(static_cast<int>(DType::kU32), v1::DTYPE_U32);
  EXPECT_EQ(static_cast<int>(DType::kU64), v1::DTYPE_U64);
  EXPECT_EQ(v1::DType_MAX, v1::DTYPE_U64);
}

TEST(ReduceOpTest, Values_MatchProtoEnum) {
  EXPECT_EQ(static_cast<int>(ReduceOp::kUnspecified),
            v1::REDUCE_OP_UNSPECIFIED);
  EXPECT_EQ(static_cast<int>(ReduceOp::kSum), v1::REDUCE_OP_SUM);
  EXPECT_EQ(static_cast<int>(ReduceOp::kProd), v1::REDUCE_OP_PROD);
  EXPECT_EQ(static_cast<int>(ReduceOp::kMin), v1::REDUCE_OP_MIN);
  EXPECT_EQ(static_cast<int>(ReduceOp::kMax), v1::REDUCE_OP_MAX);
  EXPECT_EQ(static_cast<int>(ReduceOp::kAvg), v1::REDUCE_OP_AVG);
  EXPECT_EQ(v1::ReduceOp_MAX, v1::REDUCE_OP_AVG);
}

TEST(DTypeTest, DTypeSize_EveryDType_MatchesStorage) {
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kF64), 8u);
  EXPECT_EQ(DTypeSize(DType::kI8), 1u);
  EXPECT_EQ(DTypeSize(DType::kU8), 1u);
  EXPECT_EQ(DTypeSize(DType::kI32), 4u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(DTypeSize(DType::kU32), 4u);
  EXPECT_EQ(DTypeSize(DType::kU64), 8u);
  EXPECT_EQ(DTypeSize(DType::kUnspecified), 0u);
  EXPECT_EQ(DTypeSize(static_cast<DType>(11)), 0u);
}

TEST(DTypeTest, ParseDType_EveryName_RoundTrips) {
  for (int value = 1; value <= 10; ++value) {
    const DType dtype = static_cast<DType>(value);
    ASSERT_TRUE(IsValidDType(dtype));
    const absl::StatusOr<DType> parsed = ParseDType(DTypeName(dtype));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, dtype);
  }
  EXPECT_EQ(DTypeName(DType::kF32), "f32");
  EXPECT_EQ(DTypeName(DType::kBF16), "bf16");
  EXPECT_EQ(*ParseDType("BF16"), DType::kBF16);
}

TEST(DTypeTest, ParseDType_UnknownName_ReturnsInvalidArgument) {
  for (const char* name : {"", "f8", "float", "unspecified", "unknown"}) {
    const absl::StatusOr<DType> parsed = ParseDType(name);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
        << name;
  }
}

TEST(DTypeTest, IsValidDType_OutOfRange_ReturnsFalse) {
  EXPECT_FALSE(IsValidDType(DType::kUnspecified));
  EXPECT_FALSE(IsValidDType(static_cast<DType>(11)));
  EXPECT_FALSE(IsValidDType(static_cast<DType>(-1)));
  EXPECT_EQ(DTypeName(static_cast<DType>(11)), "unknown");
  EXPECT_EQ(DTypeName(DType::kUnspecified), "unspecified");
  EXPECT_EQ(ValidateDType(static_cast<DType>(11)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidateDType(DType::kU64).ok());
}

TEST(ReduceOpTest, ParseReduceOp_EveryName_RoundTrips) {
  for (int value = 1; value <= 5; ++value) {
    const ReduceOp op = static_cast<ReduceOp>(value);
    ASSERT_TRUE(IsValidReduceOp(op));
    const absl::StatusOr<ReduceOp> parsed = ParseReduceOp(ReduceOpName(op));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, op);
  }
  EXPECT_EQ(ReduceOpName(ReduceOp::kSum), "sum");
  EXPECT_EQ(*ParseReduceOp("AVG"), ReduceOp::kAvg);
}

TEST(ReduceOpTest, ParseReduceOp_UnknownName_ReturnsInvalidArgument) {
  for (const char* name : {"", "mean", "unspecified", "summ"}) {
    EXPECT_EQ(ParseReduceOp(name).status().code(),
              absl::StatusCode::kInvalidArgument)
        << name;
  }
}

TEST(ReduceOpTest, IsValidReduceOp_OutOfRange_ReturnsFalse) {
  EXPECT_FALSE(IsValidReduceOp(ReduceOp::kUnspecified));
  EXPECT_FALSE(IsValidReduceOp(static_cast<ReduceOp>(6)));
  EXPECT_EQ(ReduceOpName(static_cast<ReduceOp>(6)), "unknown");
  EXPECT_EQ(ValidateReduceOp(static_cast<ReduceOp>(6)).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace chorus
