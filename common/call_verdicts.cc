#include "common/call_verdicts.h"

#include "absl/strings/str_cat.h"
#include "common/rank_list.h"
#include "common/status_detail.h"

namespace chorus {

std::string DescribeAsked(const CollectiveSpec& spec, Algorithm forced) {
  std::string asked = DescribeSpec(spec);
  if (forced != Algorithm::kUnspecified) {
    absl::StrAppend(&asked, " algorithm ", AlgorithmName(forced));
  }
  return asked;
}

absl::Status MismatchError(absl::string_view group, uint64_t epoch,
                           uint64_t sequence,
                           const std::vector<std::string>& asked) {
  v1::ErrorDetail detail = MakeErrorDetail("MISMATCH", group, epoch, sequence);
  for (int rank = 0; rank < static_cast<int>(asked.size()); ++rank) {
    (*detail.mutable_ranks())[rank] = asked[rank];
  }
  return WithErrorDetail(
      absl::InvalidArgumentError(absl::StrCat(
          "collective #", sequence, " of group ", group,
          " does not match across ranks: ", DescribeByRank(asked))),
      detail);
}

absl::Status RanksMissingError(absl::string_view group, uint64_t epoch,
                               uint64_t sequence, CollectiveKind kind,
                               const std::vector<int>& missing) {
  v1::ErrorDetail detail =
      MakeErrorDetail("RANKS_MISSING", group, epoch, sequence);
  for (int rank : missing) detail.add_missing_ranks(rank);
  return WithErrorDetail(
      absl::DeadlineExceededError(absl::StrCat(
          FormatRanks(missing), " of group ", group, " did not reach ",
          CollectiveKindName(kind), " #", sequence, " within the deadline")),
      detail);
}

}  // namespace chorus
