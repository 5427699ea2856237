#include "server/coordinator/planner.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

CollectiveSpec Spec(CollectiveKind kind, uint64_t count,
                    DType dtype = DType::kF32) {
  CollectiveSpec spec;
  spec.kind = kind;
  spec.dtype = dtype;
  spec.count = count;
  spec.op = ReduceOp::kSum;
  return spec;
}

CollectiveSpec AllReduceBytes(uint64_t bytes) {
  return Spec(CollectiveKind::kAllReduce, bytes / 4);
}

Algorithm Chosen(const CollectiveSpec& spec, int world,
                 Algorithm forced = Algorithm::kUnspecified,
                 const PlannerOptions& options = PlannerOptions()) {
  absl::StatusOr<Plan> plan = ChoosePlan(spec, world, forced, options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? plan->algorithm : Algorithm::kUnspecified;
}

TEST(PlannerTest, ChoosePlan_Small_Inline) {
  absl::StatusOr<Plan> plan = ChoosePlan(
      AllReduceBytes(64), 4, Algorithm::kUnspecified, PlannerOptions());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->algorithm, Algorithm::kInline);
  EXPECT_EQ(plan->chunk_bytes, PlannerOptions().chunk_bytes);
}

TEST(PlannerTest, ChoosePlan_AtAndOverInlineLimit_InlineThenRecursiveDoubling) {
  EXPECT_EQ(Chosen(AllReduceBytes(128 << 10), 3), Algorithm::kInline);
  EXPECT_EQ(Chosen(AllReduceBytes((128 << 10) + 4), 3),
            Algorithm::kRecursiveDoubling);
}

TEST(PlannerTest, ChoosePlan_MediumAllReduceSmallGroup_RecursiveDoubling) {
  EXPECT_EQ(Chosen(AllReduceBytes(256 << 10), 2),
            Algorithm::kRecursiveDoubling);
  EXPECT_EQ(Chosen(AllReduceBytes(512 << 10), 3),
            Algorithm::kRecursiveDoubling);
}

TEST(PlannerTest, ChoosePlan_MediumAllReduceFourRanks_Ring) {
  // Measured: with 4 ranks the ring beats recursive doubling at every size.
  EXPECT_EQ(Chosen(AllReduceBytes(256 << 10), 4), Algorithm::kRing);
  EXPECT_EQ(Chosen(AllReduceBytes(256 << 10), 8), Algorithm::kRing);
}

TEST(PlannerTest, ChoosePlan_LargeAllReduce_Ring) {
  EXPECT_EQ(Chosen(AllReduceBytes((512 << 10) + 4), 3), Algorithm::kRing);
  EXPECT_EQ(Chosen(AllReduceBytes(uint64_t{1} << 34), 8), Algorithm::kRing);
}

TEST(PlannerTest, ChoosePlan_AllReduceOverInlineOnOneHost_SameHost) {
  for (uint64_t bytes : {(128u << 10) + 4, 1u << 20, 64u << 20}) {
    for (int world : {2, 3, 4, 8}) {
      EXPECT_EQ(ChoosePlan(AllReduceBytes(bytes), world,
                           Algorithm::kUnspecified, PlannerOptions(),
                           /*same_host=*/true)
                    ->algorithm,
                Algorithm::kSameHost)
          << bytes << " bytes, " << world << " ranks";
    }
  }
}

TEST(PlannerTest, ChoosePlan_AllReduceOverSameHostInlineLimit_SameHost) {
  // Over 32 KiB, all-reduces on one host skip inline; other kinds do not
  // (an all-gather of 4096 f32 per rank: 64 KiB at 4 ranks).
  const Plan at = *ChoosePlan(AllReduceBytes(32 << 10), 2,
                              Algorithm::kUnspecified, PlannerOptions(), true);
  EXPECT_EQ(at.algorithm, Algorithm::kInline);
  const Plan over =
      *ChoosePlan(AllReduceBytes((32 << 10) + 4), 2, Algorithm::kUnspecified,
                  PlannerOptions(), true);
  EXPECT_EQ(over.algorithm, Algorithm::kSameHost);
  EXPECT_EQ(ChoosePlan(Spec(CollectiveKind::kAllGather, 4 << 10), 4,
                       Algorithm::kUnspecified, PlannerOptions(), true)
                ->algorithm,
            Algorithm::kInline);
  // What ranks are told: the plan's limit, per kind and group.
  EXPECT_EQ(
      InlineMaxBytes(CollectiveKind::kAllReduce, 4, true, PlannerOptions()),
      32u << 10);
  EXPECT_EQ(
      InlineMaxBytes(CollectiveKind::kAllGather, 4, true, PlannerOptions()),
      128u << 10);
  EXPECT_EQ(
      InlineMaxBytes(CollectiveKind::kAllReduce, 4, false, PlannerOptions()),
      128u << 10);
  EXPECT_EQ(
      InlineMaxBytes(CollectiveKind::kAllReduce, 1, true, PlannerOptions()),
      128u << 10);
}

