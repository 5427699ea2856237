// WorkerRuntime: joining groups (Join, JoinAsync) through the coordinator.
#include <grpcpp/client_context.h>

#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/device_proto.h"
#include "common/grpc_status.h"
#include "server/worker/cancel_signal.h"
#include "server/worker/coordinator_status.h"
#include "server/worker/worker_runtime.h"

namespace chorus {

struct WorkerRuntime::PendingJoin {
  v1::JoinGroupRequest request;
  v1::JoinGroupResponse response;
  // Guarded by the runtime's joins_mu_ (CloseJoins() cancels it).
  std::unique_ptr<grpc::ClientContext> context;
  Device device;
  absl::Time start;
  absl::Time deadline;
  int attempt = 0;
  std::function<void(absl::StatusOr<Membership>)> done;
  // Cancelled when the local caller went away (may be null).
  std::shared_ptr<CancelSignal> cancel;
};

absl::StatusOr<Membership> WorkerRuntime::Join(const std::string& group,
                                               int world_size, int rank,
                                               const Device& device,
                                               absl::Duration timeout) {
  absl::Notification joined;
  absl::StatusOr<Membership> result;
  JoinAsync(group, world_size, rank, device, timeout,
            [&](absl::StatusOr<Membership> membership) {
              result = std::move(membership);
              joined.Notify();
            });
  joined.WaitForNotification();
  return result;
}

void WorkerRuntime::JoinAsync(
    const std::string& group, int world_size, int rank, const Device& device,
    absl::Duration timeout,
    std::function<void(absl::StatusOr<Membership>)> done) {
  JoinArgs args;
  args.group = group;
  args.world_size = world_size;
  args.rank = rank;
  args.device = device;
  JoinAsync(args, timeout, std::move(done));
}

void WorkerRuntime::JoinAsync(
    const JoinArgs& args, absl::Duration timeout,
    std::function<void(absl::StatusOr<Membership>)> done) {
  // A GPU that faulted takes part in nothing more.
  if (args.device.kind == DeviceKind::kCuda) {
    if (absl::Status withdrawn = device_buffers_->Withdrawn(args.device.index);
        !withdrawn.ok()) {
      done(withdrawn);
      return;
    }
  }
  auto* join = new PendingJoin;
  v1::JoinGroupRequest& request = join->request;
  request.set_group(args.group);
  request.set_world_size(args.world_size);
  request.set_rank(args.rank);
  request.set_worker_id(session_->worker_id());
  *request.mutable_device() = DeviceToProto(args.device);
  request.set_min_world_size(args.min_world_size);
  request.set_max_world_size(args.max_world_size);
  request.set_newcomer(args.newcomer);
  request.set_follow_epoch(args.follow_epoch);
  request.set_members_on_request(true);
  absl::BitGen gen;
  request.set_request_id(absl::StrCat(absl::Hex(absl::Uniform<uint64_t>(gen)),
                                      absl::Hex(absl::Uniform<uint64_t>(gen))));
  join->device = args.device;
  join->start = absl::Now();
  join->deadline = join->start + timeout;
  join->done = std::move(done);
  // A newcomer whose caller went away is withdrawn (it must not be
  // admitted); other joins go on, and a rank whose caller is gone once its
  // group formed is reported gone by the local API.
  if (args.newcomer) join->cancel = args.cancel;
  {
    absl::MutexLock lock(&joins_mu_);
    joins_.insert(join);
  }
  SendJoin(join);
}

void WorkerRuntime::SendJoin(PendingJoin* join) {
  grpc::ClientContext* context = nullptr;
  {
    absl::MutexLock lock(&joins_mu_);
    if (!joins_closed_) {
      join->context = std::make_unique<grpc::ClientContext>();
      context = join->context.get();
      // The retry waits a little for the connection to come back.
      context->set_wait_for_ready(join->attempt > 0);
      context->set_deadline(absl::ToChronoTime(
          join->attempt == 0
              ? join->deadline
              : std::min(join->deadline, absl::Now() + options_.rpc_timeout)));
    }
  }
  if (context == nullptr) {
    EndJoin(join, absl::UnavailableError("this worker is shutting down"));
    return;
  }
  if (join->cancel != nullptr) {
    // The caller went away: the coordinator drops the join (a newcomer is
    // not admitted). The join may have ended meanwhile: only a join still
    // pending, with this request id, is cancelled.
    join->cancel->OnCancel([this, join, id = join->request.request_id()] {
      absl::MutexLock lock(&joins_mu_);
      if (joins_.contains(join) && join->request.request_id() == id &&
          join->context != nullptr) {
        join->context->TryCancel();
      }
    });
  }
  session_->stub()->async()->JoinGroup(
      context, &join->request, &join->response,
      [this, join](grpc::Status answer) { OnJoinAnswered(join, answer); });
}

void WorkerRuntime::OnJoinAnswered(PendingJoin* join,
                                   const grpc::Status& answer) {
  const v1::JoinGroupRequest& request = join->request;
  absl::Status status =
      FromCoordinator(answer, options_.coordinator,
                      absl::StrCat("the join of group ", request.group(),
                                   " as rank ", request.rank()),
                      join->start);
  const bool retry_now = absl::IsUnavailable(status) && join->attempt == 0;
  if (retry_now || RetriesAfterFailover(status, join->deadline)) {
    // The connection to the coordinator broke, or the coordinator does not
    // know this worker's id (it restarted), or another coordinator leads
    // now: once the session has checked with a heartbeat (at once on the
    // first retry; at the heartbeats' pace while the cluster fails over),
    // registering again if need be, the join goes again under the id this
    // worker holds then.
    ++join->attempt;
    auto again = [this, join, status] {
      if (absl::Now() >= join->deadline || closing_.load()) {
        EndJoin(join, status);
        return;
      }
      join->request.set_worker_id(session_->worker_id());
      SendJoin(join);
    };
    if (retry_now) {
      session_->CheckRegistrationThen(std::move(again));
    } else {
      session_->AfterNextBeat(std::move(again));
    }
    return;
  }
  if (status.ok()) {
    // A newcomer or follower learns its rank and the world from the answer.
    const bool named = !request.newcomer() && request.follow_epoch() == 0;
    EndJoin(join, LearnMembership(request.group(), request.rank(),
                                  named ? request.world_size() : 0,
                                  join->device, join->response));
    return;
  }
  {
    absl::MutexLock lock(&joins_mu_);
    // CloseJoins() cancelled it.
    if (joins_closed_ && absl::IsCancelled(status)) {
      status = absl::UnavailableError(
          absl::StrCat("this worker is shutting down; the join of group ",
                       request.group(), " as rank ", request.rank(), " ended"));
    }
  }
  EndJoin(join, status);
}

void WorkerRuntime::EndJoin(PendingJoin* join,
                            absl::StatusOr<Membership> result) {
  if (join->cancel != nullptr) join->cancel->Clear();
  join->done(std::move(result));
  {
    absl::MutexLock lock(&joins_mu_);
    joins_.erase(join);
  }
  delete join;
}

void WorkerRuntime::CloseJoins() {
  absl::MutexLock lock(&joins_mu_);
  joins_closed_ = true;
  for (PendingJoin* join : joins_) {
    if (join->context != nullptr) join->context->TryCancel();
  }
  joins_mu_.Await(absl::Condition(
      +[](absl::flat_hash_set<PendingJoin*>* joins) { return joins->empty(); },
      &joins_));
}

}  // namespace chorus
