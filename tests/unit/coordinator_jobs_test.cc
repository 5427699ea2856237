// Unit tests of jobs in the coordinator's core (job_groups.h): each job's
// groups and workers apart from the others', with a fake clock.

#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator.h"
#include "tests/testing/fake_clock.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

Device Cpu() {
  Device d;
  d.kind = DeviceKind::kCpu;
  return d;
}

Device Vulkan() {
  Device d;
  d.kind = DeviceKind::kVulkan;
  return d;
}

class CoordinatorJobsTest : public ::testing::Test {
 protected:
  CoordinatorJobsTest() : core_(&clock_, CoordinatorOptions()) {}

  // Registers worker `name` of `job`; returns its id.
  uint64_t Register(const std::string& job, const std::string& name) {
    WorkerRegistration r;
    r.name = name;
    r.job = job;
    r.host = absl::StrCat(job, "-", name);
    r.address = absl::StrCat(r.host, ":7000");
    r.incarnation = 1;
    r.devices = {Cpu()};
    absl::StatusOr<RegisterResult> registered = core_.Register(r);
    EXPECT_TRUE(registered.ok()) << registered.status();
    return registered.ok() ? registered->worker_id : 0;
  }

  // Starts a join of `rank` of group `group` (world 2) by worker `id`;
  // returns where its answer lands.
  std::optional<absl::StatusOr<GroupView>>* Join(const std::string& group,
                                                 int rank, uint64_t id,
                                                 Device device = Cpu()) {
    answers_.emplace_back();
    auto* answer = &answers_.back();
    JoinRequest join;
    join.group = group;
    join.world_size = 2;
    join.rank = rank;
    join.worker_id = id;
    join.device = device;
    join.deadline = clock_.Now() + absl::Seconds(30);
    core_.Join(std::move(join),
               [answer](const absl::StatusOr<GroupView>& v) { *answer = v; });
    return answer;
  }

  // Runs a barrier of `rank` of `job`'s group "g" at `epoch`; returns where
  // its verdict lands.
  std::optional<absl::Status>* Barrier(const std::string& job, uint64_t epoch,
                                       int rank) {
    verdicts_.emplace_back();
    auto* verdict = &verdicts_.back();
    CollectiveCall call;
    call.job = job;
    call.group = "g";
    call.epoch = epoch;
    call.rank = rank;
    call.sequence = 1;
    call.spec.kind = CollectiveKind::kBarrier;
    call.deadline = clock_.Now() + absl::Seconds(30);
    core_.Collective(std::move(call),
                     [verdict](absl::StatusOr<CollectiveOutcome> outcome) {
                       *verdict = outcome.status();
                     });
    return verdict;
  }

  FakeClock clock_;
  Coordinator core_;
  std::deque<std::optional<absl::StatusOr<GroupView>>> answers_;
  std::deque<std::optional<absl::Status>> verdicts_;
};

TEST_F(CoordinatorJobsTest, Register_SameNameTwoJobs_TwoWorkers) {
  const uint64_t blue = Register("blue", "w0");
  const uint64_t red = Register("red", "w0");
  EXPECT_NE(blue, red);
  const std::vector<WorkerRecord> workers = core_.Workers();
  ASSERT_EQ(workers.size(), 2u);
  EXPECT_EQ(workers[0].registration.job, "blue");
  EXPECT_EQ(workers[1].registration.job, "red");
}

