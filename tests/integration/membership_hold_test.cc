// WorkerLocal.HoldMembership against real daemons: a client whose hold ends
// without a release (its process died) is reported gone by its worker, and
// the other ranks' calls end at once with ABORTED naming the rank; a
// released hold changes nothing; a hold on a membership the worker does
// not have is refused.
#include <grpcpp/client_context.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "chorus/v1/worker.grpc.pb.h"
#include "common/net.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemons.h"
#include "tests/testing/local_calls.h"
#include "tests/testing/process.h"
#include "tests/testing/wait.h"

namespace chorus::test {
namespace {

using ::testing::HasSubstr;

// Far longer than the abort takes: the bound below is what is checked.
constexpr absl::Duration kCallTimeout = absl::Seconds(30);
// How soon the other rank must hear of the gone rank.
constexpr absl::Duration kGoneBound = absl::Seconds(5);

class MembershipHoldTest : public ::testing::Test {
 protected:
  // A coordinator and one worker; ranks 0 and 1 of `group` joined through
  // it.
  void Start(const std::string& group) {
    ASSERT_NO_FATAL_FAILURE(StartDaemons(group));
    ASSERT_NO_FATAL_FAILURE(JoinRanks({0, 1}));
  }

  // A coordinator and one worker, for ranks of `group`.
  void StartDaemons(const std::string& group) {
    group_ = group;
    absl::StatusOr<Daemon> coordinator = StartCoordinator();
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    absl::StatusOr<Daemon> worker =
        StartWorker(coordinator_.address, {"--name=hold-w"});
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = *std::move(worker);
    stub_ =
        v1::WorkerLocal::NewStub(MakeChannel(worker_.address, Role::kWorker));
  }

