#include "common/collective.h"

#include <algorithm>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

CollectiveSpec Spec(CollectiveKind kind, DType dtype, uint64_t count,
                    ReduceOp op = ReduceOp::kUnspecified, int32_t root = 0) {
  CollectiveSpec spec;
  spec.kind = kind;
  spec.dtype = dtype;
  spec.count = count;
  spec.op = op;
  spec.root = root;
  return spec;
}

std::string Message(const absl::Status& status) {
  return std::string(status.message());
}

// One row of the buffer-size table in collective.h, for a group of 4 ranks,
// f32[8] (32-byte blocks) and root 2.
struct SizeRow {
  CollectiveKind kind;
  uint64_t root_in, root_out, other_in, other_out, payload;
};

TEST(CollectiveSizesTest, InputOutputPayloadBytes_EveryKind_MatchTable) {
  constexpr int kWorld = 4;
  constexpr uint64_t kBlock = 32;
  constexpr uint64_t kAll = kBlock * kWorld;
  const SizeRow rows[] = {
      {CollectiveKind::kAllReduce, kBlock, kBlock, kBlock, kBlock, kBlock},
      {CollectiveKind::kReduce, kBlock, kBlock, kBlock, 0, kBlock},
      {CollectiveKind::kBroadcast, kBlock, kBlock, 0, kBlock, kBlock},
      {CollectiveKind::kAllGather, kBlock, kAll, kBlock, kAll, kAll},
      {CollectiveKind::kReduceScatter, kAll, kBlock, kAll, kBlock, kAll},
      {CollectiveKind::kGather, kBlock, kAll, kBlock, 0, kAll},
      {CollectiveKind::kScatter, kAll, kBlock, 0, kBlock, kAll},
      {CollectiveKind::kAllToAll, kAll, kAll, kAll, kAll, kAll},
      {CollectiveKind::kBarrier, 0, 0, 0, 0, 0},
  };
  for (const SizeRow& row : rows) {
    const CollectiveSpec spec = Spec(
        row.kind, DType::kF32, row.kind == CollectiveKind::kBarrier ? 0 : 8,
        ReduceOp::kSum, /*root=*/2);
    SCOPED_TRACE(DescribeSpec(spec));
    EXPECT_EQ(InputBytes(spec, kWorld, 2), row.root_in);
    EXPECT_EQ(OutputBytes(spec, kWorld, 2), row.root_out);
    for (int rank : {0, 1, 3}) {
      EXPECT_EQ(InputBytes(spec, kWorld, rank), row.other_in) << rank;
      EXPECT_EQ(OutputBytes(spec, kWorld, rank), row.other_out) << rank;
    }
    EXPECT_EQ(PayloadBytes(spec, kWorld), row.payload);
  }
}

TEST(CollectiveSizesTest, InputBytes_DTypeSize_Scales) {
  EXPECT_EQ(InputBytes(Spec(CollectiveKind::kAllReduce, DType::kF16, 5,
                            ReduceOp::kSum),
                       2, 0),
            10u);
  EXPECT_EQ(InputBytes(
                Spec(CollectiveKind::kAllReduce, DType::kU8, 5, ReduceOp::kSum),
                2, 0),
            5u);
  EXPECT_EQ(InputBytes(Spec(CollectiveKind::kAllReduce, DType::kU64, 5,
                            ReduceOp::kSum),
                       2, 0),
            40u);
}

TEST(CollectiveSizesTest, PayloadBytes_WorldOfOne_RootOnly) {
  EXPECT_EQ(PayloadBytes(Spec(CollectiveKind::kGather, DType::kF32, 8), 1),
            32u);
  EXPECT_EQ(PayloadBytes(Spec(CollectiveKind::kBroadcast, DType::kI64, 3), 1),
            24u);
}

TEST(CollectiveSizesTest, PayloadBytes_RootNotZero_SameAsRootZero) {
  CollectiveSpec spec = Spec(CollectiveKind::kScatter, DType::kI32, 10);
  const uint64_t at_zero = PayloadBytes(spec, 3);
  spec.root = 2;
  EXPECT_EQ(PayloadBytes(spec, 3), at_zero);
  EXPECT_EQ(at_zero, 120u);
}

TEST(CollectiveSizesTest, PayloadBytes_MaxCountMaxWorld_NoOverflow) {
  const CollectiveSpec spec =
      Spec(CollectiveKind::kAllToAll, DType::kU64, kMaxCount);
  EXPECT_EQ(PayloadBytes(spec, 4096), kMaxCount * 8 * 4096);
}