TEST_F(CoordinatorJobsTest, Join_SameGroupNameTwoJobs_TwoGroupsApart) {
  const uint64_t blue0 = Register("blue", "w0"), blue1 = Register("blue", "w1");
  const uint64_t red0 = Register("red", "w0"), red1 = Register("red", "w1");
  auto* b0 = Join("g", 0, blue0);
  auto* r1 = Join("g", 1, red1);
  // Neither job's rank completes the other's group.
  EXPECT_FALSE(b0->has_value());
  EXPECT_FALSE(r1->has_value());
  auto* b1 = Join("g", 1, blue1);
  auto* r0 = Join("g", 0, red0);
  ASSERT_TRUE(b0->has_value() && b1->has_value() && r0->has_value() &&
              r1->has_value());
  ASSERT_TRUE(b0->value().ok()) << b0->value().status();
  ASSERT_TRUE(r0->value().ok()) << r0->value().status();
  EXPECT_EQ(b0->value()->members[1].worker_id, blue1);
  EXPECT_EQ(r0->value()->members[1].worker_id, red1);

  const std::vector<GroupSummary> groups = core_.Groups();
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].job, "blue");
  EXPECT_EQ(groups[1].job, "red");

  // A call names its job: blue's barrier completes with blue's ranks only,
  // and red's rank 1 waits for red's rank 0.
  auto* first = Barrier("blue", b0->value()->epoch, 0);
  auto* red = Barrier("red", r0->value()->epoch, 1);
  EXPECT_FALSE(first->has_value());
  EXPECT_FALSE(red->has_value());
  auto* second = Barrier("blue", b0->value()->epoch, 1);
  ASSERT_TRUE(first->has_value() && second->has_value());
  EXPECT_TRUE(first->value().ok()) << first->value();
  EXPECT_TRUE(second->value().ok()) << second->value();
  EXPECT_FALSE(red->has_value());
}

TEST_F(CoordinatorJobsTest, Join_OtherJobRefused_FormationUnharmed) {
  const uint64_t blue0 = Register("blue", "w0"), blue1 = Register("blue", "w1");
  const uint64_t red1 = Register("red", "w1");
  auto* b0 = Join("g", 0, blue0);
  // Without jobs, this refusal would fail rank 0's join at once.
  auto* refused = Join("g", 1, red1, Vulkan());
  ASSERT_TRUE(refused->has_value());
  EXPECT_EQ(refused->value().status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_FALSE(b0->has_value());
  auto* b1 = Join("g", 1, blue1);
  ASSERT_TRUE(b0->has_value() && b1->has_value());
  EXPECT_TRUE(b0->value().ok()) << b0->value().status();
}

TEST_F(CoordinatorJobsTest, CallOfJobWithoutWorkers_NotFoundLikeUnknownGroup) {
  Register("blue", "w0");
  auto* verdict = Barrier("green", 1, 0);
  ASSERT_TRUE(verdict->has_value());
  EXPECT_EQ(verdict->value().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(verdict->value().message(), HasSubstr("unknown group \"g\""));
}

TEST_F(CoordinatorJobsTest, AuthorizeWorker_SameNameOtherJob_PermissionDenied) {
  const uint64_t blue = Register("blue", "w0");
  Register("red", "w0");
  EXPECT_TRUE(
      core_.AuthorizeWorker(Identity{Role::kWorker, "w0", "blue"}, blue).ok());
  const absl::Status other =
      core_.AuthorizeWorker(Identity{Role::kWorker, "w0", "red"}, blue);
  EXPECT_TRUE(absl::IsPermissionDenied(other)) << other;
  EXPECT_THAT(other.message(),
              HasSubstr("\"w0\" of job red may not act for worker"));
}

TEST_F(CoordinatorJobsTest, Deregister_OtherJobsGroupsGoOn) {
  const uint64_t blue0 = Register("blue", "w0"), blue1 = Register("blue", "w1");
  const uint64_t red0 = Register("red", "w0"), red1 = Register("red", "w1");
  Join("g", 0, blue0);
  auto* blue = Join("g", 1, blue1);
  Join("g", 0, red0);
  Join("g", 1, red1);
  ASSERT_TRUE(blue->has_value() && blue->value().ok());
  ASSERT_TRUE(core_.Deregister(red0, 1).ok());
  const std::vector<GroupSummary> groups = core_.Groups();
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_TRUE(groups[0].aborted.ok()) << groups[0].aborted;  // blue's
  EXPECT_FALSE(groups[1].aborted.ok());                      // red's
  HeartbeatReply reply;
  ASSERT_TRUE(core_.Heartbeat(blue0, 1, 0, &reply).ok());
  EXPECT_TRUE(reply.aborts.empty());
  ASSERT_TRUE(core_.Heartbeat(red1, 1, 0, &reply).ok());
  EXPECT_EQ(reply.aborts.size(), 1u);
}

}  // namespace
}  // namespace chorus
