// WorkerRuntime: running collectives (Run, RunAsync, RunOnDevice): the
// call to the coordinator, its inline result or its plan, and the end of
// the call.
#include <grpcpp/client_context.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/collective_metrics.h"
#include "common/collective_spec_proto.h"
#include "common/device_proto.h"
#include "common/grpc_status.h"
#include "common/status_detail.h"
#include "server/worker/coordinator_status.h"
#include "server/worker/worker_runtime.h"

namespace chorus {
namespace {

// "collective #<sequence> of group <group>", for messages.
std::string CallName(const Membership& membership, uint64_t sequence) {
  return absl::StrCat("collective #", sequence, " of group ", membership.group);
}

// Counts a call that started at `start` in the collective metrics
// (collective_metrics.h) and returns its result.
absl::StatusOr<RunResult> Counted(const CollectiveSpec& spec, absl::Time start,
                                  absl::StatusOr<RunResult> result) {
  RecordCollective(spec,
                   result.ok() ? result->algorithm : Algorithm::kUnspecified,
                   result.status().code(), absl::Now() - start);
  return result;
}

}  // namespace

absl::StatusOr<RunResult> WorkerRuntime::Run(
    const Membership& membership, uint64_t sequence, const CollectiveSpec& spec,
    absl::string_view input, std::string* output, const RunOptions& options) {
  const absl::Time start = absl::Now();
  return Counted(spec, start,
                 RunCall(membership, sequence, spec,
                         HostBuffers(input, output, options), options));
}

WorkerRuntime::CallBuffers WorkerRuntime::HostBuffers(
    absl::string_view input, std::string* output, const RunOptions& options) {
  CallBuffers buffers;
  buffers.host_input = input;
  buffers.host_output = output;
  if (!options.output_place.empty()) {
    buffers.host_output_place = options.output_place.data();
  }
  return buffers;
}

bool WorkerRuntime::SendsWithoutWaiting() {
  // Without a call port the call goes as an asynchronous gRPC call.
  return call_port_ == nullptr || session_->call_port() <= 0 ||
         call_port_->Connected();
}

absl::Status WorkerRuntime::CheckDeviceMemory(const Membership& membership,
                                              const CollectiveSpec& spec,
                                              const Device& device,
                                              const void* input,
                                              const void* output) const {
  if (device.kind != DeviceKind::kCuda) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device memory is for calls on a GPU (Cuda(n)), and "
        "this call's device is ",
        CanonicalName(device), ": join on the GPU, or pass host memory"));
  }
  const bool registered =
      std::any_of(devices_.begin(), devices_.end(),
                  [&](const Device& d) { return SameDevice(d, device); });
  if (!registered) {
    return UnsupportedDeviceError(device, "this worker did not register it");
  }
  if (absl::Status withdrawn = device_buffers_->Withdrawn(device.index);
      !withdrawn.ok()) {
    return withdrawn;
  }
  absl::Status valid = ValidateSpec(spec, membership.world_size);
  if (!valid.ok()) return valid;
  const uint64_t in_bytes = DeviceInputBytes(membership, spec, input);
  const uint64_t out_bytes =
      OutputBytes(spec, membership.world_size, membership.rank);
  valid = device_buffers_->CheckPointer(device.index, input, in_bytes,
                                        "input pointer");
  if (valid.ok()) {
    valid = device_buffers_->CheckPointer(device.index, output, out_bytes,
                                          "output pointer");
  }
  return valid;
}

uint64_t WorkerRuntime::DeviceInputBytes(const Membership& membership,
                                         const CollectiveSpec& spec,
                                         const void* input) {
  return input == nullptr && InputMayBeEmpty(spec, membership.rank)
             ? 0
             : InputBytes(spec, membership.world_size, membership.rank);
}

