#include "common/coordinator_target.h"

#include "absl/status/status.h"
#include "common/status_detail.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

// The refusal a standby gives, naming `leader`.
absl::Status NotLeader(const std::string& leader) {
  v1::ErrorDetail detail = MakeErrorDetail("NOT_LEADER", "", 0, 0);
  detail.set_leader(leader);
  return WithErrorDetail(absl::UnavailableError("a standby"), detail);
}

TEST(CoordinatorTargetTest, Check_ListOfHostPorts_Ok) {
  EXPECT_TRUE(CoordinatorTarget::Check("a:7000,b:7000,10.0.0.3:7000").ok());
  EXPECT_EQ(CoordinatorTarget::Check("a:7000,b").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CoordinatorTarget::Check("").code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CoordinatorTargetTest, Follow_StandbyNamesLeader_MovesToLeader) {
  CoordinatorTarget target("a:7000,b:7000,c:7000");
  EXPECT_EQ(target.address(), "a:7000");
  EXPECT_TRUE(target.Follow("a:7000", NotLeader("c:7000")));
  EXPECT_EQ(target.address(), "c:7000");
}

TEST(CoordinatorTargetTest, Follow_Unreachable_MovesToNextListed) {
  CoordinatorTarget target("a:7000,b:7000,c:7000");
  EXPECT_TRUE(target.Follow("a:7000", absl::UnavailableError("refused")));
  EXPECT_EQ(target.address(), "b:7000");
  EXPECT_TRUE(
      target.Follow("b:7000", absl::DeadlineExceededError("no answer")));
  EXPECT_EQ(target.address(), "c:7000");
  EXPECT_TRUE(target.Follow("c:7000", absl::UnavailableError("refused")));
  EXPECT_EQ(target.address(), "a:7000");
}

TEST(CoordinatorTargetTest, Follow_OneCoordinatorOrOtherError_StaysPut) {
  CoordinatorTarget one("a:7000");
  EXPECT_FALSE(one.Follow("a:7000", absl::UnavailableError("refused")));
  EXPECT_EQ(one.address(), "a:7000");
  CoordinatorTarget three("a:7000,b:7000,c:7000");
  EXPECT_FALSE(three.Follow("a:7000", absl::InvalidArgumentError("bad")));
  EXPECT_FALSE(three.Follow("a:7000", absl::OkStatus()));
  EXPECT_EQ(three.address(), "a:7000");
}

TEST(CoordinatorTargetTest, Follow_AnotherCallMovedItAlready_KeepsThatMove) {
  CoordinatorTarget target("a:7000,b:7000,c:7000");
  ASSERT_TRUE(target.Follow("a:7000", NotLeader("c:7000")));
  // A second call that failed at a:7000 finds the target moved: retry.
  EXPECT_TRUE(target.Follow("a:7000", absl::UnavailableError("refused")));
  EXPECT_EQ(target.address(), "c:7000");
}

}  // namespace
}  // namespace chorus
