// Conversions between chorus.v1 collective messages and the group table's
// calls and outcomes, shared by the unary Collective call, the collective
// stream and the call port so all take exactly the same path into the core.
//
// Pure functions; thread-safe.
#ifndef CHORUS_SERVER_COORDINATOR_COLLECTIVE_PROTO_H_
#define CHORUS_SERVER_COORDINATOR_COLLECTIVE_PROTO_H_

#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"
#include "server/coordinator/group_table.h"

namespace chorus {

// Returns the group table's call for `request`, ending at `deadline`. The
// inline data is copied; the group table validates the rest.
CollectiveCall CollectiveCallFromProto(const v1::CollectiveRequest& request,
                                       absl::Time deadline);

// Returns the group table's commit for `request`, ending at `deadline`.
CommitCall CommitCallFromProto(const v1::CommitRequest& request,
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

// What serves collective calls into the core: the coordinator's service.
class CollectiveCallHost {
 public:
  virtual ~CollectiveCallHost() = default;
  // Takes one collective call into the core, exactly as the unary
  // Collective does, for a client whose deadline is `client_deadline`;
  // `done` runs once with the verdict, on any thread, possibly before this
  // returns.
  virtual void StartCollective(const v1::CollectiveRequest& request,
                               absl::Time client_deadline,
                               GroupTable::CollectiveCallback done) = 0;
  // Takes one commit into the core, exactly as the unary Commit does;
  // `done` runs once with the verdict, on any thread.
  virtual void StartCommit(const v1::CommitRequest& request,
                           absl::Time client_deadline,
                           std::function<void(absl::Status)> done) = 0;
  // The current time on the core's clock.
  virtual absl::Time Now() = 0;
};

// The reply to call `call_id` with `outcome`.
v1::CollectiveStreamReply StreamReply(
    uint64_t call_id, absl::StatusOr<CollectiveOutcome> outcome);

// Takes one streamed call (from a collective stream or the call port) into
// `host`: refuses a request with neither or both of a call and a commit, or
// with a negative timeout, at once (INVALID_ARGUMENT), else starts it with
// the deadline its timeout gives. `reply` runs once, on any thread, possibly
// before this returns.
void StartStreamedCall(CollectiveCallHost& host,
                       const v1::CollectiveStreamRequest& request,
                       std::function<void(v1::CollectiveStreamReply)> reply);

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_COLLECTIVE_PROTO_H_
