// WorkerRuntime across a coordinator failover (--coordinator=a,b,c with
// coordinators on etcd): a call, commit or join the old leader could not
// answer goes again to the new one once the session followed it, until the
// call's deadline; a collective carries the calls the old leader answered
// (answered_calls.h), so the new leader answers every rank the same, and
// the calls whose plan is running go there again as running calls, so
// that ranks whose plan was lost get it.
#include <glog/logging.h>
#include <grpcpp/client_context.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "server/worker/coordinator_status.h"
#include "server/worker/worker_runtime.h"

namespace chorus {

bool WorkerRuntime::RetriesAfterFailover(const absl::Status& status,
                                         absl::Time deadline) const {
  return absl::IsUnavailable(status) && session_->coordinators() > 1 &&
         !closing_.load() && absl::Now() < deadline;
}

void WorkerRuntime::WaitForNextBeat(absl::Time deadline) {
  // Shared: the heartbeat thread may run the callback after this returned.
  auto beat = std::make_shared<absl::Notification>();
  session_->AfterNextBeat([beat] { beat->Notify(); });
  beat->WaitForNotificationWithDeadline(deadline);
}

absl::StatusOr<v1::CollectiveResponse> WorkerRuntime::AskCoordinator(
    const Membership& membership, uint64_t sequence, PreparedCall* call) {
  // With one coordinator the call goes once, and its request need not be
  // kept.
  const bool may_fail_over = session_->coordinators() > 1;
  while (true) {
    const uint64_t registrations = session_->registrations();
    if (may_fail_over) {
      answered_calls_.AttachReplays(&call->request, registrations);
    }
    absl::StatusOr<v1::CollectiveResponse> answered;
    if (CallPortReady(call->deadline)) {
      answered = call_port_->Call(
          may_fail_over ? call->request : std::move(call->request),
          call->deadline);
    } else {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(call->deadline));
      v1::CollectiveResponse response;
      absl::Status status = FromCoordinator(
          session_->stub()->Collective(&context, call->request, &response),
          options_.coordinator,
          absl::StrCat("collective #", sequence, " of group ",
                       membership.group),
          call->start);
      answered =
          status.ok()
              ? absl::StatusOr<v1::CollectiveResponse>(std::move(response))
              : status;
    }
    if (answered.ok() && may_fail_over) {
      answered_calls_.Record(call->request, registrations);
    }
    if (answered.ok() ||
        !RetriesAfterFailover(answered.status(), call->deadline)) {
      return answered;
    }
    WaitForNextBeat(call->deadline);
  }
}

absl::Status WorkerRuntime::RunPlannedKept(
    const Membership& membership, uint64_t sequence, const CollectiveSpec& spec,
    RunResult* result, const PreparedCall& call, const CallBuffers& buffers,
    std::string* host_output, v1::CommitRequest* commit) {
  const bool kept = session_->coordinators() > 1;
  if (kept) answered_calls_.Running(call.request, call.deadline);
  const bool forced = call.request.algorithm() != v1::ALGORITHM_UNSPECIFIED ||
                      call.request.has_device();
  return RunPlanned(membership, sequence, spec, result, call.device, buffers,
                    call.host_input, host_output, call.deadline,
                    MayBindSameHost(spec, buffers, forced), commit);
}

void WorkerRuntime::RunEnded(const std::string& group, uint64_t sequence) {
  // With one coordinator nothing was kept (RunPlannedKept).
  if (session_->coordinators() > 1) answered_calls_.Ran(group, sequence);
}

void WorkerRuntime::SendRunningCall(const AnsweredCalls::RunningCall& call) {
  if (closing_.load()) return;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(
      std::min(call.deadline, absl::Now() + options_.rpc_timeout)));
  v1::CollectiveResponse ignored;
  const grpc::Status sent =
      session_->stub()->Collective(&context, call.request, &ignored);
  LOG(INFO) << "collective #" << call.request.sequence() << " of group "
            << call.request.group()
            << " runs under the previous leader's plan; telling the new "
               "leader: "
            << (sent.ok() ? std::string("done") : sent.error_message());
}

void WorkerRuntime::ResendRunningCalls() {
  for (AnsweredCalls::RunningCall& call : answered_calls_.RunningCalls()) {
    planned_runs_.Spawn(
        [this, call = std::move(call)] { SendRunningCall(call); });
  }
}

absl::Status WorkerRuntime::Commit(const v1::CommitRequest& request,
                                   absl::Time deadline) {
  while (true) {
    absl::Status verdict = CommitOnce(request, deadline);
    if (!RetriesAfterFailover(verdict, deadline)) return verdict;
    WaitForNextBeat(deadline);
    // The new leader hears the call before the commit (a second copy from
    // ResendRunningCalls is taken as a retry of the same call).
    if (std::optional<AnsweredCalls::RunningCall> running =
            answered_calls_.FindRunning(request.group(), request.sequence());
        running.has_value()) {
      SendRunningCall(*running);
    }
  }
}

}  // namespace chorus
