// The rules of elastic groups in the coordinator's group table, with a fake
// clock: a lost member revokes the epoch and the survivors go on at once
// (or wait for newcomers below the minimum); ranks follow into the next
// epoch, a dropped rank is told it was excluded; newcomers wait and a sync
// admits them; late calls of a revoked epoch change nothing.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_detail.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/group_table.h"
#include "tests/testing/fake_clock.h"

namespace chorus {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kWorkers = 8;

// The last result a callback got, and how often it ran.
template <typename T>
struct Result {
  int calls = 0;
  std::optional<absl::StatusOr<T>> value;

  std::function<void(absl::StatusOr<T>)> Callback() {
    return [this](absl::StatusOr<T> result) {
      ++calls;
      value = std::move(result);
    };
  }
  absl::Status status() const {
    return value ? value->status() : absl::UnknownError("not done");
  }
  const T& operator*() const { return **value; }
  const T* operator->() const { return &**value; }
};

using JoinResult = Result<GroupView>;
using CallResult = Result<CollectiveOutcome>;

CollectiveSpec Kind(CollectiveKind kind) {
  CollectiveSpec spec;
  spec.kind = kind;
  return spec;
}

// An all_reduce of 4 MiB, planned on the data plane: its ranks commit.
CollectiveSpec Large() {
  CollectiveSpec spec;
  spec.kind = CollectiveKind::kAllReduce;
  spec.dtype = DType::kF32;
  spec.count = 1 << 20;
  spec.op = ReduceOp::kSum;
  return spec;
}

std::vector<int> NextRanks(const absl::Status& status) {
  std::optional<v1::ErrorDetail> detail = ErrorDetailOf(status);
  if (!detail.has_value()) return {};
  return std::vector<int>(detail->next_ranks().begin(),
                          detail->next_ranks().end());
}

class GroupElasticTest : public ::testing::Test {
 protected:
  GroupElasticTest() : registry_(&clock_, absl::Hours(1)) {
    for (int i = 0; i < kWorkers; ++i) {
      WorkerRegistration r;
      r.name = absl::StrCat("w", i);
      r.host = absl::StrCat("host-", i);
      r.address = absl::StrCat("10.0.0.", i, ":7100");
      r.incarnation = 1;
      r.devices.resize(1);
      r.devices[0].kind = DeviceKind::kCpu;
      workers_.push_back(registry_.Register(r)->worker_id);
    }
    GroupTableOptions options;
    options.max_world_size = 16;
    table_ = std::make_unique<GroupTable>(&clock_, &registry_, options);
  }

  // A join of `rank` of "g" by worker w<worker> (w<rank> when -1).
  JoinRequest Req(int world, int rank, int min, int max = 0, int worker = -1,
                  absl::Duration timeout = absl::InfiniteDuration()) {
    JoinRequest request;
    request.group = "g";
    request.world_size = world;
    request.rank = rank;
    request.min_world_size = min;
    request.max_world_size = max;
    request.worker_id = workers_[worker < 0 ? rank : worker];
    request.device.kind = DeviceKind::kCpu;
    request.deadline = timeout == absl::InfiniteDuration()
                           ? absl::InfiniteFuture()
                           : clock_.Now() + timeout;
    return request;
  }

  // Forms "g" with `world` ranks on workers w0.. and the given bounds.
  GroupView Form(int world, int min, int max = 0) {
    std::vector<JoinResult> joined(world);
    for (int rank = 0; rank < world; ++rank) {
      table_->Join(Req(world, rank, min, max), joined[rank].Callback());
    }
    EXPECT_TRUE(joined[0].status().ok()) << joined[0].status();
    return *joined[0];
  }

  // A newcomer on worker w<worker>.
  void Newcomer(int worker, JoinResult* result,
                absl::Duration timeout = absl::InfiniteDuration()) {
    JoinRequest request = Req(1, 0, 0, 0, worker, timeout);
    request.world_size = 0;
    request.newcomer = true;
    table_->Join(request, result->Callback());
  }