TEST(CarriesInlineDataTest, CarriesInlineData_AutoAtLimit_True) {
  const CollectiveSpec spec =
      Spec(CollectiveKind::kAllReduce, DType::kF32, 16, ReduceOp::kSum);
  EXPECT_TRUE(CarriesInlineData(spec, 4, Algorithm::kUnspecified, 64));
  EXPECT_FALSE(CarriesInlineData(spec, 4, Algorithm::kUnspecified, 63));
}

TEST(CarriesInlineDataTest, CarriesInlineData_UsesPayloadOfWholeGroup) {
  // all_gather f32[4] in a group of 4: 16 bytes in, 64 bytes out.
  const CollectiveSpec spec = Spec(CollectiveKind::kAllGather, DType::kF32, 4);
  EXPECT_TRUE(CarriesInlineData(spec, 4, Algorithm::kUnspecified, 64));
  EXPECT_FALSE(CarriesInlineData(spec, 5, Algorithm::kUnspecified, 64));
}

TEST(CarriesInlineDataTest, CarriesInlineData_ForcedInline_TrueAtAnySize) {
  const CollectiveSpec spec =
      Spec(CollectiveKind::kAllReduce, DType::kF32, 1 << 24, ReduceOp::kSum);
  EXPECT_TRUE(CarriesInlineData(spec, 4, Algorithm::kInline, 64));
}

TEST(CarriesInlineDataTest, CarriesInlineData_OtherForced_False) {
  const CollectiveSpec spec =
      Spec(CollectiveKind::kAllReduce, DType::kF32, 1, ReduceOp::kSum);
  for (Algorithm forced :
       {Algorithm::kRing, Algorithm::kRecursiveDoubling, Algorithm::kTree}) {
    EXPECT_FALSE(CarriesInlineData(spec, 4, forced, 1 << 20))
        << AlgorithmName(forced);
  }
}

TEST(CarriesInlineDataTest, CarriesInlineData_Barrier_NeverEvenForced) {
  const CollectiveSpec spec = Spec(CollectiveKind::kBarrier, DType::kF32, 0);
  EXPECT_FALSE(CarriesInlineData(spec, 4, Algorithm::kUnspecified, 1 << 20));
  EXPECT_FALSE(CarriesInlineData(spec, 4, Algorithm::kInline, 1 << 20));
}

TEST(DescribeSpecTest, DescribeSpec_EveryKind_OneLine) {
  EXPECT_EQ(DescribeSpec(Spec(CollectiveKind::kAllReduce, DType::kF32, 1024,
                              ReduceOp::kSum)),
            "all_reduce f32[1024] sum");
  EXPECT_EQ(DescribeSpec(Spec(CollectiveKind::kBroadcast, DType::kI32, 7,
                              ReduceOp::kUnspecified, 1)),
            "broadcast i32[7] root 1");
  EXPECT_EQ(DescribeSpec(Spec(CollectiveKind::kReduce, DType::kF64, 3,
                              ReduceOp::kMax, 2)),
            "reduce f64[3] max root 2");
  EXPECT_EQ(DescribeSpec(Spec(CollectiveKind::kAllGather, DType::kU8, 5,
                              ReduceOp::kSum, 3)),
            "all_gather u8[5]");
  EXPECT_EQ(DescribeSpec(Spec(CollectiveKind::kReduceScatter, DType::kBF16, 2,
                              ReduceOp::kAvg)),
            "reduce_scatter bf16[2] avg");
  EXPECT_EQ(DescribeSpec(Spec(CollectiveKind::kGather, DType::kI64, 4,
                              ReduceOp::kProd, 0)),
            "gather i64[4] root 0");
  EXPECT_EQ(DescribeSpec(Spec(CollectiveKind::kScatter, DType::kU32, 9,
                              ReduceOp::kMin, 3)),
            "scatter u32[9] root 3");
  EXPECT_EQ(DescribeSpec(Spec(CollectiveKind::kAllToAll, DType::kF16, 1)),
            "all_to_all f16[1]");
  EXPECT_EQ(DescribeSpec(Spec(CollectiveKind::kBarrier, DType::kF32, 0,
                              ReduceOp::kSum, 1)),
            "barrier");
}

TEST(SpecsAgreeTest, SpecsAgree_Identical_True) {
  const CollectiveSpec a =
      Spec(CollectiveKind::kReduce, DType::kF32, 8, ReduceOp::kSum, 1);
  EXPECT_TRUE(SpecsAgree(a, a));
}

