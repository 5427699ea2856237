#include "common/rank_list.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace chorus {
namespace {

std::vector<int> Range(int first, int last) {
  std::vector<int> ranks;
  for (int r = first; r <= last; ++r) ranks.push_back(r);
  return ranks;
}

TEST(FormatRanksTest, FormatRanks_OneRank_Singular) {
  EXPECT_EQ(FormatRanks({2}), "rank 2");
  EXPECT_EQ(FormatRanks({0}), "rank 0");
}

TEST(FormatRanksTest, FormatRanks_TwoConsecutive_ListedNotRanged) {
  EXPECT_EQ(FormatRanks({2, 3}), "ranks 2, 3");
}

TEST(FormatRanksTest, FormatRanks_ThreeConsecutive_Range) {
  EXPECT_EQ(FormatRanks({0, 1, 2}), "ranks 0-2");
}

TEST(FormatRanksTest, FormatRanks_LongRunThenGap_RangeAndSingle) {
  std::vector<int> ranks = Range(0, 511);
  ranks.push_back(513);
  EXPECT_EQ(FormatRanks(ranks), "ranks 0-511, 513");
}

TEST(FormatRanksTest, FormatRanks_Scattered_EachListed) {
  EXPECT_EQ(FormatRanks({1, 3, 5}), "ranks 1, 3, 5");
}

TEST(FormatRanksTest, FormatRanks_Mixed_RangesOnlyForRunsOfThree) {
  EXPECT_EQ(FormatRanks({0, 1, 3, 4, 5, 9, 10, 11, 12, 20}),
            "ranks 0, 1, 3-5, 9-12, 20");
}

TEST(DescribeByRankTest, DescribeByRank_AllDifferent_OneEntryPerRank) {
  EXPECT_EQ(
      DescribeByRank({"all_reduce f32[1024] sum", "all_reduce f32[2048] sum"}),
      "rank 0: all_reduce f32[1024] sum; "
      "rank 1: all_reduce f32[2048] sum");
}

TEST(DescribeByRankTest, DescribeByRank_IdenticalRun_Folded) {
  EXPECT_EQ(
      DescribeByRank({"all_reduce f32[1024] sum", "all_reduce f32[1024] sum",
                      "all_reduce f32[1024] sum", "all_reduce f32[2048] sum"}),
      "ranks 0-2: all_reduce f32[1024] sum; "
      "rank 3: all_reduce f32[2048] sum");
}

TEST(DescribeByRankTest, DescribeByRank_Interleaved_OrderedByFirstRank) {
  EXPECT_EQ(DescribeByRank({"b", "a", "b", "a", "c"}),
            "ranks 0, 2: b; ranks 1, 3: a; rank 4: c");
}

TEST(DescribeByRankTest, DescribeByRank_AllSame_OneEntry) {
  EXPECT_EQ(DescribeByRank(std::vector<std::string>(600, "barrier")),
            "ranks 0-599: barrier");
}

TEST(DescribeByRankTest, DescribeByRank_SingleRank_Singular) {
  EXPECT_EQ(DescribeByRank({"barrier"}), "rank 0: barrier");
}

TEST(RankOfGroupTest, RankOfGroup_WithAndWithoutWorker) {
  EXPECT_EQ(RankOfGroup("g", 1, "host-2"),
            "rank 1 of group g on worker host-2");
  EXPECT_EQ(RankOfGroup("g", 0, ""), "rank 0 of group g");
}

}  // namespace
}  // namespace chorus