TEST(PlannerTest, ChoosePlan_SmallAllReduceEveryRankRepeats_SameHost) {
  const CollectiveSpec small = AllReduceBytes(8);
  auto plan = [&](bool same_host, bool host_memory, Algorithm forced,
                  const CollectiveSpec& spec, bool same_host_on = true) {
    PlannerOptions options;
    options.same_host = same_host_on;
    return ChoosePlan(spec, 2, forced, options, same_host, host_memory,
                      /*nccl_ranks=*/false, /*ranks_repeat=*/true)
        ->algorithm;
  };
  EXPECT_EQ(plan(true, true, Algorithm::kUnspecified, small),
            Algorithm::kSameHost);
  // Where same_host does not apply, or is forced otherwise, inline stays.
  EXPECT_EQ(plan(false, true, Algorithm::kUnspecified, small),
            Algorithm::kInline);
  EXPECT_EQ(plan(true, false, Algorithm::kUnspecified, small),
            Algorithm::kInline);
  EXPECT_EQ(plan(true, true, Algorithm::kInline, small), Algorithm::kInline);
  EXPECT_EQ(plan(true, true, Algorithm::kUnspecified, small, false),
            Algorithm::kInline);
  EXPECT_EQ(plan(true, true, Algorithm::kUnspecified,
                 Spec(CollectiveKind::kAllGather, 2)),
            Algorithm::kInline);
  // Without every rank repeating it, the small call rides inline.
  EXPECT_EQ(ChoosePlan(small, 2, Algorithm::kUnspecified, PlannerOptions(),
                       true, true, false, /*ranks_repeat=*/false)
                ->algorithm,
            Algorithm::kInline);
}

TEST(PlannerTest, ChoosePlan_OneHostOnGpus_DataPlaneOverSameHostLimit) {
  // The ranks were told 32 KiB: a GPU call over it does not ride inline.
  EXPECT_EQ(ChoosePlan(AllReduceBytes(64 << 10), 2, Algorithm::kUnspecified,
                       PlannerOptions(), /*same_host=*/true,
                       /*host_memory=*/false)
                ->algorithm,
            Algorithm::kRecursiveDoubling);
}

TEST(PlannerTest,
     ChoosePlan_OneHostButSmallOrOtherKindOrTurnedOff_NotSameHost) {
  EXPECT_EQ(ChoosePlan(AllReduceBytes(64), 4, Algorithm::kUnspecified,
                       PlannerOptions(), true)
                ->algorithm,
            Algorithm::kInline);
  EXPECT_EQ(ChoosePlan(Spec(CollectiveKind::kAllGather, 1 << 20), 4,
                       Algorithm::kUnspecified, PlannerOptions(), true)
                ->algorithm,
            Algorithm::kRing);
  PlannerOptions off;
  off.same_host = false;
  EXPECT_EQ(
      ChoosePlan(AllReduceBytes(1 << 20), 4, Algorithm::kUnspecified, off, true)
          ->algorithm,
      Algorithm::kRing);
  // A forced plan still wins on one host.
  EXPECT_EQ(ChoosePlan(AllReduceBytes(1 << 20), 4, Algorithm::kRing,
                       PlannerOptions(), true)
                ->algorithm,
            Algorithm::kRing);
}

TEST(PlannerTest, ChoosePlan_ForcedSameHostAcrossHosts_InvalidArgument) {
  absl::StatusOr<Plan> plan =
      ChoosePlan(AllReduceBytes(1 << 20), 4, Algorithm::kSameHost,
                 PlannerOptions(), /*same_host=*/false);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.status().message(),
            "same_host needs every rank's worker on one host; this group "
            "spans several");
}

