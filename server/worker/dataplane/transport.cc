#include "server/worker/dataplane/transport.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/rank_list.h"
#include "common/status_detail.h"

namespace chorus {
namespace {

// `status` with a PEER_LOST detail naming rank `rank` of `group`: an
// elastic group goes on without it (ReportFailure's lost_ranks).
absl::Status PeerLost(absl::Status status, absl::string_view group, int rank) {
  v1::ErrorDetail detail =
      MakeErrorDetail("PEER_LOST", std::string(group), 0, 0);
  detail.add_lost_ranks(rank);
  return WithErrorDetail(status, detail);
}

}  // namespace

absl::Status PeerGoneError(absl::string_view group, int rank,
                           absl::string_view worker, absl::string_view peer) {
  return PeerLost(absl::UnavailableError(absl::StrCat(
                      RankOfGroup(group, rank, worker),
                      " is gone: its data-plane stream from ", peer, " broke")),
                  group, rank);
}

absl::Status UnreachableError(absl::string_view group, int to,
                              absl::string_view worker,
                              const absl::Status& cause) {
  const absl::StatusCode code =
      absl::IsDeadlineExceeded(cause) || absl::IsInvalidArgument(cause)
          ? cause.code()
          : absl::StatusCode::kUnavailable;
  const absl::Status status(code,
                            absl::StrCat(RankOfGroup(group, to, worker),
                                         " unreachable: ", cause.message()));
  // A peer that answers too slowly is not known to be gone.
  return code == absl::StatusCode::kUnavailable ? PeerLost(status, group, to)
                                                : status;
}

}  // namespace chorus