  // Joins `ranks` of the group (of two) through the worker at once.
  void JoinRanks(const std::vector<int>& ranks) {
    grpc::Status joined[2];
    uint64_t epochs[2] = {0, 0};
    std::vector<std::thread> threads;
    for (int r : ranks) {
      threads.emplace_back([this, r, &joined, &epochs] {
        grpc::ClientContext context;
        context.set_deadline(DeadlineAfter(kCallTimeout));
        v1::LocalJoinRequest request;
        request.set_group(group_);
        request.set_world_size(2);
        request.set_rank(r);
        v1::LocalJoinResponse response;
        joined[r] = stub_->JoinGroup(&context, request, &response);
        epochs[r] = response.epoch();
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r : ranks) {
      ASSERT_TRUE(joined[r].ok()) << r << ": " << joined[r].error_message();
      epoch_ = epochs[r];
    }
  }

  v1::MembershipHold Hold(int rank) const {
    v1::MembershipHold hold;
    hold.set_group(group_);
    hold.set_epoch(epoch_);
    hold.set_rank(rank);
    return hold;
  }

  // Rank `rank`'s all_reduce of one u32 as its call #`sequence`.
  grpc::Status AllReduce(int rank, uint64_t sequence,
                         v1::LocalCollectiveResponse* response) {
    const v1::LocalCollectiveRequest call =
        OneU32AllReduce(group_, epoch_, rank, sequence);
    grpc::ClientContext context;
    context.set_deadline(DeadlineAfter(kCallTimeout));
    return stub_->Collective(&context, call, response);
  }

  Daemon coordinator_;
  Daemon worker_;
  std::unique_ptr<v1::WorkerLocal::Stub> stub_;
  std::string group_;
  uint64_t epoch_ = 0;
};

TEST_F(MembershipHoldTest, HoldEndsWithoutRelease_OtherRankAbortedNamingIt) {
  ASSERT_NO_FATAL_FAILURE(Start("hold-gone"));
  grpc::ClientContext hold_context;
  v1::MembershipHoldReply reply;
  std::unique_ptr<grpc::ClientWriter<v1::MembershipHold>> hold =
      stub_->HoldMembership(&hold_context, &reply);
  ASSERT_TRUE(hold->Write(Hold(1)));

  // Rank 0 waits in its call for rank 1, which never comes: its process
  // "dies" (the hold's stream is cut without a release).
  grpc::Status waited;
  absl::Time ended;
  std::thread rank0([&] {
    v1::LocalCollectiveResponse response;
    waited = AllReduce(0, 1, &response);
    ended = absl::Now();
  });
  // Usually rank 0 is waiting by now; if not, its call meets the abort.
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time cut = absl::Now();
  hold_context.TryCancel();
  rank0.join();
  hold->Finish().IgnoreError();

  EXPECT_EQ(waited.error_code(), grpc::StatusCode::ABORTED)
      << waited.error_message();
  EXPECT_THAT(waited.error_message(), HasSubstr("rank 1 is gone"));
  EXPECT_THAT(waited.error_message(),
              HasSubstr("client process went away (its hold on the local API "
                        "of worker hold-w"));
  EXPECT_LT(ended - cut, kGoneBound);
}

// chorusctl holds its rank through the C++ client: killed while its call
// waits for rank 0, its worker reports it gone, and rank 0's next call that
// needs rank 1 is aborted naming it instead of waiting out its deadline.
TEST_F(MembershipHoldTest, ChorusctlRankKilled_OtherRankAbortedNamingIt) {
  ASSERT_NO_FATAL_FAILURE(StartDaemons("hold-ctl"));
  SubprocessOptions options;
  options.binary = ChorusctlBinary();
  options.args = {absl::StrCat("--worker=", worker_.address),
                  "--group=hold-ctl",
                  "--world=2",
                  "--rank=1",
                  "--timeout=30s",
                  "--dtype=u32",
                  "allreduce",
                  "--",
                  "1"};
  options.stdout_path = NewScratchPath("chorusctl", ".out");
  absl::StatusOr<std::unique_ptr<Subprocess>> chorusctl =
      Subprocess::Start(options);
  ASSERT_TRUE(chorusctl.ok()) << chorusctl.status();
  ASSERT_NO_FATAL_FAILURE(JoinRanks({0}));
  // Rank 1's call #1 waits for rank 0 at the coordinator.
  auto coordinator = NewCoordinatorStub(coordinator_.address);
  ASSERT_TRUE(WaitUntil(
      [&] {
        grpc::ClientContext context;
        context.set_deadline(DeadlineAfter(kRpcTimeout));
        v1::ListGroupsResponse groups;
        if (!coordinator->ListGroups(&context, v1::ListGroupsRequest(), &groups)
                 .ok()) {
          return false;
        }
        for (const v1::GroupInfo& g : groups.groups()) {
          if (g.name() == "hold-ctl" && g.pending_sequence() == 1 &&
              g.missing_ranks_size() == 1 && g.missing_ranks(0) == 0) {
            return true;
          }
        }
        return false;
      },
      kCallTimeout))
      << "chorusctl's call never reached the coordinator";
  ASSERT_TRUE((*chorusctl)->Kill().ok());
  const absl::Time killed = absl::Now();

  // Call #1 has rank 1's input at the coordinator already and may still
  // complete; rank 1 never makes #2.
  v1::LocalCollectiveResponse response;
  grpc::Status status = AllReduce(0, 1, &response);
  if (status.ok()) status = AllReduce(0, 2, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ABORTED)
      << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("rank 1 is gone"));
  EXPECT_THAT(status.error_message(), HasSubstr("client process went away"));
  EXPECT_LT(absl::Now() - killed, kGoneBound);
}

TEST_F(MembershipHoldTest, HoldReleased_RankForgottenGroupNotAborted) {
  ASSERT_NO_FATAL_FAILURE(Start("hold-released"));
  {
    grpc::ClientContext hold_context;
    v1::MembershipHoldReply reply;
    std::unique_ptr<grpc::ClientWriter<v1::MembershipHold>> hold =
        stub_->HoldMembership(&hold_context, &reply);
    ASSERT_TRUE(hold->Write(Hold(1)));
    v1::MembershipHold release;
    release.set_release(true);
    hold->Write(release);
    hold->WritesDone();
    const grpc::Status finished = hold->Finish();
    EXPECT_TRUE(finished.ok()) << finished.error_message();
  }
  // The daemon keeps only live memberships: rank 1 left.
  v1::LocalCollectiveResponse response;
  const grpc::Status after = AllReduce(1, 1, &response);
  EXPECT_EQ(after.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << after.error_message();
  EXPECT_THAT(after.error_message(), HasSubstr("join first"));
  // Leaving on purpose is not a failure: the group epoch is not aborted.
  std::unique_ptr<v1::Coordinator::Stub> admin =
      NewCoordinatorStub(coordinator_.address);
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(kRpcTimeout));
  v1::ListGroupsResponse groups;
  ASSERT_TRUE(
      admin->ListGroups(&context, v1::ListGroupsRequest(), &groups).ok());
  ASSERT_EQ(groups.groups_size(), 1);
  EXPECT_FALSE(groups.groups(0).has_aborted());
}

TEST_F(MembershipHoldTest, HoldOnUnjoinedRank_FailedPrecondition) {
  ASSERT_NO_FATAL_FAILURE(Start("hold-unjoined"));
  grpc::ClientContext hold_context;
  hold_context.set_deadline(DeadlineAfter(kCallTimeout));
  v1::MembershipHoldReply reply;
  std::unique_ptr<grpc::ClientWriter<v1::MembershipHold>> hold =
      stub_->HoldMembership(&hold_context, &reply);
  v1::MembershipHold wrong = Hold(1);
  wrong.set_epoch(epoch_ + 1);
  hold->Write(wrong);
  hold->WritesDone();
  const grpc::Status finished = hold->Finish();
  EXPECT_EQ(finished.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(finished.error_message(),
              HasSubstr("has not joined group hold-unjoined as rank 1"));
}

}  // namespace
}  // namespace chorus::test
