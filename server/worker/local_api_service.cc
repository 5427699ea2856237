#include "server/worker/local_api_service.h"

#include <glog/logging.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/common/answer_margin.h"
#include "server/common/collective_spec_proto.h"
#include "server/common/device_proto.h"
#include "server/common/grpc_status.h"
#include "server/common/metrics.h"
#include "server/common/refused_reactor.h"
#include "server/common/status_detail.h"
#include "server/common/transport_security.h"
#include "server/worker/chunked_call_reactor.h"
#include "server/worker/membership_hold_reactor.h"

namespace chorus {
namespace {

// Joins and collectives alive at once that make a burst, whose freed memory
// goes back to the system (burst_memory.h).
constexpr int kBurstCalls = 1000;

// The time a call from `context` may take: until the client's deadline
// less the margin its answer needs to reach the client (answer_margin.h), or
// ten minutes when it set none.
absl::Duration TimeLeft(const grpc::CallbackServerContext& context) {
  const auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) {
    return absl::Minutes(10);
  }
  const absl::Duration left = absl::FromChrono(deadline) - absl::Now();
  return left - AnswerMargin(left);
}

// `failure` of collective `sequence` of `membership`, which took its number,
// with an ErrorDetail saying so (number_used) added to the one it carries.
absl::Status NumberUsed(const absl::Status& failure,
                        const Membership& membership, uint64_t sequence) {
  v1::ErrorDetail detail = ErrorDetailOf(failure).value_or(MakeErrorDetail(
      "CALL_FAILED", membership.group, membership.epoch, sequence));
  detail.set_number_used(true);
  return WithErrorDetail(failure, detail);
}

// What identifies a call for its retries: the same number with the same
// spec, plan, device and input size again is a retry.
std::string DescribeCall(const LocalCall& call, uint64_t input_bytes) {
  return absl::StrCat(DescribeSpec(call.spec), " (algorithm ",
                      static_cast<int>(call.options.algorithm), ", device ",
                      call.options.device.has_value()
                          ? CanonicalName(*call.options.device)
                          : std::string("of the rank"),
                      ", ", input_bytes, " bytes of input)");
}

// One WorkerLocal.Collective call: finishes with the call's result, then
// (OnDone, once the reply went out or the client went away) hands the
// output to the ledger for retries. Deletes itself in OnDone().
class CollectiveReactor final : public grpc::ServerUnaryReactor {
 public:
  CollectiveReactor(v1::LocalCollectiveResponse* response, BurstMemory* burst)
      : response_(response), burst_(burst) {
    burst_->Began();
  }

  // Finishes the call with `result`; `keep` (may be null) takes the output
  // once the call is done.
  void End(absl::StatusOr<RunResult> result, KeepOutput keep) {
    if (result.ok()) {
      response_->set_sequence(result->sequence);
      ToPlanProto(*result, response_->mutable_plan());
    }
    // Finish() serializes the response before it returns, and OnDone()
    // (which moves the response's data out) runs later, on another thread:
    // gRPC never calls OnDone() of a reactor that is not inline from inside
    // Finish(). The order is gRPC's, out of the sanitizers' sight; holding
    // the lock over Finish() shows it to them too.
    absl::MutexLock lock(&mu_);
    keep_ = std::move(keep);
    Finish(ToGrpcStatus(result.status()));
  }

  void OnDone() override {
    KeepOutput keep;
    {
      absl::MutexLock lock(&mu_);
      keep = std::move(keep_);
    }
    if (keep) keep(std::move(*response_->mutable_data()));
    BurstMemory* burst = burst_;
    delete this;
    burst->Ended();
  }

 private:
  v1::LocalCollectiveResponse* const response_;  // owned by gRPC
  BurstMemory* const burst_;
  absl::Mutex mu_;
  KeepOutput keep_ ABSL_GUARDED_BY(mu_);
};

// One WorkerLocal.JoinGroup call, counted as alive until gRPC releases it.
// Deletes itself in OnDone().
class JoinReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit JoinReactor(BurstMemory* burst) : burst_(burst) { burst_->Began(); }

