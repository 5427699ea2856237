// Wording for sets of ranks in status messages: "rank 2", "ranks 2, 3",
// "ranks 0-511, 513", and per-rank accounts that fold identical entries
// ("ranks 0-2: all_reduce f32[1024] sum; rank 3: all_reduce f32[2048] sum").
//
// Pure functions; thread-safe.
#ifndef CHORUS_COMMON_RANK_LIST_H_
#define CHORUS_COMMON_RANK_LIST_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace chorus {

// `ranks` ascending. Runs of three or more consecutive ranks become ranges.
std::string FormatRanks(const std::vector<int>& ranks);

// `by_rank[r]` is what rank r did. Ranks with the same entry are listed
// together, in order of each entry's first rank.
std::string DescribeByRank(const std::vector<std::string>& by_rank);

// Returns "rank <rank> of group <group>", followed by " on worker <worker>"
// when `worker` (the name of the worker that holds the rank) is not empty.
std::string RankOfGroup(absl::string_view group, int rank,
                        absl::string_view worker);

}  // namespace chorus

#endif  // CHORUS_COMMON_RANK_LIST_H_
