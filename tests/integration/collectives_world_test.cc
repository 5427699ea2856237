// Correctness of every collective kind across world sizes and element
// counts 0, 1, 7 and 1023 under each plan, with a real coordinator process
// and one embedded worker runtime per rank: the planner, the matching, the
// runtime and the TCP data plane together. One test per (world, plan);
// within it every kind at every count, reducing kinds with f32 sum (small
// integers: exact) and i32 max, the others alternating f32 and i32 bit
// patterns, plus one dtype and op rotating with world, count and kind (so
// every world size meets every dtype and op); the root moves with the
// count. The automatic plan also runs a medium count (20000 elements),
// where the planner leaves inline: recursive doubling for all_reduce, the
// ring for the rest.
//
// The automatic and inline plans run at world sizes 1, 2, 3, 4, 5 and 8.
// The data-plane algorithms themselves (ring, recursive doubling,
// same_host) are unit-tested at every world size from 1 to 8, every dtype
// and op and chunked sizes over the in-process transport
// (tests/unit/ring_test.cc and its neighbours), so here they run at two
// world sizes only (2, and 5, which recursive doubling folds), and once
// more at world 3 with every worker sending its calls to the coordinator as
// unary gRPC calls instead of on the call port, and with half of them doing
// so. Last, world 5 with join replies that list no members (workers fetch
// their peers from the coordinator), two workers holding two ranks each.

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/collective_harness.h"