  void OnDone() override {
    BurstMemory* burst = burst_;
    delete this;
    burst->Ended();
  }

 private:
  BurstMemory* const burst_;
};

}  // namespace

absl::Status CheckLocalCaller(const grpc::CallbackServerContext& context) {
  absl::StatusOr<Caller> caller = CallerOf(context);
  if (!caller.ok()) return caller.status();
  if (caller->unix_socket) return absl::OkStatus();
  if (TlsEnabled()) {
    if (caller->identity.role == Role::kClient ||
        caller->identity.role == Role::kAdmin) {
      return absl::OkStatus();
    }
    return absl::PermissionDeniedError(absl::StrCat(
        "the local API runs collectives as any rank: over TCP it needs a "
        "client or admin certificate, not ",
        caller->identity.Uri(), "; local applications use the Unix socket"));
  }
  if (caller->loopback) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "the local API runs collectives as any rank, so without TLS it answers "
      "only on this host (its Unix socket, or loopback); the call came from ",
      context.peer()));
}

void ToPlanProto(const RunResult& result, v1::Plan* plan) {
  plan->set_algorithm(static_cast<v1::Algorithm>(result.algorithm));
  plan->set_chunk_bytes(result.chunk_bytes);
}

void LocalApiService::Bind(WorkerRuntime* runtime) {
  absl::MutexLock lock(&mu_);
  runtime_ = runtime;
}

WorkerRuntime* LocalApiService::runtime() const {
  absl::MutexLock lock(&mu_);
  return runtime_;
}

void LocalApiService::BeginShutdown() {
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
  }
  ledger_.Close();
}

std::string LocalApiService::WorkerName() const {
  WorkerRuntime* bound = runtime();
  return bound == nullptr ? std::string() : bound->name();
}

absl::StatusOr<Membership> LocalApiService::FindMembership(
    const std::string& group, uint64_t epoch, int rank) const {
  absl::MutexLock lock(&mu_);
  if (runtime_ == nullptr) {
    return absl::UnavailableError("this worker is not registered yet");
  }
  auto it = memberships_.find({group, rank});
  if (it == memberships_.end() || it->second->epoch != epoch) {
    return absl::FailedPreconditionError(
        absl::StrCat("this worker has not joined group ", group, " as rank ",
                     rank, " at epoch ", epoch));
  }
  return *it->second;
}

void LocalApiService::ReportRankGone(const Membership& membership,
                                     absl::Status why) {
  WorkerRuntime* bound;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    bound = runtime_;
  }
  if (bound == nullptr) return;
  tasks_.Spawn([bound, membership, why = std::move(why)] {
    const absl::Status verdict = bound->ReportRankGone(membership, why);
    LOG(WARNING) << "rank " << membership.rank << " of group "
                 << membership.group << " is gone (" << why
                 << "); the group's verdict: "
                 << verdict.ToString(
                        absl::StatusToStringMode::kWithNoExtraData);
  });
}

void LocalApiService::Forget(const Membership& membership) {
  {
    absl::MutexLock lock(&mu_);
    auto it = memberships_.find({membership.group, membership.rank});
    if (it != memberships_.end() && it->second->epoch == membership.epoch) {
      memberships_.erase(it);
    }
  }
  ledger_.Forget(membership.group, membership.rank, membership.epoch);
  regions_.Forget(membership.group, membership.rank, membership.epoch);
}

grpc::ServerReadReactor<v1::MembershipHold>* LocalApiService::HoldMembership(
    grpc::CallbackServerContext* context, v1::MembershipHoldReply* reply) {
  if (absl::Status allowed = CheckLocalCaller(*context); !allowed.ok()) {
    return new RefusedReactor<grpc::ServerReadReactor<v1::MembershipHold>>(
        ToGrpcStatus(allowed));
  }
  return new MembershipHoldReactor(this, context->peer());
}

