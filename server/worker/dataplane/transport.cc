#include "server/worker/dataplane/transport.h"

#include "absl/strings/str_cat.h"

namespace chorus {

absl::Status PeerGoneError(absl::string_view group, int rank,
                           absl::string_view peer) {
  return absl::UnavailableError(
      absl::StrCat("rank ", rank, " of group ", group,
                   " is gone: its data-plane stream from ", peer, " broke"));
}

absl::Status UnreachableError(absl::string_view group, int to,
                              const absl::Status& cause) {
  const absl::StatusCode code =
      absl::IsDeadlineExceeded(cause) || absl::IsInvalidArgument(cause)
          ? cause.code()
          : absl::StatusCode::kUnavailable;
  return absl::Status(code, absl::StrCat("rank ", to, " of group ", group,
                                         " unreachable: ", cause.message()));
}

}  // namespace chorus
