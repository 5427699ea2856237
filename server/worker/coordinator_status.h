// Statuses of a worker's calls to the coordinator that name the coordinator
// when it is the party that did not answer. gRPC ends a call whose deadline
// passed with its own bare "Deadline Exceeded", and a call it could not
// deliver with a transport message; a rank that gets either should learn
// that the coordinator (at which address, for which call, after how long)
// is the one that was silent, not a peer. The coordinator's own verdicts
// (which end before the caller's deadline, see answer_margin.h) pass
// unchanged.
//
// Thread safety: pure functions.
#ifndef CHORUS_SERVER_WORKER_COORDINATOR_STATUS_H_
#define CHORUS_SERVER_WORKER_COORDINATOR_STATUS_H_

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace chorus {

// Returns DEADLINE_EXCEEDED: "the coordinator at <address> did not answer
// <what> within <waited>".
absl::Status CoordinatorSilentError(absl::string_view address,
                                    absl::string_view what,
                                    absl::Duration waited);

// Returns `status` of a call about `what` to the coordinator at `address`
// that was sent at `start` and has just ended: CoordinatorSilentError for
// gRPC's own deadline, UNAVAILABLE "the coordinator at <address> is
// unreachable (<what>): ..." for a call gRPC could not deliver, else the
// status as it came.
absl::Status FromCoordinator(const grpc::Status& status,
                             absl::string_view address, absl::string_view what,
                             absl::Time start);

// Returns `d` cut for a message: to the millisecond below a second, to
// a tenth of a second above.
std::string RoundedDuration(absl::Duration d);

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_COORDINATOR_STATUS_H_
