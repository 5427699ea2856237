#include "server/worker/local/local_api_service.h"

#include <unistd.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/authorization.h"
#include "common/device.h"
#include "common/device_proto.h"
#include "common/grpc_status.h"
#include "common/refused_reactor.h"
#include "common/transport_security.h"
#include "server/worker/cancel_signal.h"
#include "server/worker/local/chunked_call_reactor.h"
#include "server/worker/local/grpc_deadline.h"
#include "server/worker/local/membership_hold_reactor.h"

namespace chorus {
namespace {

// A unary call counted as alive (LocalCalls::burst_memory) until gRPC
// releases it. Deletes itself in OnDone().
class CountedReactor : public grpc::ServerUnaryReactor {
 public:
  explicit CountedReactor(BurstMemory* burst) : burst_(burst) {
    burst_->Began();
  }

  void OnDone() override {
    Released();
    BurstMemory* burst = burst_;
    delete this;
    burst->Ended();
  }

 protected:
  // Runs in OnDone(), before the reactor is deleted.
  virtual void Released() {}

 private:
  BurstMemory* const burst_;
};

// One WorkerLocal.JoinGroup call: its cancellation (the client went away
// while it waited) cancels the join.
class JoinReactor final : public CountedReactor {
 public:
  explicit JoinReactor(BurstMemory* burst)
      : CountedReactor(burst), cancel_(std::make_shared<CancelSignal>()) {}

  void OnCancel() override { cancel_->Cancel(); }
  const std::shared_ptr<CancelSignal>& cancel() const { return cancel_; }

 private:
  const std::shared_ptr<CancelSignal> cancel_;
};

// One WorkerLocal.Collective call: finishes with the call's result, then
// (once the reply went out or the client went away) hands the output to
// the ledger for retries.
class CollectiveReactor final : public CountedReactor {
 public:
  CollectiveReactor(v1::LocalCollectiveResponse* response, BurstMemory* burst)
      : CountedReactor(burst), response_(response) {}

  // Finishes the call with `status`; `keep` (may be null) takes the output
  // once the call is done.
  void End(const absl::Status& status, KeepOutput keep) {
    // Finish() serializes the response before it returns, and OnDone()
    // (which moves the response's data out) runs later, on another thread:
    // gRPC never calls OnDone() of a reactor that is not inline from inside
    // Finish(). The order is gRPC's, out of the sanitizers' sight; holding
    // the lock over Finish() shows it to them too.
    absl::MutexLock lock(&mu_);
    keep_ = std::move(keep);
    Finish(ToGrpcStatus(status));
  }

 private:
  void Released() override {
    KeepOutput keep;
    {
      absl::MutexLock lock(&mu_);
      keep = std::move(keep_);
    }
    if (keep) keep(std::move(*response_->mutable_data()));
  }