grpc::ServerUnaryReactor* LocalApiService::OpenSharedRegion(
    grpc::CallbackServerContext* context,
    const v1::SharedRegionRequest* request, v1::SharedRegion* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status status = CheckLocalCaller(*context);
  if (status.ok()) {
    status = FindMembership(request->group(), request->epoch(), request->rank())
                 .status();
  }
  absl::StatusOr<std::shared_ptr<SharedRegion>> region =
      status.ok() ? regions_.Open(request->group(), request->rank(),
                                  request->epoch(), request->bytes())
                  : absl::StatusOr<std::shared_ptr<SharedRegion>>(status);
  if (region.ok() &&
      !FindMembership(request->group(), request->epoch(), request->rank())
           .ok()) {
    // The rank left meanwhile (its Forget may have come first).
    regions_.Forget(request->group(), request->rank(), request->epoch());
    region = absl::FailedPreconditionError(
        absl::StrCat("rank ", request->rank(), " of group ", request->group(),
                     " left while its shared region was made"));
  }
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
  absl::Status status = CheckLocalCaller(*context);
  if (status.ok()) {
    status = FindMembership(request->group(), request->epoch(), request->rank())
                 .status();
  }
  if (status.ok()) {
    status = regions_.Release(request->group(), request->rank(),
                              request->epoch(), request->region());
  }
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* LocalApiService::JoinGroup(
    grpc::CallbackServerContext* context, const v1::LocalJoinRequest* request,
    v1::LocalJoinResponse* response) {
  grpc::ServerUnaryReactor* reactor = new JoinReactor(&burst_memory_);
  if (absl::Status allowed = CheckLocalCaller(*context); !allowed.ok()) {
    reactor->Finish(ToGrpcStatus(allowed));
    return reactor;
  }
  WorkerRuntime* runtime = this->runtime();
  if (runtime == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "this worker is not registered yet"));
    return reactor;
  }
  Device device;
  device.kind = DeviceKind::kCpu;
  if (request->has_device()) device = DeviceFromProto(request->device());
  // No thread waits while the group assembles: any number of joins may be
  // pending through one daemon.
  runtime->JoinAsync(
      request->group(), request->world_size(), request->rank(), device,
      TimeLeft(*context),
      [this, reactor, request, response](absl::StatusOr<Membership> joined) {
        if (joined.ok()) {
          response->set_epoch(joined->epoch);
          response->set_world_size(joined->world_size);
          for (const Device& d : joined->devices) {
            response->add_member_devices(CanonicalName(d));
          }
          absl::MutexLock lock(&mu_);
          memberships_[{request->group(), request->rank()}] =
              std::make_shared<const Membership>(*joined);
          response->set_call_socket(call_socket_);
        }
        reactor->Finish(ToGrpcStatus(joined.status()));
      });
  return reactor;
}

absl::StatusOr<LocalCall> LocalApiService::PrepareCall(
    const v1::LocalCollectiveRequest& request) const {
  LocalCall call;
  {
    absl::MutexLock lock(&mu_);
    call.runtime = runtime_;
    auto it = memberships_.find({request.group(), request.rank()});
    if (call.runtime == nullptr) {
      return absl::UnavailableError("this worker is not registered yet");
    }
    if (it == memberships_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("this worker has not joined group ", request.group(),
                       " as rank ", request.rank(), "; join first"));
    }
    if (it->second->epoch != request.epoch()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "stale epoch ", request.epoch(), " for group ", request.group(),
          "; this worker joined it at epoch ", it->second->epoch));
    }
    call.membership = it->second;
  }
  call.spec = SpecFromProto(request.spec());
  call.options.algorithm = static_cast<Algorithm>(request.algorithm());
  if (request.has_device()) {
    call.options.device = DeviceFromProto(request.device());
  }
  call.sequence = request.sequence();
  return call;
}