absl::StatusOr<RunResult> WorkerRuntime::RunOnDevice(
    const Membership& membership, uint64_t sequence, const CollectiveSpec& spec,
    const void* input, void* output, const RunOptions& options) {
  const Device device = options.device.value_or(membership.device);
  absl::Status valid =
      CheckDeviceMemory(membership, spec, device, input, output);
  if (!valid.ok()) return valid;
  CallBuffers buffers;
  buffers.device_input = input;
  buffers.device_output = output;
  buffers.on_device = true;
  // Nothing reads the input before the caller's stream wrote it (a wait on
  // the GPU), and that stream is ordered after the output.
  buffers.stream = options.stream;
  // RunCall() checks sizes against the host input; a device input is
  // InputBytes long by construction, so a view of that length (never read)
  // stands for it.
  buffers.host_input =
      absl::string_view(static_cast<const char*>(input),
                        DeviceInputBytes(membership, spec, input));
  const absl::Time start = absl::Now();
  return Counted(spec, start,
                 RunCall(membership, sequence, spec, buffers, options));
}

absl::Status WorkerRuntime::PrepareCall(
    const Membership& membership, uint64_t sequence, const CollectiveSpec& spec,
    const CallBuffers& buffers, const RunOptions& options, PreparedCall* call) {
  const int world = membership.world_size;
  absl::Status valid =
      ValidateCall(spec, world, membership.rank, buffers.host_input.size(),
                   options.algorithm);
  if (!valid.ok()) return valid;
  // Bound peers waiting for this call in shared memory go on at once.
  WithdrawFromBinding(membership, sequence);
  // The rank answers by `deadline`; the coordinator ends its waits a margin
  // before that (CoreDeadline), and so do the rank's waits on its peers.
  call->start = absl::Now();
  call->deadline = call->start + options.timeout;
  call->device = options.device.value_or(membership.device);
  const bool carries =
      CarriesInlineData(spec, world, options.algorithm,
                        spec.kind == CollectiveKind::kAllReduce
                            ? membership.all_reduce_inline_max_bytes
                            : membership.inline_max_bytes);
  // A device input that rides with the call comes to the host first.
  call->host_input = buffers.host_input;
  if (buffers.on_device && carries) {
    absl::Status copied = device_buffers_->CopyFromDevice(
        call->device.index, buffers.device_input, buffers.host_input.size(),
        &call->staged_input, buffers.stream);
    // The call took its sequence number: the group must hear of it.
    if (!copied.ok()) {
      return ReportFailure(membership, sequence, copied, call->deadline);
    }
    call->host_input = call->staged_input;
  }

  v1::CollectiveRequest& request = call->request;
  request.set_group(membership.group);
  request.set_epoch(membership.epoch);
  request.set_rank(membership.rank);
  request.set_sequence(sequence);
  *request.mutable_spec() = SpecToProto(spec);
  request.set_algorithm(static_cast<v1::Algorithm>(options.algorithm));
  if (spec.kind == CollectiveKind::kSync) request.set_members_on_request(true);
  if (options.device.has_value()) {
    *request.mutable_device() = DeviceToProto(*options.device);
  }
  // Sequences that ran at the leader or on a same_host binding.
  AttachLeaderRan(membership, &request);
  if (carries) {
    request.set_has_inline_data(true);
    request.set_inline_data(call->host_input.data(), call->host_input.size());
    call->repeat_ask = AskToRepeat(membership, spec, buffers, options);
    request.set_repeats_same_host(call->repeat_ask != nullptr);
  }
  return absl::OkStatus();
}

absl::StatusOr<RunResult> WorkerRuntime::RunCall(const Membership& membership,
                                                 uint64_t sequence,
                                                 const CollectiveSpec& spec,
                                                 const CallBuffers& buffers,
                                                 const RunOptions& options) {
  if (RunsAtLeader(membership, spec, buffers, options)) {
    return RunAtLeader(membership, sequence, spec, buffers, options);
  }
  if (std::shared_ptr<SameHostBinding> bound =
          ClaimBinding(membership, spec, buffers, options)) {
    return RunBound(*bound, membership, sequence, spec, buffers, options);
  }
  return AskAndFinish(membership, sequence, spec, buffers, options);
}

