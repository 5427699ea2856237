#include "client/src/membership_hold.h"

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace chorus {
namespace {

// How long Release() waits for the daemon to take the release.
constexpr absl::Duration kReleaseWait = absl::Seconds(2);

}  // namespace

MembershipHold::MembershipHold(v1::WorkerLocal::Stub* stub,
                               const std::string& group, uint64_t epoch,
                               int rank) {
  first_.set_group(group);
  first_.set_epoch(epoch);
  first_.set_rank(rank);
  release_.set_release(true);
  // No deadline: nothing waits for the hold; Release() ends it.
  stub->async()->HoldMembership(&context_, &reply_, this);
  StartWrite(&first_);
  StartCall();
}

void MembershipHold::OnWriteDone(bool ok) {
  bool start_release = false;
  {
    absl::MutexLock lock(&mu_);
    if (!first_written_) {
      first_written_ = true;
      start_release = ok && release_wanted_ && !release_started_;
      if (start_release) release_started_ = true;
    }
  }
  if (start_release) StartWriteLast(&release_, grpc::WriteOptions());
}

void MembershipHold::OnDone(const grpc::Status& status) { done_.Notify(); }

void MembershipHold::Release() {
  bool start_release = false;
  bool first_call = false;
  {
    absl::MutexLock lock(&mu_);
    first_call = !release_wanted_;
    release_wanted_ = true;
    // One write at a time: with the first still going, OnWriteDone sends
    // the release.
    start_release = first_call && first_written_ && !done_.HasBeenNotified();
    if (start_release) release_started_ = true;
  }
  if (start_release) StartWriteLast(&release_, grpc::WriteOptions());
  if (first_call && !done_.WaitForNotificationWithTimeout(kReleaseWait)) {
    context_.TryCancel();
  }
  done_.WaitForNotification();
}

}  // namespace chorus