absl::StatusOr<absl::string_view> LocalApiService::PrepareInput(
    const v1::LocalCollectiveRequest& request, LocalCall* call) const {
  if (!request.has_shared_input() && !request.has_shared_output()) {
    return absl::string_view(request.data());
  }
  if (!request.has_shared_input() || !request.has_shared_output()) {
    return absl::InvalidArgumentError(
        "a call on shared memory sets both shared_input and shared_output");
  }
  if (!request.data().empty()) {
    return absl::InvalidArgumentError(
        "a call on shared memory carries no data: its input is "
        "shared_input");
  }
  const Membership& m = *call->membership;
  const v1::SharedBuffer& in = request.shared_input();
  const v1::SharedBuffer& out = request.shared_output();
  absl::StatusOr<std::shared_ptr<SharedRegion>> input_region =
      regions_.Find(m.group, m.rank, m.epoch, in.region());
  if (!input_region.ok()) return input_region.status();
  absl::StatusOr<std::shared_ptr<SharedRegion>> output_region =
      regions_.Find(m.group, m.rank, m.epoch, out.region());
  if (!output_region.ok()) return output_region.status();
  absl::StatusOr<absl::Span<char>> input =
      (*input_region)->Range(in.offset(), in.bytes(), "shared_input");
  if (!input.ok()) return input.status();
  absl::StatusOr<absl::Span<char>> output =
      (*output_region)->Range(out.offset(), out.bytes(), "shared_output");
  if (!output.ok()) return output.status();
  const uint64_t output_bytes = OutputBytes(call->spec, m.world_size, m.rank);
  if (output->size() < output_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared_output has room for ", output->size(),
                     " bytes; rank ", m.rank, "'s output of ",
                     DescribeSpec(call->spec), " is ", output_bytes, " bytes"));
  }
  call->input_region = *std::move(input_region);
  call->output_region = *std::move(output_region);
  call->shared_output = *output;
  return absl::string_view(input->data(), input->size());
}

absl::Status LocalApiService::CheckSizes(const LocalCall& call,
                                         uint64_t input_bytes) const {
  const Membership& m = *call.membership;
  absl::Status status = ValidateCall(call.spec, m.world_size, m.rank,
                                     input_bytes, call.options.algorithm);
  if (!status.ok()) return status;
  const uint64_t output_bytes = OutputBytes(call.spec, m.world_size, m.rank);
  if (input_bytes > max_tensor_bytes_ || output_bytes > max_tensor_bytes_) {
    const bool input = input_bytes > max_tensor_bytes_;
    return absl::ResourceExhaustedError(absl::StrCat(
        "rank ", m.rank, "'s ", input ? "input" : "output", " of ",
        input ? input_bytes : output_bytes, " bytes for ",
        DescribeSpec(call.spec), " is over this worker's limit of ",
        max_tensor_bytes_, " bytes per tensor (--max_tensor_bytes)"));
  }
  return absl::OkStatus();
}

namespace {

// The counters of BurstMemory's trims, by when they ran.
CounterFamily* MemoryTrims() {
  return DefaultMetrics().Counters(
      "chorus_memory_trims_total",
      "Times the worker gave the memory freed by a burst of local API calls "
      "back to the system: as the burst ended (when=\"burst\"), and once "
      "more a second after its last call (when=\"settled\").",
      {"when"});
}

}  // namespace

LocalApiService::LocalApiService(uint64_t max_tensor_bytes,
                                 uint64_t max_shared_bytes)
    : max_tensor_bytes_(max_tensor_bytes),
      regions_(max_shared_bytes),
      burst_memory_(
          kBurstCalls,
          DefaultMetrics()
              .Levels("chorus_local_calls",
                      "Joins and collectives of the local API alive now: "
                      "received, and not yet answered or not yet released by "
                      "gRPC.",
                      {})
              ->With({}),
          MemoryTrims()->With({"burst"}), MemoryTrims()->With({"settled"})) {}

void LocalApiService::Drain() {
  tasks_.WaitIdle();
  absl::MutexLock lock(&calls_mu_);
  calls_mu_.Await(absl::Condition(
      +[](int* running) { return *running == 0; }, &calls_running_));
}