TEST(SpecsAgreeTest, SpecsAgree_AnyUsedFieldDiffers_False) {
  const CollectiveSpec a =
      Spec(CollectiveKind::kReduce, DType::kF32, 8, ReduceOp::kSum, 1);
  CollectiveSpec b = a;
  b.kind = CollectiveKind::kAllReduce;
  EXPECT_FALSE(SpecsAgree(a, b)) << "kind";
  b = a;
  b.dtype = DType::kF64;
  EXPECT_FALSE(SpecsAgree(a, b)) << "dtype";
  b = a;
  b.count = 9;
  EXPECT_FALSE(SpecsAgree(a, b)) << "count";
  b = a;
  b.op = ReduceOp::kMax;
  EXPECT_FALSE(SpecsAgree(a, b)) << "op";
  b = a;
  b.root = 0;
  EXPECT_FALSE(SpecsAgree(a, b)) << "root";
}

TEST(SpecsAgreeTest, SpecsAgree_UnusedFieldsDiffer_True) {
  // all_reduce has no root; all_gather neither op nor root; barrier nothing.
  EXPECT_TRUE(SpecsAgree(
      Spec(CollectiveKind::kAllReduce, DType::kF32, 8, ReduceOp::kSum, 0),
      Spec(CollectiveKind::kAllReduce, DType::kF32, 8, ReduceOp::kSum, 3)));
  EXPECT_TRUE(SpecsAgree(
      Spec(CollectiveKind::kAllGather, DType::kF32, 8, ReduceOp::kSum, 0),
      Spec(CollectiveKind::kAllGather, DType::kF32, 8, ReduceOp::kMax, 2)));
  EXPECT_TRUE(SpecsAgree(
      Spec(CollectiveKind::kBroadcast, DType::kF32, 8, ReduceOp::kSum, 1),
      Spec(CollectiveKind::kBroadcast, DType::kF32, 8, ReduceOp::kUnspecified,
           1)));
  EXPECT_TRUE(SpecsAgree(
      Spec(CollectiveKind::kBarrier, DType::kF32, 0),
      Spec(CollectiveKind::kBarrier, DType::kI8, 0, ReduceOp::kMax, 5)));
}

TEST(ValidateSpecTest, ValidateSpec_WellFormed_Ok) {
  EXPECT_TRUE(
      ValidateSpec(
          Spec(CollectiveKind::kAllReduce, DType::kF32, 8, ReduceOp::kAvg), 4)
          .ok());
  EXPECT_TRUE(
      ValidateSpec(
          Spec(CollectiveKind::kAllReduce, DType::kF32, 0, ReduceOp::kSum), 4)
          .ok());
  EXPECT_TRUE(ValidateSpec(Spec(CollectiveKind::kBroadcast, DType::kI8, 8,
                                ReduceOp::kUnspecified, 3),
                           4)
                  .ok());
  // The op of a kind that does not reduce, and the root of a kind without
  // one, are not looked at.
  EXPECT_TRUE(ValidateSpec(Spec(CollectiveKind::kAllGather, DType::kU64, 8,
                                static_cast<ReduceOp>(77), -4),
                           4)
                  .ok());
  EXPECT_TRUE(ValidateSpec(Spec(CollectiveKind::kAllReduce, DType::kF32, 8,
                                ReduceOp::kMin, 99),
                           4)
                  .ok());
  EXPECT_TRUE(
      ValidateSpec(Spec(CollectiveKind::kAllToAll, DType::kF32, kMaxCount), 4)
          .ok());
  EXPECT_TRUE(
      ValidateSpec(Spec(CollectiveKind::kBarrier, DType::kUnspecified, 0), 4)
          .ok());
}

struct InvalidSpecCase {
  std::string label;
  CollectiveSpec spec;
  std::string message;
};

