// The leader plan end to end: a real coordinator run with --leader_calls
// and worker runtimes in this process. Small calls of every kind run at the
// group's rank-0 worker and say so; calls that differ get the coordinator's
// account on every rank, also when one rank's call went to the coordinator;
// a rank that never calls is named at the deadline on every rank that did
// (by the coordinator, which the callers then ask); thousands of leader
// calls then one the coordinator plans; and a group that is elastic, or a
// coordinator without the flag, keeps the coordinator's plans.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/collective_harness.h"

namespace chorus::test {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kShortTimeout = absl::Seconds(2);

// Ranks wait for each other at the leader as long as a loaded machine may
// need before a call goes to the coordinator instead.
const std::vector<std::string> kLeaderFlags = {"--leader_calls",
                                               "--leader_patience=10s"};

std::unique_ptr<EmbeddedCluster> StartLeaderCluster(
    int world, std::vector<std::string> flags = kLeaderFlags) {
  absl::StatusOr<std::unique_ptr<EmbeddedCluster>> cluster =
      EmbeddedCluster::Start(world, flags);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? *std::move(cluster) : nullptr;
}

// Each rank's result of `specs[r]` on rank r (one thread per rank), under
// `options`; a rank with no spec does not call.
std::vector<absl::StatusOr<CallResult>> RunEach(
    const std::vector<Communicator*>& ranks,
    const std::vector<std::optional<CollectiveSpec>>& specs,
    const std::vector<CallOptions>& options) {
  const int world = static_cast<int>(ranks.size());
  std::vector<absl::StatusOr<CallResult>> results(
      world, absl::UnknownError("not called"));
  RunOnRanks(world, [&](int r) {
    if (!specs[r].has_value()) return;
    CollectiveCase c;
    c.spec = *specs[r];
    std::string output;
    results[r] =
        ranks[r]->Run(*specs[r], MakeInput(c, world, r), &output, options[r]);
  });
  return results;
}

CallOptions Timeout(absl::Duration timeout) {
  CallOptions options;
  options.timeout = timeout;
  return options;
}

const CollectiveSpec kI32Sum =
    Spec(CollectiveKind::kAllReduce, DType::kI32, 33, ReduceOp::kSum);

TEST(LeaderPlanTest, Run_SmallCallsOfEveryKind_RunAtTheLeaderAndMatch) {
  for (int world : {1, 2, 3}) {
    SCOPED_TRACE(absl::StrCat("world ", world));
    std::unique_ptr<EmbeddedCluster> cluster = StartLeaderCluster(world);
    ASSERT_NE(cluster, nullptr);
    auto group = cluster->JoinGroup("small", world);
    ASSERT_TRUE(group.ok()) << group.status();
    CheckOptions check;
    check.leader_calls = true;
    uint64_t seed = 1;
    for (CollectiveKind kind : AllKinds()) {
      if (kind == CollectiveKind::kSync) continue;
      CollectiveCase c;
      c.spec = Spec(kind, DType::kF32, kind == CollectiveKind::kBarrier ? 0 : 9,
                    KindReduces(kind) ? ReduceOp::kSum : ReduceOp::kUnspecified,
                    world - 1);
      c.seed = seed++;
      EXPECT_TRUE(RunAndCheck(Pointers(*group), c, check));
    }
    // A forced plan and a large call still go to the coordinator.
    CollectiveCase ring;
    ring.spec = kI32Sum;
    ring.algorithm = Algorithm::kRing;
    EXPECT_TRUE(RunAndCheck(Pointers(*group), ring, check));
    CollectiveCase large;
    large.spec =
        Spec(CollectiveKind::kAllReduce, DType::kF32, 1 << 16, ReduceOp::kSum);
    EXPECT_TRUE(RunAndCheck(Pointers(*group), large, check));
  }
}

TEST(LeaderPlanTest, Run_ManyLeaderCallsThenAPlannedOne_CoordinatorCountsThem) {
  // More leader calls than the coordinator's window of outstanding
  // sequences (1,024): the planned call after them is not "from the future".
  std::unique_ptr<EmbeddedCluster> cluster = StartLeaderCluster(2);
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("many", 2);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<Communicator*> ranks = Pointers(*group);
  CheckOptions check;
  check.leader_calls = true;
  for (int i = 0; i < 1100; ++i) {
    const std::vector<absl::StatusOr<CallResult>> results =
        RunEach(ranks, {kI32Sum, kI32Sum},
                {Timeout(kCallTimeout), Timeout(kCallTimeout)});
    ASSERT_TRUE(results[0].ok() && results[1].ok())
        << "call " << i << ": " << results[0].status() << " / "
        << results[1].status();
    ASSERT_EQ(results[0]->algorithm, Algorithm::kLeader);
  }
  CollectiveCase ring;
  ring.spec = kI32Sum;
  ring.algorithm = Algorithm::kRing;
  EXPECT_TRUE(RunAndCheck(ranks, ring, check));
  CollectiveCase small;
  small.spec = kI32Sum;
  EXPECT_TRUE(RunAndCheck(ranks, small, check));
}

TEST(LeaderPlanTest, Run_CallsDiffer_InvalidArgumentWithAccountOnEveryRank) {
  std::unique_ptr<EmbeddedCluster> cluster = StartLeaderCluster(3);
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("mm", 3);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<Communicator*> ranks = Pointers(*group);
  CollectiveSpec other = kI32Sum;
  other.count = 34;
  const CallOptions options = Timeout(kCallTimeout);
  const std::vector<absl::StatusOr<CallResult>> results =
      RunEach(ranks, {kI32Sum, kI32Sum, other}, {options, options, options});
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r].status().code(), absl::StatusCode::kInvalidArgument)
        << results[r].status();
    EXPECT_THAT(results[r].status().message(),
                HasSubstr("collective #1 of group mm does not match across "
                          "ranks: ranks 0, 1: all_reduce i32[33] sum; rank 2: "
                          "all_reduce i32[34] sum"));
  }
  CollectiveCase c;
  c.spec = kI32Sum;
  CheckOptions check;
  check.leader_calls = true;
  EXPECT_TRUE(RunAndCheck(ranks, c, check));
}