void LocalApiService::StartCall(LocalCall call,
                                const grpc::CallbackServerContext& context,
                                absl::string_view input, std::string* output,
                                CallDone done) {
  StartCall(std::move(call), absl::Now() + TimeLeft(context), input, output,
            std::move(done));
}

void LocalApiService::StartCall(LocalCall call, absl::Time deadline,
                                absl::string_view input, std::string* output,
                                CallDone done) {
  {
    absl::MutexLock lock(&calls_mu_);
    ++calls_running_;
  }
  done = [this, done = std::move(done)](absl::StatusOr<RunResult> result,
                                        KeepOutput keep) {
    done(std::move(result), std::move(keep));
    absl::MutexLock lock(&calls_mu_);
    --calls_running_;
  };
  const Membership& joined = *call.membership;
  // A call that may wait for its number (a lower one still to come, or a
  // retry of an attempt still running) or for a connection to the
  // coordinator waits on a task thread; any other takes its number and is
  // sent from this thread, which then never waits.
  const bool may_wait =
      ledger_.MayWait(joined.group, joined.rank, joined.epoch, call.sequence) ||
      !call.runtime->SendsWithoutWaiting();
  // A caller that waits for the call anyway waits for those too.
  const bool wait_here = call.wait_here;
  auto start = [this, call = std::move(call), input, output, deadline,
                done = std::move(done)]() mutable {
    const Membership& m = *call.membership;
    absl::Status taken =
        call.checked ? absl::OkStatus()
                     : ValidateCall(call.spec, m.world_size, m.rank,
                                    input.size(), call.options.algorithm);
    std::optional<CallOutcome> retried;
    if (taken.ok()) {
      taken = ledger_.Use(m.group, m.rank, m.epoch, call.sequence,
                          DescribeCall(call, input.size()), deadline, &retried);
    }
    if (!taken.ok()) {
      done(taken, nullptr);
      return;
    }
    RunResult result;
    result.sequence = call.sequence;
    if (retried.has_value()) {
      // The first attempt's outcome: nothing runs again.
      if (!retried->status.ok()) {
        done(NumberUsed(retried->status, m, call.sequence), nullptr);
        return;
      }
      if (retried->output_dropped) {
        done(NumberUsed(absl::FailedPreconditionError(absl::StrCat(
                            "call #", call.sequence,
                            " ran on its caller's own memory in the worker's "
                            "process, which keeps no copy of its output for "
                            "a retry")),
                        m, call.sequence),
             nullptr);
        return;
      }
      result.algorithm = retried->algorithm;
      result.chunk_bytes = retried->chunk_bytes;
      const absl::string_view kept = retried->output_region != nullptr
                                         ? retried->shared_output
                                         : absl::string_view(retried->output);
      if (call.output_region == nullptr && !call.in_place) {
        *output = std::string(kept);
      } else if (kept.size() > call.shared_output.size()) {
        done(absl::InternalError(absl::StrCat(
                 "the retried call's output of ", kept.size(),
                 " bytes does not fit the ", call.shared_output.size(),
                 " bytes of shared_output")),
             nullptr);
        return;
      } else if (kept.data() != call.shared_output.data()) {
        std::memmove(call.shared_output.data(), kept.data(), kept.size());
      }
      done(result, nullptr);
      return;
    }
    call.options.timeout = deadline - absl::Now();
    // The call waits for the other ranks with no thread of its own: what it
    // needs until its end lives here.
    auto running = std::make_shared<RunningCall>();
    running->call = std::move(call);
    running->done = std::move(done);
    LocalCall& c = running->call;
    // A call on shared memory or on its caller's memory lands in place (its
    // input may be the very bytes it writes): the same_host plan writes
    // there directly, the others through a scratch string (a region's is
    // reused).
    std::string* run_output = output;
    if (c.output_region != nullptr || c.in_place) {
      if (c.output_region != nullptr) {
        running->scratch = c.output_region->TakeScratch();
        running->scratch.clear();
      }
      run_output = &running->scratch;
      c.options.output_place = c.shared_output;
    }
    if (c.wait_here) {
      EndCall(*running, c.runtime->Run(*c.membership, c.sequence, c.spec, input,
                                       run_output, c.options));
      return;
    }
    c.runtime->RunAsync(*c.membership, c.sequence, c.spec, input, run_output,
                        c.options,
                        [this, running](absl::StatusOr<RunResult> ran) {
                          EndCall(*running, std::move(ran));
                        });
  };
  if (may_wait && !wait_here) {
    tasks_.Spawn(std::move(start));
  } else {
    start();
  }
}