absl::StatusOr<RunResult> WorkerRuntime::AskAndFinish(
    const Membership& membership, uint64_t sequence, const CollectiveSpec& spec,
    const CallBuffers& buffers, const RunOptions& options) {
  PreparedCall call;
  absl::Status prepared =
      PrepareCall(membership, sequence, spec, buffers, options, &call);
  if (!prepared.ok()) return prepared;
  absl::StatusOr<v1::CollectiveResponse> answered =
      AskCoordinator(membership, sequence, &call);
  if (!answered.ok()) return answered.status();
  return FinishCall(membership, sequence, spec, buffers, call, *answered);
}

absl::StatusOr<RunResult> WorkerRuntime::FinishCall(
    const Membership& membership, uint64_t sequence, const CollectiveSpec& spec,
    const CallBuffers& buffers, const PreparedCall& call,
    v1::CollectiveResponse& response) {
  RunResult result = PlanOf(sequence, response);
  if (response.has_next()) {
    // A sync admitted newcomers: this rank goes on in the next epoch.
    const v1::JoinGroupResponse& listed = response.next();
    absl::StatusOr<Membership> next = LearnMembership(
        membership.group, membership.rank,
        listed.members_size() > 0 ? listed.members_size() : listed.world_size(),
        membership.device, listed);
    if (!next.ok()) return next.status();
    result.next = std::make_shared<const Membership>(*std::move(next));
  }
  std::string staged_output;
  std::string* host_output =
      buffers.on_device ? &staged_output : buffers.host_output;
  absl::Status status;
  if (result.algorithm == Algorithm::kInline) {
    *host_output = std::move(*response.mutable_inline_result());
    // The others have their results already; only this rank's copy fails.
    if (buffers.on_device && !host_output->empty()) {
      status =
          device_buffers_->CopyToDevice(call.device.index, *host_output,
                                        buffers.device_output, buffers.stream);
    }
  } else {
    v1::CommitRequest commit;
    status = RunPlannedKept(membership, sequence, spec, &result, call, buffers,
                            host_output, &commit);
    if (status.ok()) status = Commit(commit, call.deadline);
    RunEnded(membership.group, sequence);
  }
  return EndCall(status, buffers, host_output, result);
}

RunResult WorkerRuntime::PlanOf(uint64_t sequence,
                                const v1::CollectiveResponse& response) {
  RunResult result;
  result.sequence = sequence;
  result.algorithm = static_cast<Algorithm>(response.plan().algorithm());
  result.chunk_bytes = response.plan().chunk_bytes();
  result.joiners_waiting = response.joiners_waiting();
  return result;
}

void WorkerRuntime::PlaceOutput(const CallBuffers& buffers,
                                std::string* host_output) {
  if (buffers.host_output_place != nullptr && !host_output->empty()) {
    // The plan wrote the string, not the place (AlgorithmArgs::output_place).
    std::memcpy(buffers.host_output_place, host_output->data(),
                host_output->size());
    host_output->clear();
  }
}

absl::StatusOr<RunResult> WorkerRuntime::EndCall(const absl::Status& status,
                                                 const CallBuffers& buffers,
                                                 std::string* host_output,
                                                 const RunResult& result) {
  if (!status.ok()) {
    host_output->clear();
    return status;
  }
  PlaceOutput(buffers, host_output);
  return result;
}

struct WorkerRuntime::PendingRun {
  Membership membership;
  uint64_t sequence = 0;
  CollectiveSpec spec;
  CallBuffers buffers;
  PreparedCall call;
  // The gRPC call, when the call port is not used; guarded by the
  // runtime's runs_mu_ (CloseRuns() cancels it).
  std::unique_ptr<grpc::ClientContext> context;
  v1::CollectiveResponse response;
  std::function<void(absl::StatusOr<RunResult>)> done;
};

