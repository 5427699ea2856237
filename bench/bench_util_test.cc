// Unit tests for chorus-bench's pure helpers and its result check.
#include "bench/bench_util.h"

#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_data.h"
#include "gtest/gtest.h"

namespace chorus::bench {
namespace {

TEST(ParseByteSizeTest, ReadsSuffixes) {
  EXPECT_EQ(*ParseByteSize("8"), 8u);
  EXPECT_EQ(*ParseByteSize("8B"), 8u);
  EXPECT_EQ(*ParseByteSize("64K"), 64u << 10);
  EXPECT_EQ(*ParseByteSize("64m"), 64u << 20);
  EXPECT_EQ(*ParseByteSize("64MiB"), 64u << 20);
  EXPECT_EQ(*ParseByteSize("1GB"), uint64_t{1} << 30);
  for (const char* bad : {"", "M", "8X", "8Bi", "8MM", "-1", "99999999999G"}) {
    EXPECT_FALSE(ParseByteSize(bad).ok()) << bad;
  }
  EXPECT_EQ(FormatByteSize(64u << 20), "64M");
  EXPECT_EQ(FormatByteSize(3000), "3000");
}

TEST(MakeSweepTest, DoublesAndCountsElements) {
  absl::StatusOr<std::vector<SweepPoint>> sweep =
      MakeSweep(CollectiveKind::kAllReduce, DType::kF32, 4, 8, 64u << 20, 2);
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  ASSERT_EQ(sweep->size(), 24u);
  EXPECT_EQ(sweep->front().bytes, 8u);
  EXPECT_EQ(sweep->front().count, 2u);
  EXPECT_EQ(sweep->back().bytes, 64u << 20);
  EXPECT_EQ(sweep->back().count, 16u << 20);
}

TEST(MakeSweepTest, PerRankBlocksDropEmptySizes) {
  // all_gather over 4 ranks of f32: 16 bytes is the first size with an
  // element per rank.
  absl::StatusOr<std::vector<SweepPoint>> sweep =
      MakeSweep(CollectiveKind::kAllGather, DType::kF32, 4, 8, 64, 2);
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  ASSERT_EQ(sweep->size(), 3u);
  EXPECT_EQ(sweep->front().bytes, 16u);
  EXPECT_EQ(sweep->front().count, 1u);
  EXPECT_FALSE(
      MakeSweep(CollectiveKind::kAllGather, DType::kF64, 8, 8, 32, 2).ok());
  EXPECT_FALSE(
      MakeSweep(CollectiveKind::kAllReduce, DType::kF32, 2, 64, 8, 2).ok());
  EXPECT_EQ(
      MakeSweep(CollectiveKind::kBarrier, DType::kF32, 2, 8, 64, 2)->size(),
      1u);
}

TEST(BusBandwidthFactorTest, MatchesNcclTests) {
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(CollectiveKind::kAllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(CollectiveKind::kAllGather, 4), 0.75);
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(CollectiveKind::kAllToAll, 2), 0.5);
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(CollectiveKind::kBroadcast, 4), 1.0);
}

TEST(MedianTest, OddAndEven) {
  EXPECT_EQ(Median({}), 0);
  EXPECT_EQ(Median({5, 1, 3}), 3);
  EXPECT_EQ(Median({4, 1, 3, 2}), 2.5);
}

TEST(PercentileTest, NearestRank) {
  EXPECT_EQ(Percentile({}, 0.5), 0);
  const std::vector<int64_t> v = {50, 10, 40, 20, 30, 60, 70, 80, 90, 100};
  EXPECT_EQ(Percentile(v, 0), 10);
  EXPECT_EQ(Percentile(v, 0.1), 10);
  EXPECT_EQ(Percentile(v, 0.11), 20);
  EXPECT_EQ(Percentile(v, 0.9), 90);
  EXPECT_EQ(Percentile(v, 1), 100);
  EXPECT_EQ(Percentile({7, 3, 5}, 0.1), 3);
  EXPECT_EQ(Percentile({7, 3, 5}, 0.9), 7);
}

