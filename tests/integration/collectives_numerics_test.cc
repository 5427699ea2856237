// Results users can trust: the same random f16/bf16 inputs under every plan
// (inline, ring, recursive doubling, same_host) each within one 16-bit ulp of
// the exact result rounded once and bit-identical across ranks; and the
// result check at the commit: a rank whose result differs (a test hook flips
// one bit of it) makes the call end with DATA_LOSS on every rank, naming it,
// also when the runtime commits without waiting (RunAsync, the daemons'
// path).
// A real coordinator process and worker runtimes embedded in the test, one
// thread per rank.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "chorus/status_facts.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/collective_harness.h"

namespace chorus::test {
namespace {

using ::testing::HasSubstr;

constexpr int kWorld = 3;

std::unique_ptr<EmbeddedCluster> StartCluster() {
  absl::StatusOr<std::unique_ptr<EmbeddedCluster>> cluster =
      EmbeddedCluster::Start(kWorld);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? *std::move(cluster) : nullptr;
}

// ---------------------------------------------------------------------------
// 16-bit floats: every plan rounds once.

class HalfPlansTest : public ::testing::TestWithParam<DType> {};

TEST_P(HalfPlansTest, Run_SameInputsEveryPlan_WithinOneUlpAndIdentical) {
  std::unique_ptr<EmbeddedCluster> cluster = StartCluster();
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("halves", kWorld);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<Communicator*> ranks = Pointers(*group);
  // 24 Ki elements: under the inline limit, several ring chunks of 1 KiB.
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProd}) {
    for (Algorithm plan :
         {Algorithm::kInline, Algorithm::kRing, Algorithm::kRecursiveDoubling,
          Algorithm::kSameHost}) {
      CollectiveCase c;
      c.spec = Spec(CollectiveKind::kAllReduce, GetParam(), 24 << 10, op);
      c.algorithm = plan;
      c.values = Values::kRounding;
      c.seed = 5;  // the same inputs for every plan
      SCOPED_TRACE(DescribeCase(c, kWorld));
      EXPECT_TRUE(RunAndCheck(ranks, c));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Halves, HalfPlansTest,
                         ::testing::Values(DType::kF16, DType::kBF16),
                         [](const auto& info) {
                           return std::string(DTypeName(info.param));
                         });

// ---------------------------------------------------------------------------
// The result check.

struct CorruptCase {
  std::string name;
  CollectiveKind kind;
  Algorithm plan;
};

class ResultCheckTest : public ::testing::TestWithParam<CorruptCase> {};

TEST_P(ResultCheckTest, Run_OneRankResultCorrupted_DataLossOnEveryRank) {
  const CorruptCase& param = GetParam();
  std::unique_ptr<EmbeddedCluster> cluster = StartCluster();
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("checked", kWorld);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<Communicator*> ranks = Pointers(*group);

  // Rank 2 is last in the broadcast chain from root 0 and passes on nothing
  // it took in the ring's last all-gather step: only its result differs.
  cluster->runtime(2)->set_corrupt_results_for_testing(true);
  const CollectiveSpec spec =
      Spec(param.kind, DType::kF32, 1 << 16,
           KindReduces(param.kind) ? ReduceOp::kSum : ReduceOp::kUnspecified);
  std::vector<absl::Status> statuses(kWorld);
  RunOnRanks(kWorld, [&](int r) {
    CollectiveCase c;
    c.spec = spec;
    const std::string input = MakeInput(c, kWorld, r);
    std::string output;
    CallOptions options;
    options.algorithm = param.plan;
    options.timeout = kCallTimeout;
    statuses[r] = ranks[r]->Run(spec, input, &output, options).status();
  });
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_EQ(statuses[r].code(), absl::StatusCode::kDataLoss) << statuses[r];
    EXPECT_THAT(std::string(statuses[r].message()),
                HasSubstr(absl::StrCat("the results of ",
                                       CollectiveKindName(param.kind),
                                       " #1 of group checked differ: rank 2 "
                                       "holds other bytes than ranks 0, 1")));
    // Programs read the same facts from the status's ErrorDetail.
    const std::optional<StatusFacts> facts = StatusFactsOf(statuses[r]);
    ASSERT_TRUE(facts.has_value()) << statuses[r];
    EXPECT_EQ(facts->reason, "RESULTS_DIFFER");
    EXPECT_EQ(facts->group, "checked");
    EXPECT_EQ(facts->sequence, 1u);
    EXPECT_EQ(facts->ranks,
              (std::map<int, std::string>{{2, "other bytes than ranks 0, 1"}}));
  }

  // The group goes on: the next call, unchecked bytes intact, succeeds.
  cluster->runtime(2)->set_corrupt_results_for_testing(false);
  CollectiveCase next;
  next.spec = spec;
  next.algorithm = param.plan;
  next.seed = 9;
  EXPECT_TRUE(RunAndCheck(ranks, next));
}

// RunAsync() sends the commit without waiting: the verdict reaches every
// rank from the call port's completion thread, and the output is cleared.
TEST(ResultCheckAsyncTest,
     RunAsync_OneRankResultCorrupted_DataLossOnEveryRankOutputCleared) {
  std::unique_ptr<EmbeddedCluster> cluster = StartCluster();
  ASSERT_NE(cluster, nullptr);
  std::vector<absl::StatusOr<Membership>> members(kWorld);
  RunOnRanks(kWorld, [&](int r) {
    members[r] = cluster->runtime(r)->Join(
        "checked-async", kWorld, r, JoinOptions::CpuDevice(), kCallTimeout);
  });
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(members[r].ok()) << members[r].status();
  }
  cluster->runtime(2)->set_corrupt_results_for_testing(true);
  CollectiveCase c;
  c.spec =
      Spec(CollectiveKind::kAllReduce, DType::kF32, 1 << 16, ReduceOp::kSum);
  RunOptions options;
  options.algorithm = Algorithm::kRing;
  options.timeout = kCallTimeout;
  std::vector<std::string> inputs(kWorld);
  std::vector<std::string> outputs(kWorld);
  std::vector<absl::Status> statuses(kWorld);
  std::vector<absl::Notification> done(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    inputs[r] = MakeInput(c, kWorld, r);
    cluster->runtime(r)->RunAsync(
        *members[r], /*sequence=*/1, c.spec, inputs[r], &outputs[r], options,
        [&statuses, &done, r](absl::StatusOr<RunResult> result) {
          statuses[r] = result.status();
          done[r].Notify();
        });
  }
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    ASSERT_TRUE(done[r].WaitForNotificationWithTimeout(kCallTimeout +
                                                       absl::Seconds(30)));
    EXPECT_EQ(statuses[r].code(), absl::StatusCode::kDataLoss) << statuses[r];
    EXPECT_THAT(std::string(statuses[r].message()),
                HasSubstr("rank 2 holds other bytes than ranks 0, 1"));
    EXPECT_TRUE(outputs[r].empty()) << outputs[r].size() << " bytes left";
  }
}

INSTANTIATE_TEST_SUITE_P(
    KindsAndPlans, ResultCheckTest,
    ::testing::Values(CorruptCase{"all_reduce_ring", CollectiveKind::kAllReduce,
                                  Algorithm::kRing},
                      CorruptCase{"all_reduce_recursive_doubling",
                                  CollectiveKind::kAllReduce,
                                  Algorithm::kRecursiveDoubling},
                      CorruptCase{"all_reduce_same_host",
                                  CollectiveKind::kAllReduce,
                                  Algorithm::kSameHost},
                      CorruptCase{"all_gather_ring", CollectiveKind::kAllGather,
                                  Algorithm::kRing},
                      CorruptCase{"broadcast_ring", CollectiveKind::kBroadcast,
                                  Algorithm::kRing}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace chorus::test