void WorkerRuntime::RunAsync(
    const Membership& membership, uint64_t sequence, const CollectiveSpec& spec,
    absl::string_view input, std::string* output, const RunOptions& options,
    std::function<void(absl::StatusOr<RunResult>)> done) {
  auto run = std::make_unique<PendingRun>();
  run->membership = membership;
  run->sequence = sequence;
  run->spec = spec;
  run->buffers = HostBuffers(input, output, options);
  run->done = std::move(done);
  const absl::Time start = absl::Now();
  if (RunsAtLeader(membership, spec, run->buffers, options)) {
    RunOffCoordinatorAsync(
        std::move(run), options, start, [this, options](PendingRun& r) {
          return std::make_optional(RunAtLeader(r.membership, r.sequence,
                                                r.spec, r.buffers, options));
        });
    return;
  }
  // While an earlier call of the rank holds its binding, this one waits at
  // the coordinator, holding no thread.
  if (std::shared_ptr<SameHostBinding> bound =
          ClaimBinding(membership, spec, run->buffers, options)) {
    RunOffCoordinatorAsync(
        std::move(run), options, start, [this, bound, options](PendingRun& r) {
          return RunOnBinding(*bound, r.membership, r.sequence, r.spec,
                              r.buffers, options);
        });
    return;
  }
  SendToCoordinatorAsync(std::move(run), options, start);
}

void WorkerRuntime::SendToCoordinatorAsync(std::unique_ptr<PendingRun> run,
                                           const RunOptions& options,
                                           absl::Time start) {
  const CollectiveSpec& spec = run->spec;
  absl::Status prepared = PrepareCall(run->membership, run->sequence, spec,
                                      run->buffers, options, &run->call);
  if (!prepared.ok()) {
    run->done(Counted(spec, start, prepared));
    return;
  }
  const absl::Time deadline = run->call.deadline;
  const bool call_port = CallPortReady(deadline);
  {
    absl::MutexLock lock(&runs_mu_);
    if (runs_closed_) {
      prepared = absl::UnavailableError("this worker is shutting down");
    } else {
      if (!call_port) {
        run->context = std::make_unique<grpc::ClientContext>();
        run->context->set_deadline(absl::ToChronoTime(deadline));
      }
      runs_.insert(run.get());
    }
  }
  if (!prepared.ok()) {
    run->done(Counted(spec, start, prepared));
    return;
  }
  SendRun(run.release(), call_port);
}

void WorkerRuntime::RunOffCoordinatorAsync(
    std::unique_ptr<PendingRun> run, const RunOptions& options,
    absl::Time start,
    std::function<std::optional<absl::StatusOr<RunResult>>(PendingRun&)> body) {
  bool open = false;
  {
    absl::MutexLock lock(&runs_mu_);
    open = !runs_closed_;
    if (open) runs_.insert(run.get());
  }
  if (!open) {
    run->done(Counted(run->spec, start,
                      absl::UnavailableError("this worker is shutting down")));
    return;
  }
  planned_runs_.Spawn(
      [this, run = run.release(), body = std::move(body), options, start] {
        std::optional<absl::StatusOr<RunResult>> result = body(*run);
        {
          absl::MutexLock lock(&runs_mu_);
          runs_.erase(run);
        }
        if (!result.has_value()) {
          // The rest of the call's time, at the coordinator.
          RunOptions rest = options;
          rest.timeout = start + options.timeout - absl::Now();
          SendToCoordinatorAsync(std::unique_ptr<PendingRun>(run), rest, start);
          return;
        }
        run->done(Counted(run->spec, start, *std::move(result)));
        delete run;
      });
}

void WorkerRuntime::SendRun(PendingRun* run, bool call_port) {
  const bool may_fail_over = session_->coordinators() > 1;
  const uint64_t registrations = session_->registrations();
  if (may_fail_over) {
    answered_calls_.AttachReplays(&run->call.request, registrations);
  }
  if (call_port) {
    call_port_->CallAsync(
        may_fail_over ? run->call.request : std::move(run->call.request),
        run->call.deadline,
        [this, run,
         registrations](absl::StatusOr<v1::CollectiveResponse> answered) {
          if (answered.ok()) run->response = *std::move(answered);
          OnRunAnswered(run, answered.status(), registrations);
        });
    return;
  }
  session_->stub()->async()->Collective(
      run->context.get(), &run->call.request, &run->response,
      [this, run, registrations](grpc::Status answer) {
        OnRunAnswered(run,
                      FromCoordinator(answer, options_.coordinator,
                                      CallName(run->membership, run->sequence),
                                      run->call.start),
                      registrations);
      });
}