TEST(PlannerTest, ChoosePlan_ForcedSameHostOtherKind_InvalidArgument) {
  absl::StatusOr<Plan> plan =
      ChoosePlan(Spec(CollectiveKind::kBroadcast, 1024), 4,
                 Algorithm::kSameHost, PlannerOptions(), /*same_host=*/true);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.status().message(),
            "same_host is available for all_reduce only, not broadcast");
}

TEST(PlannerTest, ChoosePlan_MediumOtherKinds_Ring) {
  for (CollectiveKind kind :
       {CollectiveKind::kReduce, CollectiveKind::kBroadcast,
        CollectiveKind::kAllGather, CollectiveKind::kReduceScatter,
        CollectiveKind::kGather, CollectiveKind::kScatter,
        CollectiveKind::kAllToAll}) {
    EXPECT_EQ(Chosen(Spec(kind, 64 << 10), 4), Algorithm::kRing)
        << CollectiveKindName(kind);
  }
}

TEST(PlannerTest, ChoosePlan_SizeOfWholeGroup_Decides) {
  // all_gather f32[8192]: 32 KiB in, world * 32 KiB out.
  EXPECT_EQ(Chosen(Spec(CollectiveKind::kAllGather, 8192), 4),
            Algorithm::kInline);
  EXPECT_EQ(Chosen(Spec(CollectiveKind::kAllGather, 8192), 5),
            Algorithm::kRing);
}

TEST(PlannerTest, ChoosePlan_ForcedInlineOrRing_WinsForEveryKind) {
  for (int v = 1; v <= 8; ++v) {
    const CollectiveKind kind = static_cast<CollectiveKind>(v);
    EXPECT_EQ(Chosen(Spec(kind, 1 << 24), 4, Algorithm::kInline),
              Algorithm::kInline)
        << CollectiveKindName(kind);
    EXPECT_EQ(Chosen(Spec(kind, 1), 4, Algorithm::kRing), Algorithm::kRing)
        << CollectiveKindName(kind);
  }
}

TEST(PlannerTest, ChoosePlan_ForcedRecursiveDoublingAllReduce_Used) {
  EXPECT_EQ(Chosen(AllReduceBytes(4), 4, Algorithm::kRecursiveDoubling),
            Algorithm::kRecursiveDoubling);
  EXPECT_EQ(Chosen(AllReduceBytes(1 << 30), 4, Algorithm::kRecursiveDoubling),
            Algorithm::kRecursiveDoubling);
}

TEST(PlannerTest, ChoosePlan_ForcedRecursiveDoublingOtherKind_InvalidArgument) {
  absl::StatusOr<Plan> plan =
      ChoosePlan(Spec(CollectiveKind::kAllGather, 4), 4,
                 Algorithm::kRecursiveDoubling, PlannerOptions());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.status().message(),
            "recursive_doubling is available for all_reduce only, not "
            "all_gather");
  for (int v = 2; v <= 8; ++v) {
    EXPECT_EQ(ChoosePlan(Spec(static_cast<CollectiveKind>(v), 4), 4,
                         Algorithm::kRecursiveDoubling, PlannerOptions())
                  .status()
                  .code(),
              absl::StatusCode::kInvalidArgument)
        << v;
  }
}

