#include "server/worker/coordinator_status.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"

namespace chorus {

std::string RoundedDuration(absl::Duration d) {
  const absl::Duration unit =
      d >= absl::Seconds(1) ? absl::Milliseconds(100) : absl::Milliseconds(1);
  return absl::FormatDuration(absl::Trunc(d, unit));
}

absl::Status CoordinatorSilentError(absl::string_view address,
                                    absl::string_view what,
                                    absl::Duration waited) {
  return absl::DeadlineExceededError(
      absl::StrCat("the coordinator at ", address, " did not answer ", what,
                   " within ", RoundedDuration(waited)));
}

absl::Status FromCoordinator(const grpc::Status& status,
                             absl::string_view address, absl::string_view what,
                             absl::Time start) {
  // The texts gRPC's client library gives a call the server never answered;
  // the coordinator's own verdicts always say what they are about.
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
      status.error_message() == "Deadline Exceeded") {
    return CoordinatorSilentError(address, what, absl::Now() - start);
  }
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE &&
      !absl::StartsWith(status.error_message(), "the coordinator")) {
    return absl::UnavailableError(absl::StrCat("the coordinator at ", address,
                                               " is unreachable (", what,
                                               "): ", status.error_message()));
  }
  return FromGrpcStatus(status);
}

}  // namespace chorus
