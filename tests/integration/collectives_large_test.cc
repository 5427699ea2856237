// Large and chunked collectives: 1<<20-element blocks under the ring (several
// 1 MiB chunks per block), the other plans forced at that size, an odd
// count (1000003) that the planner sends to the ring, and a coordinator
// with tiny chunks and thresholds so that small counts exercise chunk
// boundaries that fall inside blocks and elements of every size.

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/collective_harness.h"

namespace chorus::test {
namespace {

constexpr uint64_t kLarge = uint64_t{1} << 20;

// Starts `world` ranks and runs `cases` on them in order.
void RunCases(int world, const std::vector<CollectiveCase>& cases,
              const std::vector<std::string>& coordinator_flags = {},
              const CheckOptions& check = {}) {
  absl::StatusOr<std::unique_ptr<EmbeddedCluster>> cluster =
      EmbeddedCluster::Start(world, coordinator_flags);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto group = (*cluster)->JoinGroup("large", world);
  ASSERT_TRUE(group.ok()) << group.status();
  for (const CollectiveCase& c : cases) {
    ASSERT_TRUE(RunAndCheck(Pointers(*group), c, check));
  }
}

CollectiveCase Case(CollectiveKind kind, DType dtype, uint64_t count,
                    ReduceOp op, Algorithm plan, uint64_t seed,
                    Values values = Values::kExact) {
  CollectiveCase c;
  c.spec = Spec(kind, dtype, count, op);
  c.algorithm = plan;
  c.values = values;
  c.seed = seed;
  return c;
}

TEST(LargeCollectivesTest, AllReduceRing_OneMiElements_ExactOnEveryRank) {
  RunCases(4, {Case(CollectiveKind::kAllReduce, DType::kF32, kLarge,
                    ReduceOp::kSum, Algorithm::kRing, 1),
               Case(CollectiveKind::kAllReduce, DType::kI64, kLarge,
                    ReduceOp::kSum, Algorithm::kRing, 2)});
}

TEST(LargeCollectivesTest, AllGatherRing_OneMiElements_ExactOnEveryRank) {
  RunCases(4, {Case(CollectiveKind::kAllGather, DType::kF32, kLarge,
                    ReduceOp::kUnspecified, Algorithm::kRing, 3),
               Case(CollectiveKind::kAllGather, DType::kI64, kLarge,
                    ReduceOp::kUnspecified, Algorithm::kRing, 4)});
}

TEST(LargeCollectivesTest, ReduceScatterRing_OneMiElements_ExactOnEveryRank) {
  RunCases(4, {Case(CollectiveKind::kReduceScatter, DType::kF32, kLarge,
                    ReduceOp::kSum, Algorithm::kRing, 5),
               Case(CollectiveKind::kReduceScatter, DType::kI64, kLarge,
                    ReduceOp::kMax, Algorithm::kRing, 6)});
}

TEST(LargeCollectivesTest, AllReduceAuto_OneMiElements_RingWithinTolerance) {
  // 4 MiB of f32 is over the recursive doubling limit: the planner picks the
  // ring. Rounding values: the sum is checked within a tolerance.
  RunCases(
      4, {Case(CollectiveKind::kAllReduce, DType::kF32, kLarge, ReduceOp::kAvg,
               Algorithm::kUnspecified, 7, Values::kRounding)});
}

TEST(LargeCollectivesTest, AllReduceOtherPlans_OneMiElements_ExactOnEveryRank) {
  // Inline (4 MiB per rank through the coordinator) and recursive doubling
  // with a folded rank (world 5) over eight 1 MiB chunks.
  RunCases(5, {Case(CollectiveKind::kAllReduce, DType::kF32, kLarge,
                    ReduceOp::kSum, Algorithm::kInline, 8),
               Case(CollectiveKind::kAllReduce, DType::kI64, kLarge,
                    ReduceOp::kProd, Algorithm::kRecursiveDoubling, 9)});
}

TEST(LargeCollectivesTest, AllReduceAuto_OddCount_RingExactOnEveryRank) {
  RunCases(3, {Case(CollectiveKind::kAllReduce, DType::kF32, 1000003,
                    ReduceOp::kSum, Algorithm::kUnspecified, 10)});
}

TEST(LargeCollectivesTest, RunAuto_TinyChunksAndThresholds_MatchesReference) {
  // Chunks of 1002 bytes: whole elements only (1002 for i8, f16 and bf16,
  // 1000 for u32 and f64), so chunk edges fall inside blocks. Payloads over
  // 256 bytes leave inline; all-reduces up to 8 KiB use recursive doubling.
  const std::vector<std::string> flags = {
      "--chunk_bytes=1002", "--inline_max_bytes=256",
      "--recursive_doubling_max_bytes=8192"};
  CheckOptions check;
  check.inline_max_bytes = 256;
  check.recursive_doubling_max_bytes = 8192;
  const std::vector<DType> dtypes = {DType::kF16, DType::kBF16, DType::kI8,
                                     DType::kF64, DType::kU32};
  std::vector<CollectiveCase> cases;
  uint64_t seed = 20;
  for (CollectiveKind kind : AllKinds()) {
    if (kind == CollectiveKind::kBarrier) continue;
    for (uint64_t count :
         {uint64_t{1}, uint64_t{7}, uint64_t{1023}, uint64_t{3001}}) {
      for (DType dtype : dtypes) {
        const ReduceOp op = KindReduces(kind)
                                ? AllReduceOps()[seed % AllReduceOps().size()]
                                : ReduceOp::kUnspecified;
        CollectiveCase c =
            Case(kind, dtype, count, op, Algorithm::kUnspecified, seed++,
                 IsFloatDType(dtype) ? Values::kRounding : Values::kExact);
        if (KindHasRoot(kind)) c.spec.root = static_cast<int>(seed % 5);
        cases.push_back(c);
      }
    }
  }
  RunCases(5, cases, flags, check);
}

}  // namespace
}  // namespace chorus::test
