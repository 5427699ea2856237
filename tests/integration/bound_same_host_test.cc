// Same-host all-reduces repeated without the coordinator, end to end: a
// real coordinator and worker runtimes in this process (results unchecked,
// as by default, so the calls may skip the commit). Once a shape ran
// same_host, its later calls run on the kept segments, so they complete
// even while the coordinator process is stopped; calls that differ get the
// coordinator's account on every rank; a rank that never calls is named at
// the deadline on every rank that did; thousands of such calls, then one the
// coordinator plans, are counted; and with checked results every call still
// asks the coordinator.
#include <signal.h>

#include <optional>
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

// 80,000 bytes: above the planner's 32 KiB, so planned same_host.
const CollectiveSpec kF32Sum =
    Spec(CollectiveKind::kAllReduce, DType::kF32, 20000, ReduceOp::kSum);

std::unique_ptr<EmbeddedCluster> StartUnchecked(int workers) {
  absl::StatusOr<std::unique_ptr<EmbeddedCluster>> cluster =
      EmbeddedCluster::Start(workers, {}, EmbeddedCluster::CallRoute::kCallPort,
                             {JoinOptions::CpuDevice()}, nullptr,
                             /*check_results=*/false);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? *std::move(cluster) : nullptr;
}

// Each rank's result of `specs[r]` on rank r (one thread per rank), seed
// `seed`; a rank with no spec does not call. Outputs are checked against
// the reference where the call succeeded.
std::vector<absl::StatusOr<CallResult>> RunEach(
    const std::vector<Communicator*>& ranks,
    const std::vector<std::optional<CollectiveSpec>>& specs, uint64_t seed,
    absl::Duration timeout = kCallTimeout) {
  const int world = static_cast<int>(ranks.size());
  std::vector<absl::StatusOr<CallResult>> results(
      world, absl::UnknownError("not called"));
  RunOnRanks(world, [&](int r) {
    if (!specs[r].has_value()) return;
    CollectiveCase c;
    c.spec = *specs[r];
    c.seed = seed;
    std::string output;
    CallOptions options;
    options.timeout = timeout;
    results[r] =
        ranks[r]->Run(*specs[r], MakeInput(c, world, r), &output, options);
    if (results[r].ok()) {
      std::vector<std::string> inputs;
      for (int q = 0; q < world; ++q) inputs.push_back(MakeInput(c, world, q));
      EXPECT_TRUE(MatchesExpected(c, Reference(c, world, inputs)[r], output))
          << "rank " << r;
    }
  });
  return results;
}

// Runs kF32Sum on every rank and expects it ran same_host everywhere.
void ExpectSameHostEverywhere(const std::vector<Communicator*>& ranks,
                              uint64_t seed) {
  const int world = static_cast<int>(ranks.size());
  std::vector<std::optional<CollectiveSpec>> specs(world, kF32Sum);
  const std::vector<absl::StatusOr<CallResult>> results =
      RunEach(ranks, specs, seed);
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    EXPECT_EQ(results[r]->algorithm, Algorithm::kSameHost) << "rank " << r;
  }
}

TEST(BoundSameHostTest, Run_CoordinatorStopped_RepeatedCallsStillComplete) {
  std::unique_ptr<EmbeddedCluster> cluster = StartUnchecked(3);
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("bound", 3);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<Communicator*> ranks = Pointers(*group);
  ExpectSameHostEverywhere(ranks, 1);
  ASSERT_TRUE(cluster->SignalCoordinator(SIGSTOP).ok());
  for (uint64_t call = 2; call < 12; ++call) {
    ExpectSameHostEverywhere(ranks, call);
  }
  ASSERT_TRUE(cluster->SignalCoordinator(SIGCONT).ok());
  // Another shape asks the coordinator, which counted the calls it missed.
  CollectiveSpec other = kF32Sum;
  other.count = 30000;
  const std::vector<absl::StatusOr<CallResult>> results =
      RunEach(ranks, {other, other, other}, 12);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
  }
}

// Each rank's plan of `spec` run once on every rank (which must succeed).
std::vector<Algorithm> PlansOf(const std::vector<Communicator*>& ranks,
                               const CollectiveSpec& spec, uint64_t seed) {
  const int world = static_cast<int>(ranks.size());
  const std::vector<absl::StatusOr<CallResult>> results = RunEach(
      ranks, std::vector<std::optional<CollectiveSpec>>(world, spec), seed);
  std::vector<Algorithm> plans;
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    plans.push_back(results[r].ok() ? results[r]->algorithm
                                    : Algorithm::kUnspecified);
  }
  return plans;
}