TEST(ValidateSpecTest, ValidateSpec_Malformed_InvalidArgument) {
  const std::vector<InvalidSpecCase> cases = {
      {"unspecified kind",
       Spec(CollectiveKind::kUnspecified, DType::kF32, 1, ReduceOp::kSum),
       "unknown collective kind 0"},
      {"unknown kind",
       Spec(static_cast<CollectiveKind>(42), DType::kF32, 1, ReduceOp::kSum),
       "unknown collective kind 42"},
      {"negative kind",
       Spec(static_cast<CollectiveKind>(-1), DType::kF32, 1, ReduceOp::kSum),
       "unknown collective kind -1"},
      {"unspecified dtype",
       Spec(CollectiveKind::kAllReduce, DType::kUnspecified, 1, ReduceOp::kSum),
       ""},
      {"unknown dtype",
       Spec(CollectiveKind::kAllGather, static_cast<DType>(99), 1), ""},
      {"unspecified op",
       Spec(CollectiveKind::kAllReduce, DType::kF32, 1, ReduceOp::kUnspecified),
       ""},
      {"unknown op",
       Spec(CollectiveKind::kReduceScatter, DType::kF32, 1,
            static_cast<ReduceOp>(17)),
       ""},
      {"count over max",
       Spec(CollectiveKind::kAllReduce, DType::kF32, kMaxCount + 1,
            ReduceOp::kSum),
       "count 1099511627777 is over the maximum of 1099511627776"},
      {"huge count",
       Spec(CollectiveKind::kAllReduce, DType::kF32, ~uint64_t{0},
            ReduceOp::kSum),
       ""},
      {"root == world",
       Spec(CollectiveKind::kBroadcast, DType::kF32, 1, ReduceOp::kSum, 4),
       "root 4 is out of range for world size 4"},
      {"negative root",
       Spec(CollectiveKind::kGather, DType::kF32, 1, ReduceOp::kSum, -1),
       "root -1 is out of range for world size 4"},
      {"reduce root out of range",
       Spec(CollectiveKind::kReduce, DType::kF32, 1, ReduceOp::kSum, 7), ""},
      {"barrier with count", Spec(CollectiveKind::kBarrier, DType::kF32, 1),
       "barrier carries no data, got count 1"},
  };
  for (const InvalidSpecCase& c : cases) {
    absl::Status status = ValidateSpec(c.spec, 4);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.label;
    if (!c.message.empty()) {
      EXPECT_EQ(Message(status), c.message) << c.label;
    }
  }
}

TEST(CheckInputSizeTest, CheckInputSize_ExactSize_Ok) {
  const CollectiveSpec spec =
      Spec(CollectiveKind::kReduceScatter, DType::kF32, 4, ReduceOp::kSum);
  EXPECT_TRUE(CheckInputSize(spec, 3, 1, 48).ok());
}

TEST(CheckInputSizeTest, CheckInputSize_OffRootEmptyOrFull_Ok) {
  const CollectiveSpec broadcast =
      Spec(CollectiveKind::kBroadcast, DType::kF32, 4, ReduceOp::kSum, 1);
  EXPECT_TRUE(CheckInputSize(broadcast, 3, 0, 0).ok());
  EXPECT_TRUE(CheckInputSize(broadcast, 3, 0, 16).ok());
  EXPECT_FALSE(CheckInputSize(broadcast, 3, 0, 8).ok());
  EXPECT_FALSE(CheckInputSize(broadcast, 3, 1, 0).ok());
  const CollectiveSpec scatter =
      Spec(CollectiveKind::kScatter, DType::kF32, 4, ReduceOp::kSum, 1);
  EXPECT_TRUE(CheckInputSize(scatter, 3, 2, 0).ok());
  EXPECT_TRUE(CheckInputSize(scatter, 3, 2, 48).ok());
  EXPECT_FALSE(CheckInputSize(scatter, 3, 2, 16).ok());
  EXPECT_TRUE(CheckInputSize(scatter, 3, 1, 48).ok());
  EXPECT_FALSE(CheckInputSize(scatter, 3, 1, 0).ok());
}

TEST(CheckInputSizeTest, CheckInputSize_WrongSize_InvalidArgumentNamingBoth) {
  absl::Status status = CheckInputSize(
      Spec(CollectiveKind::kAllReduce, DType::kF32, 4, ReduceOp::kSum), 2, 0,
      12);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(status),
            "rank 0 passed 12 bytes for all_reduce f32[4] sum in a group of "
            "2; expected 16");
}

TEST(CollectiveNamesTest, CollectiveKindName_RoundTripsThroughParse) {
  for (int v = 1; v <= 10; ++v) {
    const CollectiveKind kind = static_cast<CollectiveKind>(v);
    absl::StatusOr<CollectiveKind> parsed =
        ParseCollectiveKind(CollectiveKindName(kind));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, kind);
  }
  EXPECT_EQ(CollectiveKindName(CollectiveKind::kAllToAll), "all_to_all");
  EXPECT_EQ(CollectiveKindName(CollectiveKind::kSync), "sync");
  EXPECT_EQ(CollectiveKindName(static_cast<CollectiveKind>(11)), "unknown");
  EXPECT_EQ(CollectiveKindName(static_cast<CollectiveKind>(-3)), "unknown");
}