  // Rank `rank` of `epoch` follows the group into the next epoch.
  void Follow(uint64_t epoch, int rank, int worker, JoinResult* result) {
    JoinRequest request = Req(0, rank, 0, 0, worker);
    request.follow_epoch = epoch;
    table_->Join(request, result->Callback());
  }

  void Call(const GroupView& view, int rank, uint64_t sequence,
            const CollectiveSpec& spec, CallResult* result) {
    CollectiveCall call;
    call.group = view.name;
    call.epoch = view.epoch;
    call.rank = rank;
    call.sequence = sequence;
    call.spec = spec;
    table_->Collective(call, result->Callback());
  }

  // Every rank of `view` calls `spec` as call `sequence`.
  std::vector<CallResult> All(const GroupView& view, uint64_t sequence,
                              const CollectiveSpec& spec) {
    std::vector<CallResult> results(view.world_size);
    for (int rank = 0; rank < view.world_size; ++rank) {
      Call(view, rank, sequence, spec, &results[rank]);
    }
    return results;
  }

  // The group as List() shows it.
  GroupSummary Summary() {
    std::vector<GroupSummary> groups = table_->List();
    EXPECT_EQ(groups.size(), 1u);
    return groups.empty() ? GroupSummary() : groups[0];
  }

  FakeClock clock_;
  Registry registry_;
  std::vector<uint64_t> workers_;
  std::unique_ptr<GroupTable> table_;
};

TEST_F(GroupElasticTest, Join_BoundsDisagreeOrOutOfRange_InvalidArgument) {
  JoinResult first, second, bad;
  table_->Join(Req(3, 0, 2), first.Callback());
  table_->Join(Req(3, 1, 1), second.Callback());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kInvalidArgument);
  table_->Join(Req(3, 2, 4), bad.Callback());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(first.calls, 0);
}

TEST_F(GroupElasticTest, AbortWorker_Elastic_SurvivorsFormNextEpochAtOnce) {
  const GroupView view = Form(4, 2);
  CallResult pending;
  Call(view, 0, 1, Kind(CollectiveKind::kBarrier), &pending);
  table_->AbortWorker(workers_[2], "w2", "lease expired");

  ASSERT_EQ(pending.status().code(), absl::StatusCode::kAborted);
  std::optional<v1::ErrorDetail> detail = ErrorDetailOf(pending.status());
  ASSERT_TRUE(detail.has_value());
  EXPECT_EQ(detail->reason(), "MEMBERSHIP_CHANGED");
  EXPECT_THAT(detail->lost_ranks(), ElementsAre(2));
  EXPECT_EQ(detail->lost_worker(), "w2");
  EXPECT_EQ(detail->next_world_size(), 3);
  EXPECT_THAT(NextRanks(pending.status()), ElementsAre(0, 1, -1, 2));
  const GroupSummary now = Summary();
  EXPECT_EQ(now.view.epoch, detail->next_epoch());
  ASSERT_EQ(now.view.world_size, 3);
  EXPECT_EQ(now.view.members[2].worker_name, "w3");
  EXPECT_TRUE(now.aborted.ok());

  // A late call of the old epoch gets the same revocation.
  CallResult late;
  Call(view, 1, 1, Kind(CollectiveKind::kBarrier), &late);
  EXPECT_EQ(late.status(), pending.status());
}

TEST_F(GroupElasticTest, Follow_SurvivorAndDroppedRank_NewRankOrExcluded) {
  const GroupView view = Form(3, 2);
  table_->AbortWorker(workers_[0], "w0", "deregistered");
  JoinResult survivor, dropped;
  Follow(view.epoch, 2, 2, &survivor);
  ASSERT_TRUE(survivor.status().ok()) << survivor.status();
  EXPECT_EQ(survivor->rank, 1);
  EXPECT_EQ(survivor->world_size, 2);
  EXPECT_EQ(survivor->min_world_size, 2);
  Follow(view.epoch, 0, 0, &dropped);
  EXPECT_EQ(dropped.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ErrorDetailOf(dropped.status())->reason(), "RANK_EXCLUDED");
  EXPECT_THAT(dropped.status().message(), HasSubstr("declared lost"));
}