TEST(LeaderPlanTest, Run_OneRankForcesAPlan_CoordinatorGivesTheAccount) {
  // Rank 0 (the leader) forces the ring and asks the coordinator; rank 1's
  // call goes to the leader, which never answers it, so rank 1 asks the
  // coordinator too, which matches the two.
  std::unique_ptr<EmbeddedCluster> cluster =
      StartLeaderCluster(2, {"--leader_calls"});
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("forced", 2);
  ASSERT_TRUE(group.ok()) << group.status();
  CallOptions ring = Timeout(absl::Seconds(30));
  ring.algorithm = Algorithm::kRing;
  const absl::Time start = absl::Now();
  const std::vector<absl::StatusOr<CallResult>> results = RunEach(
      Pointers(*group), {kI32Sum, kI32Sum}, {ring, Timeout(absl::Seconds(30))});
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].status().code(), absl::StatusCode::kInvalidArgument)
        << results[r].status();
    EXPECT_THAT(results[r].status().message(),
                HasSubstr("rank 0: all_reduce i32[33] sum algorithm ring; "
                          "rank 1: all_reduce i32[33] sum"));
  }
}

TEST(LeaderPlanTest, Run_RankNeverCalls_DeadlineNamingItThenLateRankToo) {
  std::unique_ptr<EmbeddedCluster> cluster = StartLeaderCluster(3);
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("late", 3);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<Communicator*> ranks = Pointers(*group);
  const CallOptions options = Timeout(kShortTimeout);
  const absl::Time start = absl::Now();
  const std::vector<absl::StatusOr<CallResult>> results = RunEach(
      ranks, {kI32Sum, kI32Sum, std::nullopt}, {options, options, options});
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, kShortTimeout / 2);
  EXPECT_LE(took, kShortTimeout + absl::Seconds(2));
  for (int r : {0, 1}) {
    EXPECT_EQ(results[r].status().code(), absl::StatusCode::kDeadlineExceeded)
        << results[r].status();
    EXPECT_THAT(results[r].status().message(),
                HasSubstr("rank 2 of group late did not reach all_reduce #1"));
  }
  // The late rank gets the same verdict at once; then the group goes on.
  const absl::Time late_at = absl::Now();
  std::string output;
  CollectiveCase c;
  c.spec = kI32Sum;
  absl::StatusOr<CallResult> late =
      ranks[2]->Run(kI32Sum, MakeInput(c, 3, 2), &output, options);
  EXPECT_LT(absl::Now() - late_at, absl::Seconds(1));
  EXPECT_THAT(late.status().message(),
              HasSubstr("rank 2 of group late did not reach all_reduce #1"));
  CheckOptions check;
  check.leader_calls = true;
  EXPECT_TRUE(RunAndCheck(ranks, c, check));
}

TEST(LeaderPlanTest, JoinGroup_ElasticOrWithoutTheFlag_CoordinatorPlansInline) {
  for (bool flag : {false, true}) {
    SCOPED_TRACE(flag ? "--leader_calls, elastic group" : "no flag");
    std::unique_ptr<EmbeddedCluster> cluster =
        StartLeaderCluster(2, flag ? kLeaderFlags : std::vector<std::string>{});
    ASSERT_NE(cluster, nullptr);
    std::vector<std::unique_ptr<Communicator>> group;
    if (flag) {
      JoinOptions join;
      join.min_world_size = 1;
      join.max_world_size = 2;
      std::vector<absl::StatusOr<std::unique_ptr<Communicator>>> joined(2);
      RunOnRanks(2, [&](int r) {
        joined[r] = Communicator::JoinEmbedded(cluster->worker(r), "elastic", 2,
                                               r, join);
      });
      for (auto& one : joined) {
        ASSERT_TRUE(one.ok()) << one.status();
        group.push_back(*std::move(one));
      }
    } else {
      auto joined = cluster->JoinGroup("plain", 2);
      ASSERT_TRUE(joined.ok()) << joined.status();
      group = *std::move(joined);
    }
    CollectiveCase c;
    c.spec = kI32Sum;
    EXPECT_TRUE(RunAndCheck(Pointers(group), c));
  }
}

}  // namespace
}  // namespace chorus::test