TEST(ReportTest, RoundTripsAndCombines) {
  RankReport a{3, 1024, 256, "ring", 0, {1000, 3000, 2000}};
  absl::StatusOr<RankReport> parsed = ParseReport(FormatReport(a));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->point, 3);
  EXPECT_EQ(parsed->plan, "ring");
  EXPECT_EQ(parsed->times_ns, a.times_ns);
  EXPECT_FALSE(ParseReport("result 1 2 3 ring 0 2 5").ok());

  RankReport b{3, 1024, 256, "ring", 2, {2000, 1000, 1000}};
  absl::StatusOr<Row> row =
      CombineReports({a, b}, CollectiveKind::kAllReduce, 2);
  ASSERT_TRUE(row.ok()) << row.status();
  // Slowest per iteration: 2000, 3000, 2000; median 2000 ns.
  EXPECT_DOUBLE_EQ(row->time_us, 2.0);
  EXPECT_DOUBLE_EQ(row->min_us, 2.0);
  EXPECT_DOUBLE_EQ(row->max_us, 3.0);
  EXPECT_EQ(FormatCsvRow(*row),
            "1024,256,ring,3,2.000,2.000,2.000,3.000,3.000,0.512000,0.512000,"
            "2\n");
  EXPECT_DOUBLE_EQ(row->algbw_gbps, 1024 / 2.0 / 1e3);
  EXPECT_DOUBLE_EQ(row->busbw_gbps, row->algbw_gbps);
  EXPECT_EQ(row->wrong, 2u);
  EXPECT_EQ(row->plan, "ring");
  b.plan = "inline";
  EXPECT_EQ(CombineReports({a, b}, CollectiveKind::kAllReduce, 2)->plan,
            "ring/inline");
  b.times_ns.pop_back();
  EXPECT_FALSE(CombineReports({a, b}, CollectiveKind::kAllReduce, 2).ok());
}

// The all-reduce a group of `world` would compute, summed naively.
template <typename T>
std::string NaiveAllReduceSum(int world, uint64_t count) {
  std::vector<T> sum(count, T{});
  for (int r = 0; r < world; ++r) {
    std::vector<T> in(count);
    FillInput(CollectiveKind::kAllReduce, ReduceOp::kSum, r, in);
    for (uint64_t i = 0; i < count; ++i) sum[i] += in[i];
  }
  return std::string(reinterpret_cast<const char*>(sum.data()),
                     count * sizeof(T));
}

TEST(CountWrongTest, AcceptsTheReductionAndCountsDifferences) {
  CollectiveSpec spec;
  spec.kind = CollectiveKind::kAllReduce;
  spec.dtype = DType::kF32;
  spec.op = ReduceOp::kSum;
  spec.count = 1000;
  std::string out = NaiveAllReduceSum<float>(4, spec.count);
  EXPECT_EQ(CountWrong<float>(spec, 4, 0, out), 0u);
  const float bad = 12345;
  std::memcpy(out.data() + 7 * sizeof(float), &bad, sizeof(bad));
  std::memcpy(out.data() + 999 * sizeof(float), &bad, sizeof(bad));
  EXPECT_EQ(CountWrong<float>(spec, 4, 0, out), 2u);
  EXPECT_EQ(CountWrong<float>(spec, 4, 0, out.substr(4)), 1000u);
}

TEST(CountWrongTest, ChecksBlocksOfOtherRanks) {
  CollectiveSpec spec;
  spec.kind = CollectiveKind::kAllGather;
  spec.dtype = DType::kI32;
  spec.count = 5;
  std::vector<int32_t> out;
  for (int r = 0; r < 3; ++r) {
    std::vector<int32_t> block(spec.count);
    FillInput(spec.kind, spec.op, r, block);
    out.insert(out.end(), block.begin(), block.end());
  }
  std::string bytes(reinterpret_cast<const char*>(out.data()),
                    out.size() * sizeof(int32_t));
  EXPECT_EQ(CountWrong<int32_t>(spec, 3, 1, bytes), 0u);
  // Blocks swapped: every element of both is wrong.
  std::swap_ranges(out.begin(), out.begin() + 5, out.begin() + 5);
  bytes.assign(reinterpret_cast<const char*>(out.data()),
               out.size() * sizeof(int32_t));
  EXPECT_EQ(CountWrong<int32_t>(spec, 3, 1, bytes), 10u);
}

}  // namespace
}  // namespace chorus::bench
