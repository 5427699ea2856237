// Conversions between chorus.v1 collective messages and the group table's
// calls and outcomes, shared by the unary Collective call and the
// collective stream so both take exactly the same path into the core.
//
// Pure functions; thread-safe.
#ifndef CHORUS_SERVER_COORDINATOR_COLLECTIVE_PROTO_H_
#define CHORUS_SERVER_COORDINATOR_COLLECTIVE_PROTO_H_

#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"
#include "server/coordinator/group_table.h"

namespace chorus {

// Returns the group table's call for `request`, ending at `deadline`. The
// inline data is copied; the group table validates the rest.
CollectiveCall CollectiveCallFromProto(const v1::CollectiveRequest& request,
                                       absl::Time deadline);

// Fills `response` with `outcome` (its inline data is moved).
void CollectiveOutcomeToProto(CollectiveOutcome outcome,
                              v1::CollectiveResponse* response);

// Returns when the core should end a waiting call that arrived at `now`
// from a client whose own deadline is `client_deadline` (InfiniteFuture()
// for none): at most `max_wait` away, and a little before the client gives
// up (a tenth of the time left, between 5 ms and 250 ms), so the client
// receives the descriptive DEADLINE_EXCEEDED rather than its own bare one.
absl::Time CoreDeadline(absl::Time now, absl::Time client_deadline,
                        absl::Duration max_wait);

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_COLLECTIVE_PROTO_H_