void WorkerRuntime::ResendRun(PendingRun* run) {
  if (closing_.load()) {
    OnRunAnswered(run, absl::UnavailableError("this worker is shutting down"),
                  0);
    return;
  }
  const absl::Time deadline = run->call.deadline;
  const bool call_port = CallPortReady(deadline);
  if (!call_port) {
    absl::MutexLock lock(&runs_mu_);
    run->context = std::make_unique<grpc::ClientContext>();
    run->context->set_deadline(absl::ToChronoTime(deadline));
  }
  SendRun(run, call_port);
}

void WorkerRuntime::OnRunAnswered(PendingRun* run, absl::Status answer,
                                  uint64_t registrations) {
  if (answer.ok() && session_->coordinators() > 1) {
    answered_calls_.Record(run->call.request, registrations);
  }
  if (RetriesAfterFailover(answer, run->call.deadline)) {
    // The run stays pending (CloseRuns() waits for it) until it went again,
    // from a task thread (reaching the call port may take a while; the
    // heartbeat thread must not wait for it).
    session_->AfterNextBeat(
        [this, run] { planned_runs_.Spawn([this, run] { ResendRun(run); }); });
    return;
  }
  {
    absl::MutexLock lock(&runs_mu_);
    runs_.erase(run);
    // CloseRuns() cancelled it.
    if (runs_closed_ && absl::IsCancelled(answer)) {
      answer = absl::UnavailableError(
          absl::StrCat("this worker is shutting down; ",
                       CallName(run->membership, run->sequence), " ended"));
    }
  }
  if (!answer.ok()) {
    EndRun(run, answer);
    return;
  }
  if (run->response.plan().algorithm() == v1::ALGORITHM_INLINE) {
    EndRun(run, FinishCall(run->membership, run->sequence, run->spec,
                           run->buffers, run->call, run->response));
    return;
  }
  planned_runs_.Spawn([this, run] { RunPlannedAsync(run); });
}

void WorkerRuntime::RunPlannedAsync(PendingRun* run) {
  RunResult result = PlanOf(run->sequence, run->response);
  std::string* host_output = run->buffers.host_output;
  const absl::Time deadline = run->call.deadline;
  v1::CommitRequest commit;
  absl::Status status =
      RunPlannedKept(run->membership, run->sequence, run->spec, &result,
                     run->call, run->buffers, host_output, &commit);
  if (status.ok() && CallPortReady(deadline)) {
    // The verdict ends the run on the call port's completion thread: the
    // rank's answer needs no hand-off back to this one.
    call_port_->CommitAsync(
        commit, deadline, [this, run, result, commit](absl::Status verdict) {
          if (RetriesAfterFailover(verdict, run->call.deadline)) {
            // After a failover: commit again on a task thread (it waits).
            planned_runs_.Spawn([this, run, result, commit] {
              const absl::Status again = Commit(commit, run->call.deadline);
              EndRun(run, EndCall(again, run->buffers, run->buffers.host_output,
                                  result));
            });
            return;
          }
          EndRun(run, EndCall(verdict, run->buffers, run->buffers.host_output,
                              result));
        });
    return;
  }
  if (status.ok()) status = Commit(commit, deadline);
  EndRun(run, EndCall(status, run->buffers, host_output, result));
}

void WorkerRuntime::EndRun(PendingRun* run, absl::StatusOr<RunResult> result) {
  RunEnded(run->membership.group, run->sequence);
  run->done(Counted(run->spec, run->call.start, std::move(result)));
  delete run;
}

void WorkerRuntime::CloseRuns() {
  absl::MutexLock lock(&runs_mu_);
  runs_closed_ = true;
  for (PendingRun* run : runs_) {
    if (run->context != nullptr) run->context->TryCancel();
  }
  runs_mu_.Await(absl::Condition(
      +[](absl::flat_hash_set<PendingRun*>* runs) { return runs->empty(); },
      &runs_));
}

}  // namespace chorus
