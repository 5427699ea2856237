#include "common/status_detail.h"

#include <optional>
#include <string>

#include "common/grpc_status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::ElementsAre;

v1::ErrorDetail Missing() {
  v1::ErrorDetail detail = MakeErrorDetail("RANKS_MISSING", "g", 3, 7);
  detail.add_missing_ranks(1);
  detail.add_missing_ranks(4);
  return detail;
}

TEST(StatusDetailTest, WithErrorDetail_Attached_ReadBack) {
  const absl::Status status =
      WithErrorDetail(absl::DeadlineExceededError("late"), Missing());
  const std::optional<v1::ErrorDetail> detail = ErrorDetailOf(status);
  ASSERT_TRUE(detail.has_value());
  EXPECT_EQ(detail->reason(), "RANKS_MISSING");
  EXPECT_EQ(detail->group(), "g");
  EXPECT_EQ(detail->epoch(), 3u);
  EXPECT_EQ(detail->sequence(), 7u);
  EXPECT_THAT(detail->missing_ranks(), ElementsAre(1, 4));
  EXPECT_EQ(status.message(), "late");
}

TEST(StatusDetailTest, WithErrorDetail_OkStatus_NoDetail) {
  EXPECT_FALSE(
      ErrorDetailOf(WithErrorDetail(absl::OkStatus(), Missing())).has_value());
  EXPECT_FALSE(ErrorDetailOf(absl::AbortedError("x")).has_value());
}

TEST(StatusDetailTest, RewordedStatus_NewWords_DetailKept) {
  const absl::Status reworded = RewordedStatus(
      WithErrorDetail(absl::DeadlineExceededError("late"), Missing()),
      absl::StatusCode::kAborted, "late; aborted");
  EXPECT_EQ(reworded.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(reworded.message(), "late; aborted");
  ASSERT_TRUE(ErrorDetailOf(reworded).has_value());
  EXPECT_EQ(ErrorDetailOf(reworded)->reason(), "RANKS_MISSING");
}

TEST(StatusDetailTest, StatusWithDetail_EmptyReason_NoDetail) {
  const absl::Status plain =
      StatusWithDetail(absl::StatusCode::kAborted, "x", v1::ErrorDetail());
  EXPECT_FALSE(ErrorDetailOf(plain).has_value());
  const absl::Status with =
      StatusWithDetail(absl::StatusCode::kAborted, "x", Missing());
  EXPECT_TRUE(ErrorDetailOf(with).has_value());
}

// What any gRPC client sees: a google.rpc.Status (code, message, one Any)
// in error_details().
TEST(StatusDetailTest, ToGrpcStatus_Detail_GoogleRpcStatusOnTheWire) {
  const grpc::Status wire = ToGrpcStatus(
      WithErrorDetail(absl::DeadlineExceededError("late"), Missing()));
  EXPECT_EQ(wire.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(wire.error_message(), "late");
  v1::RpcStatus rpc;
  ASSERT_TRUE(rpc.ParseFromString(wire.error_details()));
  EXPECT_EQ(rpc.code(), 4);
  EXPECT_EQ(rpc.message(), "late");
  ASSERT_EQ(rpc.details_size(), 1);
  EXPECT_EQ(rpc.details(0).type_url(),
            "type.googleapis.com/chorus.v1.ErrorDetail");
  v1::ErrorDetail detail;
  ASSERT_TRUE(detail.ParseFromString(rpc.details(0).value()));
  EXPECT_THAT(detail.missing_ranks(), ElementsAre(1, 4));

  const absl::Status back = FromGrpcStatus(wire);
  EXPECT_EQ(back.code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(ErrorDetailOf(back).has_value());
  EXPECT_EQ(ErrorDetailOf(back)->group(), "g");
}

TEST(StatusDetailTest, FromGrpcStatus_NoOrMalformedDetails_CodeAndMessage) {
  EXPECT_TRUE(ToGrpcStatus(absl::AbortedError("x")).error_details().empty());
  const absl::Status malformed = FromGrpcStatus(
      grpc::Status(grpc::StatusCode::ABORTED, "x", std::string("\xff\xff")));
  EXPECT_EQ(malformed.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(malformed.message(), "x");
  EXPECT_FALSE(ErrorDetailOf(malformed).has_value());
}

}  // namespace
}  // namespace chorus