TEST(CollectiveNamesTest, ParseCollectiveKind_LooseSpelling_Accepted) {
  EXPECT_EQ(*ParseCollectiveKind("allreduce"), CollectiveKind::kAllReduce);
  EXPECT_EQ(*ParseCollectiveKind("All-Gather"), CollectiveKind::kAllGather);
  EXPECT_EQ(*ParseCollectiveKind("REDUCE_SCATTER"),
            CollectiveKind::kReduceScatter);
}

TEST(CollectiveNamesTest, ParseCollectiveKind_Unknown_InvalidArgument) {
  for (const char* name : {"", "unspecified", "allreduc", "gossip"}) {
    absl::StatusOr<CollectiveKind> parsed = ParseCollectiveKind(name);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
        << name;
  }
  EXPECT_THAT(Message(ParseCollectiveKind("gossip").status()),
              HasSubstr("\"gossip\""));
}

TEST(NcclRunsSpecTest, NcclRunsSpec_KindsAndTypesAsChorusDefinesThem) {
  auto spec = [](CollectiveKind kind, DType dtype, ReduceOp op) {
    CollectiveSpec s;
    s.kind = kind;
    s.dtype = dtype;
    s.count = 8;
    s.op = op;
    return s;
  };
  EXPECT_TRUE(NcclRunsSpec(
      spec(CollectiveKind::kAllReduce, DType::kF32, ReduceOp::kAvg)));
  EXPECT_TRUE(NcclRunsSpec(
      spec(CollectiveKind::kReduceScatter, DType::kF16, ReduceOp::kMax)));
  EXPECT_TRUE(NcclRunsSpec(
      spec(CollectiveKind::kBroadcast, DType::kU8, ReduceOp::kUnspecified)));
  // Chorus sums f16 in f32 and averages integers in 64 bits.
  EXPECT_FALSE(NcclRunsSpec(
      spec(CollectiveKind::kAllReduce, DType::kF16, ReduceOp::kSum)));
  EXPECT_FALSE(
      NcclRunsSpec(spec(CollectiveKind::kReduce, DType::kI32, ReduceOp::kAvg)));
  EXPECT_FALSE(NcclRunsSpec(
      spec(CollectiveKind::kAllToAll, DType::kF32, ReduceOp::kUnspecified)));
  EXPECT_EQ(CheckForcedAlgorithm(spec(CollectiveKind::kGather, DType::kF32,
                                      ReduceOp::kUnspecified),
                                 Algorithm::kNccl)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CollectiveNamesTest, AlgorithmName_RoundTripsThroughParse) {
  for (int v = 0; v <= 7; ++v) {
    const Algorithm algorithm = static_cast<Algorithm>(v);
    absl::StatusOr<Algorithm> parsed = ParseAlgorithm(AlgorithmName(algorithm));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, algorithm);
  }
  EXPECT_EQ(AlgorithmName(Algorithm::kUnspecified), "auto");
  EXPECT_EQ(AlgorithmName(Algorithm::kRecursiveDoubling), "recursive_doubling");
  EXPECT_EQ(AlgorithmName(Algorithm::kSameHost), "same_host");
  EXPECT_EQ(AlgorithmName(Algorithm::kNccl), "nccl");
  EXPECT_EQ(AlgorithmName(Algorithm::kLeader), "leader");
  EXPECT_EQ(AlgorithmName(static_cast<Algorithm>(8)), "unknown");
  EXPECT_EQ(*ParseAlgorithm("RING"), Algorithm::kRing);
  EXPECT_EQ(ParseAlgorithm("butterfly").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CollectiveNamesTest, KindReducesAndKindHasRoot_MatchTable) {
  const std::vector<CollectiveKind> reduces = {CollectiveKind::kAllReduce,
                                               CollectiveKind::kReduce,
                                               CollectiveKind::kReduceScatter};
  const std::vector<CollectiveKind> rooted = {
      CollectiveKind::kReduce, CollectiveKind::kBroadcast,
      CollectiveKind::kGather, CollectiveKind::kScatter};
  for (int v = 0; v <= 9; ++v) {
    const CollectiveKind kind = static_cast<CollectiveKind>(v);
    EXPECT_EQ(KindReduces(kind),
              std::find(reduces.begin(), reduces.end(), kind) != reduces.end())
        << v;
    EXPECT_EQ(KindHasRoot(kind),
              std::find(rooted.begin(), rooted.end(), kind) != rooted.end())
        << v;
  }
}

}  // namespace
}  // namespace chorus
