#include "server/worker/coordinator_status.h"

#include <grpcpp/support/status.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(CoordinatorStatusTest,
     FromCoordinator_GrpcsOwnDeadline_NamesTheCoordinator) {
  const absl::Status status = FromCoordinator(
      grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded"),
      "10.0.0.1:7000", "collective #3 of group g",
      absl::Now() - absl::Seconds(6));
  EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
  EXPECT_THAT(std::string(status.message()),
              StartsWith("the coordinator at 10.0.0.1:7000 did not answer "
                         "collective #3 of group g within 6"));
}

TEST(CoordinatorStatusTest, FromCoordinator_ItsOwnVerdict_Unchanged) {
  const std::string verdict =
      "ranks 1 of group g did not reach all_reduce #3 within the deadline";
  const absl::Status status = FromCoordinator(
      grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, verdict),
      "10.0.0.1:7000", "collective #3 of group g", absl::Now());
  EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
  EXPECT_EQ(status.message(), verdict);
  const absl::Status mismatch = FromCoordinator(
      grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "rank 0: ..."),
      "10.0.0.1:7000", "collective #3 of group g", absl::Now());
  EXPECT_TRUE(absl::IsInvalidArgument(mismatch)) << mismatch;
  EXPECT_EQ(mismatch.message(), "rank 0: ...");
}

TEST(CoordinatorStatusTest, FromCoordinator_NotDelivered_UnavailableNamingIt) {
  const absl::Status status = FromCoordinator(
      grpc::Status(grpc::StatusCode::UNAVAILABLE,
                   "failed to connect to all addresses"),
      "10.0.0.1:7000", "the join of group g as rank 0", absl::Now());
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_EQ(status.message(),
            "the coordinator at 10.0.0.1:7000 is unreachable (the join of "
            "group g as rank 0): failed to connect to all addresses");
  // The coordinator's own shutdown notice already says who it is.
  const absl::Status shutting = FromCoordinator(
      grpc::Status(grpc::StatusCode::UNAVAILABLE,
                   "the coordinator is shutting down"),
      "10.0.0.1:7000", "the join of group g as rank 0", absl::Now());
  EXPECT_EQ(shutting.message(), "the coordinator is shutting down");
}

TEST(CoordinatorStatusTest, RoundedDuration_MillisecondsThenTenths) {
  EXPECT_EQ(RoundedDuration(absl::Microseconds(250400)), "250ms");
  EXPECT_EQ(RoundedDuration(absl::Milliseconds(2749)), "2.7s");
  EXPECT_THAT(
      std::string(
          CoordinatorSilentError("c:1", "x", absl::Seconds(3)).message()),
      HasSubstr("within 3s"));
}

}  // namespace
}  // namespace chorus
