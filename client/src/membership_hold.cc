#include "client/src/membership_hold.h"

#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace chorus {
namespace {

// How long Release() waits for the daemon to take the release.
constexpr absl::Duration kReleaseWait = absl::Seconds(2);

}  // namespace

MembershipHold::MembershipHold(v1::WorkerLocal::Stub* stub,
                               const std::string& group, uint64_t epoch,
                               int rank)
    : group_(group) {
  v1::MembershipHold first;
  first.set_group(group);
  first.set_epoch(epoch);
  first.set_rank(rank);
  // No deadline: nothing waits for the hold; Release() ends it.
  stub->async()->HoldMembership(&context_, &reply_, this);
  bool write = false;
  {
    absl::MutexLock lock(&mu_);
    queued_.push_back(std::move(first));
    write = TakeNextLocked();
  }
  if (write) StartWriting();
  StartCall();
}

bool MembershipHold::TakeNextLocked() {
  if (write_pending_ || broken_ || queued_.empty()) return false;
  writing_ = std::move(queued_.front());
  queued_.pop_front();
  write_pending_ = true;
  return true;
}

void MembershipHold::StartWriting() {
  // writing_ stays as it is until its OnWriteDone; the write starts outside
  // the lock, as gRPC may react on the thread that starts it.
  if (writing_.release()) {
    StartWriteLast(&writing_, grpc::WriteOptions());
  } else {
    StartWrite(&writing_);
  }
}

void MembershipHold::OnWriteDone(bool ok) {
  bool write = false;
  {
    absl::MutexLock lock(&mu_);
    write_pending_ = false;
    if (!ok) broken_ = true;
    write = TakeNextLocked();
  }
  if (write) StartWriting();
}

void MembershipHold::OnDone(const grpc::Status& status) { done_.Notify(); }

void MembershipHold::Move(uint64_t epoch, int rank) {
  bool write = false;
  {
    absl::MutexLock lock(&mu_);
    if (released_) return;
    v1::MembershipHold hold;
    hold.set_group(group_);
    hold.set_epoch(epoch);
    hold.set_rank(rank);
    queued_.push_back(std::move(hold));
    write = TakeNextLocked();
  }
  if (write) StartWriting();
}

void MembershipHold::Release() {
  bool first_call = false;
  bool write = false;
  {
    absl::MutexLock lock(&mu_);
    first_call = !released_;
    released_ = true;
    if (first_call && !done_.HasBeenNotified()) {
      v1::MembershipHold release;
      release.set_release(true);
      queued_.push_back(std::move(release));
      write = TakeNextLocked();
    }
  }
  if (write) StartWriting();
  if (first_call && !done_.WaitForNotificationWithTimeout(kReleaseWait)) {
    context_.TryCancel();
  }
  done_.WaitForNotification();
}

}  // namespace chorus