void LocalApiService::EndCall(RunningCall& running,
                              absl::StatusOr<RunResult> ran) {
  const LocalCall& call = running.call;
  const Membership& m = *call.membership;
  CallOutcome outcome;
  if (ran.ok()) {
    outcome.algorithm = ran->algorithm;
    outcome.chunk_bytes = ran->chunk_bytes;
    if (call.output_region != nullptr) {
      // RunAsync() put it in place (PrepareInput checked the room).
      outcome.output_region = call.output_region;
      outcome.shared_output =
          absl::string_view(call.shared_output.data(),
                            OutputBytes(call.spec, m.world_size, m.rank));
    }
    outcome.output_dropped = call.in_place;
  } else {
    ran = NumberUsed(ran.status(), m, call.sequence);
    outcome.status = ran.status();
  }
  if (call.output_region != nullptr) {
    call.output_region->GiveScratch(std::move(running.scratch));
  }
  KeepOutput keep = [this, group = m.group, rank = m.rank, epoch = m.epoch,
                     sequence = call.sequence,
                     outcome = std::move(outcome)](std::string output) mutable {
    if (outcome.output_region == nullptr) outcome.output = std::move(output);
    ledger_.Keep(group, rank, epoch, sequence, std::move(outcome));
  };
  running.done(std::move(ran), std::move(keep));
}

grpc::ServerUnaryReactor* LocalApiService::Collective(
    grpc::CallbackServerContext* context,
    const v1::LocalCollectiveRequest* request,
    v1::LocalCollectiveResponse* response) {
  auto* reactor = new CollectiveReactor(response, &burst_memory_);
  if (absl::Status allowed = CheckLocalCaller(*context); !allowed.ok()) {
    reactor->End(allowed, nullptr);
    return reactor;
  }
  absl::string_view input;
  absl::StatusOr<LocalCall> call = PrepareMessageCall(*request, &input);
  if (!call.ok()) {
    reactor->End(call.status(), nullptr);
    return reactor;
  }
  StartCall(*std::move(call), *context, input, response->mutable_data(),
            [reactor](absl::StatusOr<RunResult> result, KeepOutput keep) {
              reactor->End(std::move(result), std::move(keep));
            });
  return reactor;
}

absl::StatusOr<LocalCall> LocalApiService::PrepareMessageCall(
    const v1::LocalCollectiveRequest& request, absl::string_view* input) const {
  absl::StatusOr<LocalCall> call = PrepareCall(request);
  if (!call.ok()) return call.status();
  absl::StatusOr<absl::string_view> prepared = PrepareInput(request, &*call);
  if (!prepared.ok()) return prepared.status();
  if (call->input_region != nullptr) {
    // Not bounded by a message: by --max_tensor_bytes, as a stream.
    absl::Status sized = CheckSizes(*call, prepared->size());
    if (!sized.ok()) return sized;
    call->checked = true;
  }
  *input = *prepared;
  return call;
}