TEST(BoundSameHostTest,
     Run_SmallCallRepeated_InlineOnceThenWithoutCoordinator) {
  std::unique_ptr<EmbeddedCluster> cluster = StartUnchecked(2);
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("small", 2);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<Communicator*> ranks = Pointers(*group);
  const CollectiveSpec small =
      Spec(CollectiveKind::kAllReduce, DType::kF32, 2, ReduceOp::kSum);
  const std::vector<Algorithm> inline_twice(2, Algorithm::kInline);
  const std::vector<Algorithm> same_host_twice(2, Algorithm::kSameHost);
  // A shape called once rides inline; its second call asks for same_host.
  EXPECT_EQ(PlansOf(ranks, small, 1), inline_twice);
  EXPECT_EQ(PlansOf(ranks, small, 2), same_host_twice);
  ASSERT_TRUE(cluster->SignalCoordinator(SIGSTOP).ok());
  for (uint64_t call = 3; call < 13; ++call) {
    EXPECT_EQ(PlansOf(ranks, small, call), same_host_twice);
  }
  ASSERT_TRUE(cluster->SignalCoordinator(SIGCONT).ok());
  // Other kinds keep riding inline.
  const CollectiveSpec gather =
      Spec(CollectiveKind::kAllGather, DType::kF32, 2, ReduceOp::kSum);
  EXPECT_EQ(PlansOf(ranks, gather, 13), inline_twice);
  EXPECT_EQ(PlansOf(ranks, gather, 14), inline_twice);
}

TEST(BoundSameHostTest, Run_ThousandsOfCallsThenAPlannedOne_CoordinatorCounts) {
  // More calls than the coordinator's window of outstanding sequences
  // (1,024): the planned call after them is not "from the future".
  std::unique_ptr<EmbeddedCluster> cluster = StartUnchecked(2);
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("many", 2);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<Communicator*> ranks = Pointers(*group);
  const CollectiveSpec small =
      Spec(CollectiveKind::kAllReduce, DType::kF32, 9000, ReduceOp::kSum);
  for (int i = 0; i < 1100; ++i) {
    const std::vector<absl::StatusOr<CallResult>> results =
        RunEach(ranks, {small, small}, i);
    ASSERT_TRUE(results[0].ok() && results[1].ok())
        << "call " << i << ": " << results[0].status() << " / "
        << results[1].status();
    ASSERT_EQ(results[0]->algorithm, Algorithm::kSameHost);
  }
  CollectiveSpec other = small;
  other.op = ReduceOp::kMax;
  const std::vector<absl::StatusOr<CallResult>> results =
      RunEach(ranks, {other, other}, 5);
  EXPECT_TRUE(results[0].ok() && results[1].ok())
      << results[0].status() << " / " << results[1].status();
}

TEST(BoundSameHostTest, Run_CallsDiffer_InvalidArgumentWithAccountOnEveryRank) {
  std::unique_ptr<EmbeddedCluster> cluster = StartUnchecked(3);
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("differ", 3);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<Communicator*> ranks = Pointers(*group);
  ExpectSameHostEverywhere(ranks, 1);
  CollectiveSpec other = kF32Sum;
  other.count = 20001;
  const std::vector<absl::StatusOr<CallResult>> results =
      RunEach(ranks, {kF32Sum, kF32Sum, other}, 2);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r].status().code(), absl::StatusCode::kInvalidArgument)
        << results[r].status();
    EXPECT_THAT(results[r].status().message(),
                HasSubstr("collective #2 of group differ does not match "
                          "across ranks: ranks 0, 1: all_reduce f32[20000] "
                          "sum; rank 2: all_reduce f32[20001] sum"))
        << "rank " << r;
  }
}

TEST(BoundSameHostTest, Run_RankNeverCalls_DeadlineNamesItOnEveryRankThatDid) {
  std::unique_ptr<EmbeddedCluster> cluster = StartUnchecked(3);
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("missing", 3);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<Communicator*> ranks = Pointers(*group);
  ExpectSameHostEverywhere(ranks, 1);
  const std::vector<absl::StatusOr<CallResult>> results =
      RunEach(ranks, {kF32Sum, kF32Sum, std::nullopt}, 2, absl::Seconds(3));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].status().code(), absl::StatusCode::kDeadlineExceeded)
        << results[r].status();
    EXPECT_THAT(results[r].status().message(), HasSubstr("rank 2"))
        << "rank " << r;
  }
}

TEST(BoundSameHostTest, Run_ResultsChecked_EveryCallAsksTheCoordinator) {
  absl::StatusOr<std::unique_ptr<EmbeddedCluster>> cluster =
      EmbeddedCluster::Start(2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto group = (*cluster)->JoinGroup("checked", 2);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<Communicator*> ranks = Pointers(*group);
  // Small calls ride inline however often they repeat.
  const CollectiveSpec small =
      Spec(CollectiveKind::kAllReduce, DType::kF32, 2, ReduceOp::kSum);
  for (uint64_t call = 1; call < 4; ++call) {
    EXPECT_EQ(PlansOf(ranks, small, call),
              std::vector<Algorithm>(2, Algorithm::kInline));
  }
  ExpectSameHostEverywhere(ranks, 4);
  ASSERT_TRUE((*cluster)->SignalCoordinator(SIGSTOP).ok());
  // Without the coordinator the call cannot complete: it fails at its
  // deadline instead of skipping the check.
  const std::vector<absl::StatusOr<CallResult>> results =
      RunEach(ranks, {kF32Sum, kF32Sum}, 5, absl::Seconds(2));
  ASSERT_TRUE((*cluster)->SignalCoordinator(SIGCONT).ok());
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(results[r].ok()) << "rank " << r;
  }
}

}  // namespace
}  // namespace chorus::test