TEST_F(GroupElasticTest, Follow_TwoLossesInARow_FollowsTheChain) {
  const GroupView view = Form(4, 2);
  table_->AbortWorker(workers_[0], "w0", "lost");
  table_->AbortWorker(workers_[2], "w2", "lost");
  JoinResult follower;
  Follow(view.epoch, 3, 3, &follower);
  ASSERT_TRUE(follower.status().ok()) << follower.status();
  EXPECT_EQ(follower->world_size, 2);
  EXPECT_EQ(follower->rank, 1);
  EXPECT_EQ(follower->epoch, Summary().view.epoch);
}

TEST_F(GroupElasticTest, ReportFailure_NamesLostRanks_ShrinksWithoutThem) {
  const GroupView view = Form(3, 1);
  // A ring is decided; rank 0 commits, then rank 1 finds rank 2 gone.
  std::vector<CallResult> decided = All(view, 1, Large());
  ASSERT_TRUE(decided[0].status().ok()) << decided[0].status();
  absl::Status committed = absl::UnknownError("not done");
  CommitCall commit;
  commit.group = "g";
  commit.epoch = view.epoch;
  commit.rank = 0;
  commit.sequence = 1;
  table_->Commit(commit, [&](absl::Status s) { committed = s; });
  const absl::Status verdict = table_->ReportFailure(
      "g", view.epoch, 1, 1, absl::UnavailableError("rank 2 is gone"), {2});
  EXPECT_EQ(verdict.code(), absl::StatusCode::kAborted);
  // No rank's commit succeeds: rank 0's ends with the revocation too.
  EXPECT_EQ(committed, verdict);
  EXPECT_THAT(NextRanks(verdict), ElementsAre(0, 1, -1));
  EXPECT_EQ(Summary().view.world_size, 2);
  // The old epoch's late messages change nothing.
  EXPECT_EQ(table_->ReportFailure("g", view.epoch, 0, 2,
                                  absl::UnavailableError("late"), {1}),
            verdict);
  EXPECT_EQ(Summary().view.world_size, 2);
}

TEST_F(GroupElasticTest, ReportFailure_Leaving_RankLeavesOthersGoOn) {
  const GroupView view = Form(2, 1);
  const absl::Status verdict =
      table_->ReportFailure("g", view.epoch, 1, 0, absl::OkStatus(), {}, true);
  EXPECT_THAT(verdict.message(), HasSubstr("rank 1 left the group"));
  EXPECT_EQ(Summary().view.world_size, 1);
}

TEST_F(GroupElasticTest, Revoke_BelowMinimum_WaitsThenFormsWithNewcomer) {
  const GroupView view = Form(3, 3);
  table_->AbortWorker(workers_[1], "w1", "lost");
  JoinResult follower;
  Follow(view.epoch, 2, 2, &follower);
  EXPECT_EQ(follower.calls, 0);  // below the minimum: it waits
  JoinResult newcomer;
  Newcomer(5, &newcomer);
  ASSERT_TRUE(follower.status().ok()) << follower.status();
  ASSERT_TRUE(newcomer.status().ok()) << newcomer.status();
  EXPECT_EQ(follower->rank, 1);
  EXPECT_EQ(newcomer->rank, 2);
  EXPECT_EQ(newcomer->members[2].worker_name, "w5");
  // Rank 0 follows after the group formed.
  JoinResult late;
  Follow(view.epoch, 0, 0, &late);
  ASSERT_TRUE(late.status().ok()) << late.status();
  EXPECT_EQ(late->epoch, newcomer->epoch);
  EXPECT_EQ(late->rank, 0);
}