  v1::LocalCollectiveResponse* const response_;  // owned by gRPC
  absl::Mutex mu_;
  KeepOutput keep_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::Status CheckLocalCaller(const grpc::CallbackServerContext& context,
                              absl::string_view entry) {
  absl::StatusOr<Caller> caller = CallerOf(context);
  if (!caller.ok()) return caller.status();
  if (caller->unix_socket) return absl::OkStatus();
  if (TlsEnabled()) return Authorize(entry, caller->identity);
  if (caller->loopback) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "the local API runs collectives as any rank, so without TLS it answers "
      "only on this host (its Unix socket, or loopback); the call came from ",
      context.peer()));
}

grpc::ServerUnaryReactor* LocalApiService::JoinGroup(
    grpc::CallbackServerContext* context, const v1::LocalJoinRequest* request,
    v1::LocalJoinResponse* response) {
  auto* reactor = new JoinReactor(calls_->burst_memory());
  if (absl::Status allowed =
          CheckLocalCaller(*context, "chorus.v1.WorkerLocal/JoinGroup");
      !allowed.ok()) {
    reactor->Finish(ToGrpcStatus(allowed));
    return reactor;
  }
  JoinArgs args;
  args.cancel = reactor->cancel();
  args.group = request->group();
  args.world_size = request->world_size();
  args.rank = request->rank();
  args.device.kind = DeviceKind::kCpu;
  if (request->has_device()) args.device = DeviceFromProto(request->device());
  args.min_world_size = request->min_world_size();
  args.max_world_size = request->max_world_size();
  args.newcomer = request->newcomer();
  args.follow_epoch = request->follow_epoch();
  calls_->Join(
      args, TimeLeft(*context),
      [this, context, reactor, response](absl::StatusOr<JoinedRank> joined) {
        if (joined.ok() && context->IsCancelled()) {
          // Its caller is gone: no hold will come for the rank.
          calls_->JoinUnanswered(joined->membership, context->peer());
        } else if (joined.ok()) {
          ToJoinResponse(joined->membership, joined->call_socket, response);
        }
        reactor->Finish(ToGrpcStatus(joined.status()));
      });
  return reactor;
}

grpc::ServerUnaryReactor* LocalApiService::Collective(
    grpc::CallbackServerContext* context,
    const v1::LocalCollectiveRequest* request,
    v1::LocalCollectiveResponse* response) {
  auto* reactor = new CollectiveReactor(response, calls_->burst_memory());
  if (absl::Status allowed =
          CheckLocalCaller(*context, "chorus.v1.WorkerLocal/Collective");
      !allowed.ok()) {
    reactor->End(allowed, nullptr);
    return reactor;
  }
  calls_->Run(*request, CallDeadline(*context), response,
              [reactor](absl::StatusOr<RunResult> result, KeepOutput keep) {
                reactor->End(result.status(), std::move(keep));
              });
  return reactor;
}

grpc::ServerBidiReactor<v1::LocalChunkedRequest, v1::LocalChunkedResponse>*
LocalApiService::CollectiveChunked(grpc::CallbackServerContext* context) {
  if (absl::Status allowed =
          CheckLocalCaller(*context, "chorus.v1.WorkerLocal/CollectiveChunked");
      !allowed.ok()) {
    return new RefusedReactor<grpc::ServerBidiReactor<
        v1::LocalChunkedRequest, v1::LocalChunkedResponse>>(
        ToGrpcStatus(allowed));
  }
  return new ChunkedCallReactor(calls_, context);
}

grpc::ServerReadReactor<v1::MembershipHold>* LocalApiService::HoldMembership(
    grpc::CallbackServerContext* context, v1::MembershipHoldReply* reply) {
  if (absl::Status allowed =
          CheckLocalCaller(*context, "chorus.v1.WorkerLocal/HoldMembership");
      !allowed.ok()) {
    return new RefusedReactor<grpc::ServerReadReactor<v1::MembershipHold>>(
        ToGrpcStatus(allowed));
  }
  return new MembershipHoldReactor(calls_, context->peer());
}

grpc::ServerUnaryReactor* LocalApiService::OpenSharedRegion(
    grpc::CallbackServerContext* context,
    const v1::SharedRegionRequest* request, v1::SharedRegion* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Status allowed =
      CheckLocalCaller(*context, "chorus.v1.WorkerLocal/OpenSharedRegion");
  absl::StatusOr<std::shared_ptr<SharedRegion>> region =
      allowed.ok() ? calls_->OpenRegion(request->group(), request->epoch(),
                                        request->rank(), request->bytes())
                   : absl::StatusOr<std::shared_ptr<SharedRegion>>(allowed);
  if (region.ok()) {
    response->set_region((*region)->id());
    response->set_bytes((*region)->bytes());
    response->set_pid(getpid());
    response->set_fd((*region)->fd());
    response->set_name((*region)->name());
  }
  reactor->Finish(ToGrpcStatus(region.status()));
  return reactor;
}

grpc::ServerUnaryReactor* LocalApiService::ReleaseSharedRegion(
    grpc::CallbackServerContext* context,
    const v1::SharedRegionRelease* request, v1::SharedRegionReleased*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status status =
      CheckLocalCaller(*context, "chorus.v1.WorkerLocal/ReleaseSharedRegion");
  if (status.ok()) {
    status = calls_->ReleaseRegion(request->group(), request->epoch(),
                                   request->rank(), request->region());
  }
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace chorus
