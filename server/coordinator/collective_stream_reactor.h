// CollectiveStreamReactor: the coordinator's side of one
// Coordinator.CollectiveStream. Each request read from the stream goes into
// the group table exactly as a unary Collective call would (through the
// host), and each verdict is written back as a reply carrying the call id
// the client chose, as soon as it comes. Replies are queued: one write is in
// flight at a time.
//
// The stream finishes with OK once the client half-closed and every call
// read was answered, with UNAVAILABLE after End(), or at once when the
// client cancels it or the connection breaks (late verdicts are dropped).
//
// Lifecycle: created by the service for each incoming stream; deletes itself
// once gRPC called OnDone and no verdict or Hold() is outstanding.
// Thread safety: gRPC's reactions, the group table's verdict callbacks and
// End() may run concurrently on any threads.
#ifndef CHORUS_SERVER_COORDINATOR_COLLECTIVE_STREAM_REACTOR_H_
#define CHORUS_SERVER_COORDINATOR_COLLECTIVE_STREAM_REACTOR_H_

#include <grpcpp/support/server_callback.h>

#include <deque>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"
#include "server/coordinator/collective_proto.h"
#include "server/coordinator/group_table.h"

namespace chorus {

class CollectiveStreamReactor;

// What a collective stream needs from the service that serves it.
class CollectiveStreamHost : public CollectiveCallHost {
 public:
  // Called once, from OnDone, before the reactor may be deleted.
  virtual void StreamDone(CollectiveStreamReactor* stream) = 0;
};

class CollectiveStreamReactor final
    : public grpc::ServerBidiReactor<v1::CollectiveStreamRequest,
                                     v1::CollectiveStreamReply> {
 public:
  // Starts reading. `host` is not owned and must outlive the reactor.
  explicit CollectiveStreamReactor(CollectiveStreamHost* host);

  // Finishes the stream with `status` once the replies already queued were
  // written; later verdicts are dropped. Idempotent.
  void End(const absl::Status& status);

  // Keeps the reactor from being deleted until the matching Release().
  void Hold();
  void Release();

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  // Queues `reply` and starts writing it when no write
  // is in flight.
  void Reply(v1::CollectiveStreamReply reply);
  // Returns whether the stream must be finished now, with `status` set, and
  // then marks it finished: when no write is in flight and it is ending
  // (End(), cancellation, a failed write) or the client half-closed and
  // every call read was answered.
  bool ShouldFinishLocked(grpc::Status* status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  CollectiveStreamHost* const host_;  // not owned
  v1::CollectiveStreamRequest request_;

  absl::Mutex mu_;
  // Replies not yet written; the front one is being written while
  // `writing_`.
  std::deque<v1::CollectiveStreamReply> replies_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  // Calls read whose verdict has not come.
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  int holds_ ABSL_GUARDED_BY(mu_) = 0;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  // Set by End() or a failed write: finish with end_status_.
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_COLLECTIVE_STREAM_REACTOR_H_