TEST_F(GroupElasticTest, Revoke_BelowMinimumPastDeadline_SaysWhatIsMissing) {
  const GroupView view = Form(2, 2);
  table_->AbortWorker(workers_[1], "w1", "lost");
  JoinRequest follow = Req(0, 0, 0, 0, 0, absl::Seconds(5));
  follow.follow_epoch = view.epoch;
  JoinResult follower;
  table_->Join(follow, follower.Callback());
  clock_.Advance(absl::Seconds(6));
  table_->ExpireDeadlines();
  EXPECT_EQ(follower.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(follower.status().message(),
              HasSubstr("below its minimum of 2 ranks: 1 newcomer missing"));
}

TEST_F(GroupElasticTest, Sync_NoNewcomer_PlainBarrierSameEpoch) {
  const GroupView view = Form(2, 1);
  std::vector<CallResult> synced = All(view, 1, Kind(CollectiveKind::kSync));
  ASSERT_TRUE(synced[0].status().ok()) << synced[0].status();
  EXPECT_EQ(synced[0]->next, nullptr);
  EXPECT_EQ(Summary().view.epoch, view.epoch);
}

TEST_F(GroupElasticTest, Sync_NewcomerWaiting_AdmittedAfterTheMembers) {
  const GroupView view = Form(2, 1);
  JoinResult newcomer;
  Newcomer(4, &newcomer);
  EXPECT_EQ(newcomer.calls, 0);
  EXPECT_EQ(Summary().joiners_waiting, 1);
  // Every verdict says how many wait.
  std::vector<CallResult> barrier =
      All(view, 1, Kind(CollectiveKind::kBarrier));
  EXPECT_EQ(barrier[1]->joiners_waiting, 1);
  std::vector<CallResult> synced = All(view, 2, Kind(CollectiveKind::kSync));
  ASSERT_TRUE(synced[0].status().ok()) << synced[0].status();
  ASSERT_NE(synced[1]->next, nullptr);
  const GroupView& next = *synced[1]->next;
  EXPECT_EQ(synced[1]->joiners_waiting, 0);  // after the admission
  EXPECT_EQ(next.world_size, 3);
  EXPECT_EQ(next.members[1].worker_name, "w1");
  EXPECT_EQ(next.members[2].worker_name, "w4");
  ASSERT_TRUE(newcomer.status().ok()) << newcomer.status();
  EXPECT_EQ(newcomer->rank, 2);
  EXPECT_EQ(newcomer->epoch, next.epoch);
  EXPECT_EQ(Summary().view.epoch, next.epoch);
}

TEST_F(GroupElasticTest, Sync_AtMaximum_AdmitsOnlyTheRoomLeft) {
  const GroupView view = Form(2, 1, 3);
  JoinResult first, second;
  Newcomer(4, &first);
  Newcomer(5, &second);
  std::vector<CallResult> synced = All(view, 1, Kind(CollectiveKind::kSync));
  ASSERT_NE(synced[0]->next, nullptr);
  EXPECT_EQ(synced[0]->next->world_size, 3);
  EXPECT_EQ(synced[0]->joiners_waiting, 1);
  EXPECT_TRUE(first.status().ok());
  EXPECT_EQ(second.calls, 0);
  EXPECT_EQ(Summary().joiners_waiting, 1);
}

TEST_F(GroupElasticTest, Sync_LossWhileMembersWait_AbortsSyncNewcomerWaits) {
  const GroupView view = Form(3, 2);
  JoinResult newcomer;
  Newcomer(5, &newcomer);
  CallResult sync0, sync1;
  Call(view, 0, 1, Kind(CollectiveKind::kSync), &sync0);
  Call(view, 1, 1, Kind(CollectiveKind::kSync), &sync1);
  table_->AbortWorker(workers_[2], "w2", "lost");
  EXPECT_EQ(sync0.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(sync1.status(), sync0.status());
  EXPECT_EQ(newcomer.calls, 0);
  EXPECT_EQ(Summary().joiners_waiting, 1);
  EXPECT_EQ(Summary().view.world_size, 2);
}

TEST_F(GroupElasticTest, Sync_NewcomerWithdrawn_NotAdmittedNothingChanges) {
  const GroupView view = Form(2, 1);
  bool gone = false;
  JoinRequest request = Req(1, 0, 0, 0, 4);
  request.world_size = 0;
  request.newcomer = true;
  request.withdrawn = [&gone] { return gone; };
  JoinResult newcomer;
  table_->Join(request, newcomer.Callback());
  EXPECT_EQ(Summary().joiners_waiting, 1);
  gone = true;  // its worker cancelled the join: its caller went away
  EXPECT_EQ(Summary().joiners_waiting, 0);
  std::vector<CallResult> synced = All(view, 1, Kind(CollectiveKind::kSync));
  ASSERT_TRUE(synced[0].status().ok()) << synced[0].status();
  EXPECT_EQ(synced[0]->next, nullptr);
  EXPECT_EQ(newcomer.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(Summary().view.epoch, view.epoch);
}

TEST_F(GroupElasticTest, Newcomer_GroupNotElastic_FailedPrecondition) {
  Form(2, 0);
  JoinResult newcomer;
  Newcomer(4, &newcomer);
  EXPECT_EQ(newcomer.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(GroupElasticTest, Newcomer_ItsWorkerLost_LeavesChangingNothing) {
  const GroupView view = Form(2, 1);
  JoinResult newcomer;
  Newcomer(4, &newcomer);
  table_->AbortWorker(workers_[4], "w4", "lost");
  EXPECT_EQ(newcomer.status().code(), absl::StatusCode::kAborted);
  const GroupSummary now = Summary();
  EXPECT_EQ(now.view.epoch, view.epoch);
  EXPECT_EQ(now.joiners_waiting, 0);
  EXPECT_TRUE(now.aborted.ok());
}

TEST_F(GroupElasticTest, ExpireCommits_RankNeverCommits_ItLeavesOthersGoOn) {
  const GroupView view = Form(2, 1);
  std::vector<CallResult> decided(2);
  for (int rank = 0; rank < 2; ++rank) {
    CollectiveCall call;
    call.group = "g";
    call.epoch = view.epoch;
    call.rank = rank;
    call.sequence = 1;
    call.spec = Large();
    table_->Collective(call, decided[rank].Callback());
  }
  ASSERT_TRUE(decided[0].status().ok());
  absl::Status committed = absl::UnknownError("not done");
  CommitCall commit;
  commit.group = "g";
  commit.epoch = view.epoch;
  commit.rank = 0;
  commit.sequence = 1;
  commit.deadline = clock_.Now() + absl::Seconds(1);
  table_->Commit(commit, [&](absl::Status s) { committed = s; });
  clock_.Advance(absl::Seconds(2));
  table_->ExpireDeadlines();
  EXPECT_EQ(committed.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(NextRanks(committed), ElementsAre(0, -1));
  EXPECT_EQ(Summary().view.world_size, 1);
}

TEST_F(GroupElasticTest, Trace_LossAndAdmission_EachEpochChangeIsAnEntry) {
  const GroupView view = Form(3, 1);
  CallResult pending;
  Call(view, 0, 1, Kind(CollectiveKind::kBarrier), &pending);
  table_->AbortWorker(workers_[2], "w2", "lease expired");
  const GroupView shrunk = Summary().view;
  JoinResult newcomer;
  Newcomer(5, &newcomer);
  std::vector<CallResult> synced = All(shrunk, 1, Kind(CollectiveKind::kSync));
  ASSERT_TRUE(newcomer.status().ok()) << newcomer.status();

  std::vector<TraceEntry> trace = table_->Trace("g");
  std::vector<const TraceEntry*> changes;
  for (const TraceEntry& entry : trace) {
    if (entry.state == TraceEntry::State::kMembershipChanged) {
      changes.push_back(&entry);
    }
  }
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0]->epoch, view.epoch);
  EXPECT_EQ(changes[0]->sequence, 0u);
  EXPECT_EQ(changes[0]->verdict.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(changes[0]->verdict.message(), HasSubstr("rank 2 left"));
  EXPECT_EQ(changes[0]->ended, clock_.Now());
  EXPECT_EQ(changes[1]->epoch, shrunk.epoch);
  EXPECT_THAT(changes[1]->verdict.message(), HasSubstr("admitted 1 newcomer"));
  // The barrier the loss ended is recorded as failed, before the change.
  EXPECT_EQ(pending.status(), changes[0]->verdict);
  EXPECT_EQ(trace.front().state, TraceEntry::State::kFailed);
  EXPECT_LT(trace.front().record_id, changes[0]->record_id);
}

}  // namespace
}  // namespace chorus