TEST(PlannerTest, ChoosePlan_ForcedTreeOrUnknown_InvalidArgument) {
  absl::StatusOr<Plan> tree =
      ChoosePlan(AllReduceBytes(64), 4, Algorithm::kTree, PlannerOptions());
  EXPECT_EQ(tree.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tree.status().message(),
            "algorithm tree is not available for all_reduce");
  EXPECT_EQ(ChoosePlan(AllReduceBytes(64), 4, static_cast<Algorithm>(77),
                       PlannerOptions())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PlannerTest, ChoosePlan_ForcedLeader_InvalidArgumentEvenForBarrier) {
  absl::StatusOr<Plan> leader =
      ChoosePlan(AllReduceBytes(64), 4, Algorithm::kLeader, PlannerOptions());
  EXPECT_EQ(leader.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(leader.status().message()),
              HasSubstr("cannot be forced"));
  // The coordinator checks a call's forced plan before it matches it.
  CollectiveSpec barrier;
  barrier.kind = CollectiveKind::kBarrier;
  const absl::Status forced =
      CheckForcedPlan(barrier, Algorithm::kLeader, true, false);
  EXPECT_EQ(forced.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(forced.message()), HasSubstr("cannot be forced"));
}

// Plans a call of a group whose ranks are all on GPUs of workers with NCCL.
absl::StatusOr<Plan> OnNcclGpus(const CollectiveSpec& spec,
                                Algorithm forced = Algorithm::kUnspecified,
                                bool nccl_plan = true) {
  PlannerOptions options;
  options.nccl = nccl_plan;
  return ChoosePlan(spec, 4, forced, options, /*same_host=*/false,
                    /*host_memory=*/false, /*nccl_ranks=*/true);
}

TEST(PlannerTest, ChoosePlan_NcclKindsOverInlineOnNcclGpus_Nccl) {
  for (CollectiveKind kind :
       {CollectiveKind::kAllReduce, CollectiveKind::kReduce,
        CollectiveKind::kBroadcast, CollectiveKind::kAllGather,
        CollectiveKind::kReduceScatter}) {
    EXPECT_EQ(OnNcclGpus(Spec(kind, 1 << 20))->algorithm, Algorithm::kNccl)
        << CollectiveKindName(kind);
  }
  // Small calls still ride inline.
  EXPECT_EQ(OnNcclGpus(AllReduceBytes(64))->algorithm, Algorithm::kInline);
}

TEST(PlannerTest, ChoosePlan_NotAsChorusDefinesItOrOff_NotNccl) {
  // f16 sums in f32 partials, which NCCL does not: the ring.
  EXPECT_EQ(OnNcclGpus(Spec(CollectiveKind::kAllReduce, 1 << 20, DType::kF16))
                ->algorithm,
            Algorithm::kRing);
  EXPECT_EQ(OnNcclGpus(Spec(CollectiveKind::kAllToAll, 1 << 20))->algorithm,
            Algorithm::kRing);
  EXPECT_EQ(OnNcclGpus(AllReduceBytes(64 << 20), Algorithm::kUnspecified,
                       /*nccl_plan=*/false)
                ->algorithm,
            Algorithm::kRing);
  // Ranks not all on GPUs of workers with NCCL.
  PlannerOptions options;
  options.nccl = true;
  EXPECT_EQ(ChoosePlan(AllReduceBytes(64 << 20), 4, Algorithm::kUnspecified,
                       options, false, false, /*nccl_ranks=*/false)
                ->algorithm,
            Algorithm::kRing);
}

TEST(PlannerTest, ChoosePlan_ForcedNcclWhereItCannotRun_InvalidArgument) {
  absl::StatusOr<Plan> off = OnNcclGpus(AllReduceBytes(64 << 20),
                                        Algorithm::kNccl, /*nccl_plan=*/false);
  EXPECT_EQ(off.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(off.status().message().find("--nccl_plan"), std::string::npos)
      << off.status();
  absl::StatusOr<Plan> f16 = OnNcclGpus(
      Spec(CollectiveKind::kAllReduce, 1 << 20, DType::kF16), Algorithm::kNccl);
  EXPECT_EQ(f16.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OnNcclGpus(AllReduceBytes(64), Algorithm::kNccl)->algorithm,
            Algorithm::kNccl);
}

TEST(PlannerTest, ChoosePlan_Barrier_InlineWhateverIsForced) {
  CollectiveSpec barrier;
  barrier.kind = CollectiveKind::kBarrier;
  for (Algorithm forced :
       {Algorithm::kUnspecified, Algorithm::kInline, Algorithm::kRing,
        Algorithm::kRecursiveDoubling, Algorithm::kTree}) {
    EXPECT_EQ(Chosen(barrier, 16, forced), Algorithm::kInline)
        << AlgorithmName(forced);
  }
}

TEST(PlannerTest, ChoosePlan_CustomOptions_ThresholdsAndChunkFollow) {
  PlannerOptions options;
  options.inline_max_bytes = 0;
  options.recursive_doubling_max_bytes = 16;
  options.chunk_bytes = 4096;
  absl::StatusOr<Plan> plan =
      ChoosePlan(AllReduceBytes(16), 2, Algorithm::kUnspecified, options);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->algorithm, Algorithm::kRecursiveDoubling);
  EXPECT_EQ(plan->chunk_bytes, 4096u);
  EXPECT_EQ(Chosen(AllReduceBytes(20), 2, Algorithm::kUnspecified, options),
            Algorithm::kRing);
  // A zero-element all-reduce still fits under a zero inline limit.
  EXPECT_EQ(Chosen(AllReduceBytes(0), 2, Algorithm::kUnspecified, options),
            Algorithm::kInline);
}

}  // namespace
}  // namespace chorus