namespace chorus::test {
namespace {

using Param = std::tuple<int, Algorithm>;
using CallRoute = EmbeddedCluster::CallRoute;

// Runs the cases with `world` ranks, rank r on worker worker_of_rank[r]
// (rank r on worker r when empty), the coordinator given
// `coordinator_flags`.
void RunEveryKindAndCount(
    int world, Algorithm plan, CallRoute calls,
    const std::vector<std::string>& coordinator_flags = {},
    std::vector<int> worker_of_rank = {}) {
  if (worker_of_rank.empty()) {
    for (int r = 0; r < world; ++r) worker_of_rank.push_back(r);
  }
  const int workers =
      *std::max_element(worker_of_rank.begin(), worker_of_rank.end()) + 1;
  absl::StatusOr<std::unique_ptr<EmbeddedCluster>> cluster =
      EmbeddedCluster::Start(workers, coordinator_flags, calls);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto group = (*cluster)->JoinGroup("worlds", worker_of_rank);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<Communicator*> ranks = Pointers(*group);

  std::vector<uint64_t> counts = {0, 1, 7, 1023};
  if (plan == Algorithm::kUnspecified) counts.push_back(20000);
  const std::vector<DType> dtypes = AllDTypes();
  const std::vector<ReduceOp> ops = AllReduceOps();
  uint64_t seed = 100;
  for (CollectiveKind kind : AllKinds()) {
    if ((plan == Algorithm::kRecursiveDoubling ||
         plan == Algorithm::kSameHost) &&
        kind != CollectiveKind::kAllReduce) {
      continue;
    }
    for (size_t i = 0; i < counts.size(); ++i) {
      const int root = static_cast<int>((i * 3 + 1) % world);
      std::vector<CollectiveSpec> specs;
      if (kind == CollectiveKind::kBarrier) {
        if (i > 0) continue;
        specs.push_back(Spec(kind, DType::kUnspecified, 0));
      } else if (KindReduces(kind)) {
        specs.push_back(
            Spec(kind, DType::kF32, counts[i], ReduceOp::kSum, root));
        specs.push_back(
            Spec(kind, DType::kI32, counts[i], ReduceOp::kMax, root));
        // A dtype and op that rotate with world, count and kind, so that
        // every world size meets every dtype and op.
        const size_t turn = world + i + static_cast<size_t>(kind);
        specs.push_back(Spec(kind, dtypes[turn % dtypes.size()], counts[i],
                             ops[(world + i) % ops.size()], root));
      } else {
        specs.push_back(Spec(kind, i % 2 == 0 ? DType::kF32 : DType::kI32,
                             counts[i], ReduceOp::kUnspecified, root));
        const size_t turn = world + i + static_cast<size_t>(kind);
        specs.push_back(Spec(kind, dtypes[turn % dtypes.size()], counts[i],
                             ReduceOp::kUnspecified, root));
      }
      for (const CollectiveSpec& spec : specs) {
        CollectiveCase c;
        c.spec = spec;
        c.algorithm = plan;
        c.seed = seed++;
        // Rounding values where the dtype and op allow it.
        if (IsFloatDType(spec.dtype) && spec.op != ReduceOp::kSum &&
            spec.op != ReduceOp::kMin && spec.op != ReduceOp::kMax) {
          c.values = Values::kRounding;
        }
        ASSERT_TRUE(RunAndCheck(ranks, c));
      }
    }
  }
}

// Join replies that list no members (a group above --member_list_max):
// each worker fetches the peers it sends to or hears from; two ranks share
// worker 0 and two worker 2.
class UnlistedMembersTest : public ::testing::TestWithParam<Param> {};

TEST_P(UnlistedMembersTest, Run_EveryKindAndCount_MatchesReferenceOnEveryRank) {
  const auto [world, plan] = GetParam();
  RunEveryKindAndCount(world, plan, CallRoute::kCallPort,
                       {"--member_list_max=0"}, {0, 0, 1, 2, 2});
}

class WorldSizeTest : public ::testing::TestWithParam<Param> {};

TEST_P(WorldSizeTest, Run_EveryKindAndCount_MatchesReferenceOnEveryRank) {
  const auto [world, plan] = GetParam();
  RunEveryKindAndCount(world, plan, CallRoute::kCallPort);
}

class GrpcCallsTest : public ::testing::TestWithParam<Param> {};

TEST_P(GrpcCallsTest, Run_EveryKindAndCount_MatchesReferenceOnEveryRank) {
  const auto [world, plan] = GetParam();
  RunEveryKindAndCount(world, plan, CallRoute::kGrpc);
}

class MixedCallsTest : public ::testing::TestWithParam<Param> {};

TEST_P(MixedCallsTest, Run_EveryKindAndCount_MatchesReferenceOnEveryRank) {
  const auto [world, plan] = GetParam();
  RunEveryKindAndCount(world, plan, CallRoute::kMixed);
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  const Algorithm plan = std::get<1>(info.param);
  return absl::StrCat(
      "world", std::get<0>(info.param), "_",
      plan == Algorithm::kUnspecified ? "auto" : AlgorithmName(plan));
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, WorldSizeTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 8),
                       ::testing::Values(Algorithm::kUnspecified,
                                         Algorithm::kInline)),
    ParamName);

INSTANTIATE_TEST_SUITE_P(
    DataPlanePlans, WorldSizeTest,
    ::testing::Combine(::testing::Values(2, 5),
                       ::testing::Values(Algorithm::kRing,
                                         Algorithm::kRecursiveDoubling,
                                         Algorithm::kSameHost)),
    ParamName);

INSTANTIATE_TEST_SUITE_P(
    Worlds, UnlistedMembersTest,
    ::testing::Combine(::testing::Values(5),
                       ::testing::Values(Algorithm::kUnspecified,
                                         Algorithm::kRing,
                                         Algorithm::kRecursiveDoubling,
                                         Algorithm::kSameHost)),
    ParamName);

INSTANTIATE_TEST_SUITE_P(
    Worlds, GrpcCallsTest,
    ::testing::Combine(::testing::Values(3),
                       ::testing::Values(Algorithm::kRing,
                                         Algorithm::kRecursiveDoubling)),
    ParamName);

INSTANTIATE_TEST_SUITE_P(
    Worlds, MixedCallsTest,
    ::testing::Combine(::testing::Values(3),
                       ::testing::Values(Algorithm::kRing,
                                         Algorithm::kRecursiveDoubling)),
    ParamName);

}  // namespace
}  // namespace chorus::test
