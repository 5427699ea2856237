// Correctness of every collective kind for every dtype and every reduce op,
// under each plan: a real coordinator process and three (or eight) worker
// runtimes embedded in the test, one thread per rank, count 7 (ring blocks of
// 3, 2 and 2 elements, or seven of one and an empty one). One test per
// (world, plan, dtype); within it every kind and op, the root moving from
// rank to rank. Floats run with exact values (sums
// and products the types hold exactly, signed zeros, infinities and NaN for
// min/max) and with rounding values (checked within a tolerance); integers
// with values whose sums and products wrap.

#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/collective_harness.h"

namespace chorus::test {
namespace {

constexpr uint64_t kCount = 7;

using Param = std::tuple<int, Algorithm, DType>;

class DtypeOpMatrixTest : public ::testing::TestWithParam<Param> {};

TEST_P(DtypeOpMatrixTest, Run_EveryKindAndOp_MatchesReferenceOnEveryRank) {
  const auto [world, plan, dtype] = GetParam();
  absl::StatusOr<std::unique_ptr<EmbeddedCluster>> cluster =
      EmbeddedCluster::Start(world);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto group = (*cluster)->JoinGroup("matrix", world);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<Communicator*> ranks = Pointers(*group);

  int cases = 0;
  uint64_t seed = 1;
  for (CollectiveKind kind : AllKinds()) {
    // Recursive doubling exists for all_reduce only (see ErrorsTest for the
    // refusal of the others).
    if (plan == Algorithm::kRecursiveDoubling &&
        kind != CollectiveKind::kAllReduce) {
      continue;
    }
    std::vector<ReduceOp> ops = {ReduceOp::kUnspecified};
    if (KindReduces(kind)) ops = AllReduceOps();
    for (ReduceOp op : ops) {
      std::vector<Values> profiles = {Values::kExact};
      if (IsFloatDType(dtype) && KindReduces(kind) && op != ReduceOp::kMin &&
          op != ReduceOp::kMax) {
        profiles.push_back(Values::kRounding);
      }
      for (Values values : profiles) {
        CollectiveCase c;
        c.spec = Spec(kind, dtype, kCount, op, cases % world);
        c.algorithm = plan;
        c.values = values;
        c.seed = seed++;
        ++cases;
        ASSERT_TRUE(RunAndCheck(ranks, c));
      }
    }
  }
  EXPECT_GT(cases, 0);
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  const Algorithm plan = std::get<1>(info.param);
  return absl::StrCat(
      "world", std::get<0>(info.param), "_",
      plan == Algorithm::kUnspecified ? "auto" : AlgorithmName(plan), "_",
      DTypeName(std::get<2>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(
    WorldsPlansDtypes, DtypeOpMatrixTest,
    ::testing::Combine(::testing::Values(3, 8),
                       ::testing::Values(Algorithm::kUnspecified,
                                         Algorithm::kInline, Algorithm::kRing,
                                         Algorithm::kRecursiveDoubling),
                       ::testing::ValuesIn(AllDTypes())),
    ParamName);

}  // namespace
}  // namespace chorus::test
