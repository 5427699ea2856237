// The leader plan (RunLeaderCall), every rank a thread of this test over
// InProcessTransport: every kind, dtype and op against the reference in
// worlds of 1 to 5; calls that differ, a rank that never calls or calls
// late, a leader that never calls or calls after the members gave up (every
// rank that called goes to the coordinator); a lost member and an aborted
// group.
#include "server/worker/algorithms/leader_call.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/in_process_group.h"

namespace chorus::test {
namespace {

// RunLeaderCall as an AlgorithmFn, answering within a minute.
AlgorithmFn LeaderFn() {
  return [](const AlgorithmArgs& args, Algorithm* ran) {
    *ran = Algorithm::kLeader;
    LeaderCallArgs call;
    call.group = "g";
    call.epoch = 1;
    call.sequence = 1;
    call.spec = args.spec;
    call.input = args.input;
    call.output = args.output;
    call.transport = args.transport;
    call.patience_by = absl::Now() + absl::Seconds(50);
    call.grace_until = absl::Now() + absl::Seconds(55);
    absl::StatusOr<LeaderEnd> ended = RunLeaderCall(call);
    if (!ended.ok()) return ended.status();
    return *ended == LeaderEnd::kDone
               ? absl::OkStatus()
               : absl::InternalError("sent to the coordinator");
  };
}

class LeaderCallTest : public ::testing::TestWithParam<int> {};

TEST_P(LeaderCallTest, EveryKindTypeAndOp_MatchesReferenceOnEveryRank) {
  const int world = GetParam();
  uint64_t seed = 1;
  for (CollectiveKind kind : AllKinds()) {
    if (kind == CollectiveKind::kSync) continue;
    for (DType dtype : AllDTypes()) {
      const std::vector<ReduceOp> ops =
          KindReduces(kind) ? AllReduceOps()
                            : std::vector<ReduceOp>{ReduceOp::kUnspecified};
      for (ReduceOp op : ops) {
        CollectiveCase c;
        c.spec = Spec(kind, dtype, kind == CollectiveKind::kBarrier ? 0 : 5, op,
                      world - 1);
        c.seed = seed++;
        c.values = IsFloatDType(dtype) && op != ReduceOp::kSum &&
                           op != ReduceOp::kMin && op != ReduceOp::kMax
                       ? Values::kRounding
                       : Values::kExact;
        ASSERT_TRUE(
            RunAndCheckInProcess(LeaderFn(), c, world, Algorithm::kLeader, 64));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, LeaderCallTest, ::testing::Range(1, 6),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("world", info.param);
                         });

// How one rank calls in the tests below.
struct RankCall {
  CollectiveSpec spec =
      Spec(CollectiveKind::kAllReduce, DType::kI32, 2, ReduceOp::kSum);
  bool absent = false;
  // Waits before calling.
  absl::Duration delay;
  absl::Duration patience = absl::Seconds(20);
};

// Runs RunLeaderCall on every rank of `hub` as `calls` says; returns each
// rank's outcome (kDone for an absent rank).
std::vector<absl::StatusOr<LeaderEnd>> RunLeaderCalls(
    InProcessHub& hub, const std::vector<RankCall>& calls) {
  const int world = hub.world_size();
  std::vector<absl::StatusOr<LeaderEnd>> ends(world, LeaderEnd::kDone);
  RunOnRanks(world, [&](int rank) {
    const RankCall& mine = calls[rank];
    if (mine.absent) return;
    absl::SleepFor(mine.delay);
    const absl::Time start = absl::Now();
    InProcessTransport transport(&hub, rank, 1, start + mine.patience * 2);
    std::string input(InputBytes(mine.spec, world, rank), '\1');
    std::string output;
    LeaderCallArgs args;
    args.group = "g";
    args.epoch = 1;
    args.sequence = 1;
    args.spec = mine.spec;
    args.input = input;
    args.output = &output;
    args.transport = &transport;
    args.patience_by = start + mine.patience;
    args.grace_until = start + mine.patience * 2;
    ends[rank] = RunLeaderCall(args);
  });
  return ends;
}

MATCHER(AsksCoordinator, "") {
  return arg.ok() && *arg == LeaderEnd::kAskCoordinator;
}

TEST(LeaderCallEndTest, CallsDiffer_EveryRankAsksTheCoordinator) {
  InProcessHub hub("g", 3);
  std::vector<RankCall> calls(3);
  calls[2].spec.count = 3;
  for (const absl::StatusOr<LeaderEnd>& end : RunLeaderCalls(hub, calls)) {
    EXPECT_THAT(end, AsksCoordinator());
  }
}

TEST(LeaderCallEndTest, AllAgree_EveryRankDoneWithItsOutput) {
  InProcessHub hub("g", 4);
  std::vector<RankCall> calls(4);
  for (const absl::StatusOr<LeaderEnd>& end : RunLeaderCalls(hub, calls)) {
    ASSERT_TRUE(end.ok()) << end.status();
    EXPECT_EQ(*end, LeaderEnd::kDone);
  }
}

TEST(LeaderCallEndTest, RankNeverCalls_EveryCallerAsksTheCoordinator) {
  InProcessHub hub("g", 4);
  std::vector<RankCall> calls(4);
  for (RankCall& call : calls) call.patience = absl::Milliseconds(100);
  calls[2].absent = true;
  const std::vector<absl::StatusOr<LeaderEnd>> ends =
      RunLeaderCalls(hub, calls);
  for (int rank : {0, 1, 3}) {
    EXPECT_THAT(ends[rank], AsksCoordinator()) << "rank " << rank;
  }
  // When it comes, the late rank goes to the coordinator at once.
  for (RankCall& call : calls) call.absent = !call.absent;
  calls[2].patience = absl::Seconds(60);
  const absl::Time start = absl::Now();
  EXPECT_THAT(RunLeaderCalls(hub, calls)[2], AsksCoordinator());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(LeaderCallEndTest, LeaderNeverCalls_MembersAskTheCoordinator) {
  InProcessHub hub("g", 3);
  std::vector<RankCall> calls(3);
  for (RankCall& call : calls) call.patience = absl::Milliseconds(100);
  calls[0].absent = true;
  const std::vector<absl::StatusOr<LeaderEnd>> ends =
      RunLeaderCalls(hub, calls);
  EXPECT_THAT(ends[1], AsksCoordinator());
  EXPECT_THAT(ends[2], AsksCoordinator());
}

TEST(LeaderCallEndTest, LeaderCallsAfterMembersWithdrew_NoRankDoneThere) {
  InProcessHub hub("g", 3);
  std::vector<RankCall> calls(3);
  calls[1].patience = calls[2].patience = absl::Milliseconds(50);
  // Every call is there when the leader comes, but the members gave up.
  calls[0].delay = absl::Milliseconds(400);
  const std::vector<absl::StatusOr<LeaderEnd>> ends =
      RunLeaderCalls(hub, calls);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_THAT(ends[rank], AsksCoordinator()) << "rank " << rank;
  }
}

TEST(LeaderCallEndTest, MemberPatienceShort_LeaderStopsWaitingByIt) {
  // The leader would wait a minute; rank 1 only a little, and rank 2 never
  // calls: the leader sends both to the coordinator by rank 1's patience.
  InProcessHub hub("g", 3);
  std::vector<RankCall> calls(3);
  calls[0].patience = absl::Seconds(60);
  calls[1].patience = absl::Milliseconds(300);
  calls[2].absent = true;
  const absl::Time start = absl::Now();
  const std::vector<absl::StatusOr<LeaderEnd>> ends =
      RunLeaderCalls(hub, calls);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_THAT(ends[0], AsksCoordinator());
  EXPECT_THAT(ends[1], AsksCoordinator());
}

TEST(LeaderCallEndTest, MemberLost_LeaderFailsForTheRuntimeToReport) {
  InProcessHub hub("g", 3);
  hub.LosePeer(2);
  std::vector<RankCall> calls(3);
  calls[2].absent = true;
  const std::vector<absl::StatusOr<LeaderEnd>> ends =
      RunLeaderCalls(hub, calls);
  EXPECT_EQ(ends[0].status().code(), absl::StatusCode::kUnavailable)
      << ends[0].status();
}

TEST(LeaderCallEndTest, GroupAborted_EveryWaitingRankGetsTheAbort) {
  InProcessHub hub("g", 3);
  hub.Abort(absl::AbortedError("group g aborted"));
  std::vector<RankCall> calls(3);
  calls[2].absent = true;
  const std::vector<absl::StatusOr<LeaderEnd>> ends =
      RunLeaderCalls(hub, calls);
  for (int rank : {0, 1}) {
    EXPECT_EQ(ends[rank].status().code(), absl::StatusCode::kAborted);
  }
}

}  // namespace
}  // namespace chorus::test
