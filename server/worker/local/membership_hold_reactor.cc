#include "server/worker/local/membership_hold_reactor.h"

#include <utility>

#include "absl/status/status.h"
#include "common/grpc_status.h"

namespace chorus {

MembershipHoldReactor::MembershipHoldReactor(LocalCalls* calls,
                                             std::string peer)
    : calls_(calls), peer_(std::move(peer)) {
  StartRead(&hold_);
}

void MembershipHoldReactor::OnReadDone(bool ok) {
  if (!ok) {
    // The stream ended without a release: the client went away (or
    // half-closed without saying it leaves, which is the same to peers).
    if (!held_) {
      Finish(ToGrpcStatus(absl::InvalidArgumentError(
          "the hold ended before naming a membership")));
      return;
    }
    calls_->EndHold(membership_, /*released=*/false, peer_);
    Finish(grpc::Status::OK);
    return;
  }
  if (!held_) {
    absl::StatusOr<Membership> membership =
        calls_->FindMembership(hold_.group(), hold_.epoch(), hold_.rank());
    if (!membership.ok()) {
      Finish(ToGrpcStatus(membership.status()));
      return;
    }
    membership_ = *std::move(membership);
    held_ = true;
  }
  if (hold_.release()) {
    calls_->EndHold(membership_, /*released=*/true, peer_);
    Finish(grpc::Status::OK);
    return;
  }
  StartRead(&hold_);
}

}  // namespace chorus
