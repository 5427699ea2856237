#include "server/worker/membership_hold_reactor.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/common/grpc_status.h"
#include "server/worker/local_api_service.h"

namespace chorus {

MembershipHoldReactor::MembershipHoldReactor(LocalApiService* service,
                                             std::string peer)
    : service_(service), peer_(std::move(peer)) {
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
    service_->ReportRankGone(
        membership_,
        absl::UnavailableError(absl::StrCat(
            "its client process went away (its hold on the local API of "
            "worker ",
            service_->WorkerName(), " from ", peer_, " ended)")));
    service_->Forget(membership_);
    Finish(grpc::Status::OK);
    return;
  }
  if (!held_) {
    absl::StatusOr<Membership> membership =
        service_->FindMembership(hold_.group(), hold_.epoch(), hold_.rank());
    if (!membership.ok()) {
      Finish(ToGrpcStatus(membership.status()));
      return;
    }
    membership_ = *std::move(membership);
    held_ = true;
  }
  if (hold_.release()) {
    service_->Forget(membership_);
    Finish(grpc::Status::OK);
    return;
  }
  StartRead(&hold_);
}

}  // namespace chorus
