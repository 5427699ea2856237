#include "common/rank_list.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace chorus {

std::string FormatRanks(const std::vector<int>& ranks) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (j - i >= 2) {
      parts.push_back(absl::StrCat(ranks[i], "-", ranks[j]));
    } else {
      for (size_t k = i; k <= j; ++k) parts.push_back(absl::StrCat(ranks[k]));
    }
    i = j + 1;
  }
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ",
                      absl::StrJoin(parts, ", "));
}

std::string DescribeByRank(const std::vector<std::string>& by_rank) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> ranks_of;
  for (int rank = 0; rank < static_cast<int>(by_rank.size()); ++rank) {
    std::vector<int>& ranks = ranks_of[by_rank[rank]];
    if (ranks.empty()) order.push_back(by_rank[rank]);
    ranks.push_back(rank);
  }
  std::vector<std::string> parts;
  for (const std::string& entry : order) {
    parts.push_back(absl::StrCat(FormatRanks(ranks_of[entry]), ": ", entry));
  }
  return absl::StrJoin(parts, "; ");
}

std::string RankOfGroup(absl::string_view group, int rank,
                        absl::string_view worker) {
  std::string out = absl::StrCat("rank ", rank, " of group ", group);
  if (!worker.empty()) absl::StrAppend(&out, " on worker ", worker);
  return out;
}

}  // namespace chorus
