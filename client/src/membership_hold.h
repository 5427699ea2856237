// MembershipHold: the client side of WorkerLocal.HoldMembership. While it
// lives, the daemon knows the rank's process lives; if the process dies,
// the stream ends without a release and the daemon reports the rank gone,
// so the other ranks' calls end at once. Move() names the rank's
// membership of an elastic group's new epoch on the same stream. Release()
// (or the destructor) tells the daemon the rank leaves on purpose.
//
// Lifecycle: made right after a join through the daemon; Release() waits
// (at most a short while) for the daemon to take the release, cancelling
// the stream after that. Thread safety: thread-safe; gRPC's reactions run
// on its threads.
#ifndef CHORUS_CLIENT_SRC_MEMBERSHIP_HOLD_H_
#define CHORUS_CLIENT_SRC_MEMBERSHIP_HOLD_H_

#include <grpcpp/client_context.h>
#include <grpcpp/support/client_callback.h>

#include <cstdint>
#include <deque>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "chorus/v1/worker.grpc.pb.h"

namespace chorus {

class MembershipHold final
    : public grpc::ClientWriteReactor<v1::MembershipHold> {
 public:
  // Starts holding `rank` of `group` at `epoch` through `stub` (which must
  // outlive this).
  MembershipHold(v1::WorkerLocal::Stub* stub, const std::string& group,
                 uint64_t epoch, int rank);
  ~MembershipHold() override { Release(); }
  MembershipHold(const MembershipHold&) = delete;
  MembershipHold& operator=(const MembershipHold&) = delete;

  // The rank is now `rank` of its group's epoch `epoch`. Does nothing once
  // released.
  void Move(uint64_t epoch, int rank);

  // Sends the release and waits until the stream ended (cancelling it
  // after a short while). Idempotent.
  void Release();

  void OnWriteDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  // Takes the next queued hold into writing_ unless one is being written;
  // returns whether StartWriting() must then start it.
  bool TakeNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts writing writing_ (without mu_).
  void StartWriting();

  const std::string group_;
  grpc::ClientContext context_;
  v1::MembershipHoldReply reply_;
  absl::Mutex mu_;
  // The hold being written, and those waiting their turn.
  // Written by TakeNextLocked(), read by StartWriting() and gRPC until the
  // write is done.
  v1::MembershipHold writing_;
  bool write_pending_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<v1::MembershipHold> queued_ ABSL_GUARDED_BY(mu_);
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  // Notified by OnDone, gRPC's last use of this object.
  absl::Notification done_;
};

}  // namespace chorus

#endif  // CHORUS_CLIENT_SRC_MEMBERSHIP_HOLD_H_
