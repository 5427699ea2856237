// CollectiveStreamClient: a worker's collective calls to the coordinator,
// carried on one long-lived Coordinator.CollectiveStream instead of one
// unary Collective RPC each. Concurrent calls share the stream and are told
// apart by a call id; each reply goes to its call.
//
// Every call ends by its own deadline: the coordinator learns the time left
// (CollectiveStreamRequest.timeout_us) and answers DEADLINE_EXCEEDED naming
// the missing ranks a little before it, and a deadline thread here ends a
// call whose deadline passed without an answer with DEADLINE_EXCEEDED (its
// late reply is then dropped). When the stream breaks (the coordinator died
// or restarted, the connection failed) its calls in flight end with
// UNAVAILABLE, as a unary call would; the next call opens a new stream. The
// stream itself has a long deadline (`stream_lifetime`): a call that would
// outlive it goes on a fresh stream, and the old one is half-closed and ends
// once its calls were answered.
//
// Lifecycle: construct with a stub that outlives the client; Shutdown() (or
// the destructor) ends every call in flight with UNAVAILABLE and waits until
// every stream ended. Thread safety: Start() and Call() may be called
// concurrently from any threads.
#ifndef CHORUS_SERVER_WORKER_COLLECTIVE_STREAM_CLIENT_H_
#define CHORUS_SERVER_WORKER_COLLECTIVE_STREAM_CLIENT_H_

#include <cstdint>
#include <functional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "server/common/wakeup_loop.h"

namespace chorus {

class CollectiveStreamClient {
 public:
  using Callback = std::function<void(absl::StatusOr<v1::CollectiveResponse>)>;

  // `stub` is not owned. A stream's own deadline is `stream_lifetime` after
  // it opened.
  explicit CollectiveStreamClient(
      v1::Coordinator::Stub* stub,
      absl::Duration stream_lifetime = absl::Hours(24));
  ~CollectiveStreamClient();

  CollectiveStreamClient(const CollectiveStreamClient&) = delete;
  CollectiveStreamClient& operator=(const CollectiveStreamClient&) = delete;

  // Sends `request` and runs `done` once with the coordinator's verdict (the
  // response, or the codes of Coordinator.Collective), DEADLINE_EXCEEDED
  // when `deadline` passed first, or UNAVAILABLE when the stream broke or
  // the client shut down. `done` runs on a gRPC thread, the deadline thread,
  // or (for a call that fails at once) the caller's; it must not block.
  void Start(v1::CollectiveRequest request, absl::Time deadline, Callback done);

  // Start() that blocks its caller until the call ended; returns what
  // `done` would get.
  absl::StatusOr<v1::CollectiveResponse> Call(v1::CollectiveRequest request,
                                              absl::Time deadline);

  // Ends every call in flight with UNAVAILABLE, cancels the streams and
  // waits until they ended; later calls fail with UNAVAILABLE. Idempotent.
  void Shutdown();

 private:
  class Stream;

  struct PendingCall {
    Callback done;
    absl::Time deadline;
    Stream* stream = nullptr;
  };
  // A write, half-close or release a stream needs after the lock is let go.
  struct StreamActions;

  // Runs on the deadline thread: ends the calls whose deadline passed and
  // returns the next deadline.
  absl::Time ExpireCalls();
  // Takes call `call_id` out of the tables if it is still pending on
  // `stream`; returns its callback (empty when it is not).
  Callback TakeCallLocked(uint64_t call_id, const Stream* stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next write or half-close `stream` needs, or nothing. From outside
  // the stream's reactions (`external`) it is counted, so the stream's hold
  // stays until PerformExternal() did it.
  StreamActions NextActionsLocked(Stream* stream, bool external = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Performs `actions` (without the lock) from outside a reaction.
  void PerformExternal(Stream* stream, StreamActions actions);

  v1::Coordinator::Stub* const stub_;  // not owned
  const absl::Duration stream_lifetime_;

  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  // The stream new calls go on; nullptr until the next call opens one.
  Stream* current_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Every stream whose OnDone has not run.
  absl::flat_hash_set<Stream*> streams_ ABSL_GUARDED_BY(mu_);
  uint64_t next_call_id_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, PendingCall> calls_ ABSL_GUARDED_BY(mu_);
  absl::btree_set<std::pair<absl::Time, uint64_t>> deadlines_
      ABSL_GUARDED_BY(mu_);
  // When the deadline thread looks next; a call with an earlier deadline
  // pokes it.
  absl::Time next_expiry_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  WakeupLoop expiry_loop_;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_COLLECTIVE_STREAM_CLIENT_H_