absl::StatusOr<LocalCall> LocalApiService::PrepareInPlaceCall(
    const v1::LocalCollectiveRequest& request,
    const CallerMemory& memory) const {
  if (!request.data().empty() || request.has_shared_input() ||
      request.has_shared_output()) {
    return absl::InvalidArgumentError(
        "a call on its caller's own memory carries no data and no shared "
        "buffers");
  }
  absl::StatusOr<LocalCall> call = PrepareCall(request);
  if (!call.ok()) return call.status();
  absl::Status sized = CheckSizes(*call, memory.input.size());
  if (!sized.ok()) return sized;
  const Membership& m = *call->membership;
  const uint64_t output_bytes = OutputBytes(call->spec, m.world_size, m.rank);
  if (memory.output.size() < output_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the output has room for ", memory.output.size(),
                     " bytes; rank ", m.rank, "'s output of ",
                     DescribeSpec(call->spec), " is ", output_bytes, " bytes"));
  }
  call->in_place = true;
  call->checked = true;
  call->shared_output = memory.output;
  return call;
}

void LocalApiService::RunCall(v1::LocalCollectiveRequest request,
                              absl::Time deadline, LocalCallDone done) {
  // The request and the response live until the call ended: the input is
  // a view of the request's data.
  struct Running {
    v1::LocalCollectiveRequest request;
    v1::LocalCollectiveResponse response;
  };
  auto running = std::make_shared<Running>();
  running->request = std::move(request);
  absl::string_view input;
  absl::StatusOr<LocalCall> call = PrepareMessageCall(running->request, &input);
  if (!call.ok()) {
    done(call.status(), running->response, nullptr);
    return;
  }
  BurstMemory* burst = &burst_memory_;
  burst->Began();
  StartCall(*std::move(call), deadline, input, running->response.mutable_data(),
            [running, burst, done = std::move(done)](
                absl::StatusOr<RunResult> result, KeepOutput keep) mutable {
              if (result.ok()) {
                running->response.set_sequence(result->sequence);
                ToPlanProto(*result, running->response.mutable_plan());
              }
              done(result.status(), running->response, std::move(keep));
              // The reply went out: nothing of the call is left but this.
              done = nullptr;
              running = nullptr;
              burst->Ended();
            });
}

absl::StatusOr<RunResult> LocalApiService::RunInPlace(
    const v1::LocalCollectiveRequest& request, absl::Time deadline,
    const CallerMemory& memory) {
  absl::StatusOr<RunResult> ended = absl::InternalError("the call never ended");
  // With wait_here the call, and `done`, run on this thread.
  InPlace(request, deadline, memory, /*wait_here=*/true,
          [&ended](absl::StatusOr<RunResult> result) {
            ended = std::move(result);
          });
  return ended;
}

void LocalApiService::StartInPlace(const v1::LocalCollectiveRequest& request,
                                   absl::Time deadline,
                                   const CallerMemory& memory,
                                   InPlaceDone done) {
  InPlace(request, deadline, memory, /*wait_here=*/false, std::move(done));
}

void LocalApiService::InPlace(const v1::LocalCollectiveRequest& request,
                              absl::Time deadline, const CallerMemory& memory,
                              bool wait_here, InPlaceDone done) {
  absl::StatusOr<LocalCall> call = PrepareInPlaceCall(request, memory);
  if (!call.ok()) {
    done(call.status());
    return;
  }
  call->wait_here = wait_here;
  BurstMemory* burst = &burst_memory_;
  burst->Began();
  StartCall(*std::move(call), deadline, memory.input, /*output=*/nullptr,
            [burst, done = std::move(done)](absl::StatusOr<RunResult> result,
                                            KeepOutput keep) {
              if (keep) keep(std::string());  // in place: nothing to keep
              done(std::move(result));
              burst->Ended();
            });
}

void LocalApiService::SetCallSocket(std::string path) {
  absl::MutexLock lock(&mu_);
  call_socket_ = std::move(path);
}

grpc::ServerBidiReactor<v1::LocalChunkedRequest, v1::LocalChunkedResponse>*
LocalApiService::CollectiveChunked(grpc::CallbackServerContext* context) {
  if (absl::Status allowed = CheckLocalCaller(*context); !allowed.ok()) {
    return new RefusedReactor<grpc::ServerBidiReactor<
        v1::LocalChunkedRequest, v1::LocalChunkedResponse>>(
        ToGrpcStatus(allowed));
  }
  return new ChunkedCallReactor(this, context);
}

}  // namespace chorus
