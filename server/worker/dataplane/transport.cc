#include "server/worker/dataplane/transport.h"

#include "absl/strings/str_cat.h"
#include "server/common/rank_list.h"

namespace chorus {

absl::Status PeerGoneError(absl::string_view group, int rank,
                           absl::string_view worker, absl::string_view peer) {
  return absl::UnavailableError(
      absl::StrCat(RankOfGroup(group, rank, worker),
                   " is gone: its data-plane stream from ", peer, " broke"));
}

absl::Status UnreachableError(absl::string_view group, int to,
                              absl::string_view worker,
                              const absl::Status& cause) {
  const absl::StatusCode code =
      absl::IsDeadlineExceeded(cause) || absl::IsInvalidArgument(cause)
          ? cause.code()
          : absl::StatusCode::kUnavailable;
  return absl::Status(code, absl::StrCat(RankOfGroup(group, to, worker),
                                         " unreachable: ", cause.message()));
}

}  // namespace chorus
