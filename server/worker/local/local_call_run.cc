// LocalCalls: how a call runs once checked (StartCall and what follows),
// and the entries that run one: Run, RunPrepared, RunInPlace, StartInPlace,
// RunOnDevice and StartOnDevice.
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/collective.h"
#include "common/status_detail.h"
#include "server/worker/local/local_calls.h"

namespace chorus {
namespace {

// `failure` of collective `sequence` of `membership`, which took its number,
// with an ErrorDetail saying so (number_used) added to the one it carries.
absl::Status NumberUsed(const absl::Status& failure,
                        const Membership& membership, uint64_t sequence) {
  v1::ErrorDetail detail = ErrorDetailOf(failure).value_or(MakeErrorDetail(
      "CALL_FAILED", membership.group, membership.epoch, sequence));
  detail.set_number_used(true);
  return WithErrorDetail(failure, detail);
}

// What identifies a call for its retries.
CallIdentity IdentityOf(const LocalCall& call, uint64_t input_bytes) {
  CallIdentity identity;
  identity.spec = call.spec;
  identity.algorithm = call.options.algorithm;
  identity.device = call.options.device;
  identity.input_bytes = input_bytes;
  return identity;
}

}  // namespace

struct LocalCalls::RunningCall {
  LocalCall call;
  // The output of a call on shared memory, before it goes in place.
  std::string scratch;
  CallDone done;
};

void LocalCalls::Run(const v1::LocalCollectiveRequest& request,
                     absl::Time deadline, v1::LocalCollectiveResponse* response,
                     CallDone done) {
  absl::StatusOr<LocalCall> call = PrepareCall(request);
  absl::StatusOr<absl::string_view> input =
      call.ok() ? PrepareInput(request, &*call)
                : absl::StatusOr<absl::string_view>(call.status());
  if (!input.ok()) {
    done(input.status(), nullptr);
    return;
  }
  StartCall(
      *std::move(call), deadline, *input, response->mutable_data(),
      [this, response, kind = request.spec().kind(), done = std::move(done)](
          absl::StatusOr<RunResult> result, KeepOutput keep) {
        if (result.ok()) {
          response->set_sequence(result->sequence);
          ToPlanProto(*result, response->mutable_plan());
          response->set_joiners_waiting(result->joiners_waiting);
          if (result->next != nullptr) {
            ToJoinResponse(*result->next, CallSocket(),
                           response->mutable_next());
          }
          if (kind == v1::COLLECTIVE_KIND_SYNC) {
            // A sync's output is its outcome (worker.proto).
            response->set_data(SyncOutcomeOf(*result).SerializeAsString());
          }
        }
        done(std::move(result), std::move(keep));
      });
}

void LocalCalls::RunPrepared(LocalCall call, absl::Time deadline,
                             absl::string_view input, std::string* output,
                             CallDone done) {
  StartCall(std::move(call), deadline, input, output, std::move(done));
}

void LocalCalls::StartCall(LocalCall call, absl::Time deadline,
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
  // sent from this thread, which then never waits. A caller that waits for
  // the call anyway waits for those too.
  const bool may_wait =
      ledger_.MayWait(joined.group, joined.rank, joined.epoch, call.sequence) ||
      !call.runtime->SendsWithoutWaiting();
  // A device call waits for its device's staging, on a task thread too.
  if ((may_wait || call.on_device) && !call.wait_here) {
    tasks_.Spawn([this, call = std::move(call), deadline, input, output,
                  done = std::move(done)]() mutable {
      TakeNumberAndRun(std::move(call), deadline, input, output,
                       std::move(done));
    });
  } else {
    TakeNumberAndRun(std::move(call), deadline, input, output, std::move(done));
  }
}

void LocalCalls::TakeNumberAndRun(LocalCall call, absl::Time deadline,
                                  absl::string_view input, std::string* output,
                                  CallDone done) {
  const Membership& m = *call.membership;
  absl::Status taken = call.checked
                           ? absl::OkStatus()
                           : ValidateCall(call.spec, m.world_size, m.rank,
                                          input.size(), call.options.algorithm);
  std::optional<CallOutcome> retried;
  if (taken.ok()) {
    taken = ledger_.Use(m.group, m.rank, m.epoch, call.sequence,
                        IdentityOf(call, input.size()), deadline, &retried);
  }
  if (!taken.ok()) {
    done(taken, nullptr);
  } else if (retried.has_value()) {
    AnswerRetry(call, *retried, output, done);
  } else {
    Launch(std::move(call), deadline, input, output, std::move(done));
  }
}

void LocalCalls::AnswerRetry(const LocalCall& call, const CallOutcome& first,
                             std::string* output, const CallDone& done) {
  // The first attempt's outcome: nothing runs again.
  const Membership& m = *call.membership;
  if (!first.status.ok()) {
    done(NumberUsed(first.status, m, call.sequence), nullptr);
    return;
  }
  if (first.output_dropped) {
    done(NumberUsed(absl::FailedPreconditionError(absl::StrCat(
                        "call #", call.sequence,
                        " ran on its caller's own memory in the worker's "
                        "process, which keeps no copy of its output for "
                        "a retry")),
                    m, call.sequence),
         nullptr);
    return;
  }
  RunResult result;
  result.sequence = call.sequence;
  result.algorithm = first.algorithm;
  result.chunk_bytes = first.chunk_bytes;
  const absl::string_view kept = first.output_region != nullptr
                                     ? first.shared_output
                                     : absl::string_view(first.output);
  if (call.output_region == nullptr && !call.in_place) {
    *output = std::string(kept);
  } else if (kept.size() > call.shared_output.size()) {
    done(absl::InternalError(
             absl::StrCat("the retried call's output of ", kept.size(),
                          " bytes does not fit the ", call.shared_output.size(),
                          " bytes of shared_output")),
         nullptr);
    return;
  } else if (kept.data() != call.shared_output.data()) {
    std::memmove(call.shared_output.data(), kept.data(), kept.size());
  }
  done(result, nullptr);
}

void LocalCalls::Launch(LocalCall call, absl::Time deadline,
                        absl::string_view input, std::string* output,
                        CallDone done) {
  call.options.timeout = deadline - absl::Now();
  // The call waits for the other ranks with no thread of its own: what it
  // needs until its end lives here.
  auto running = std::make_shared<RunningCall>();
  running->call = std::move(call);
  running->done = std::move(done);
  LocalCall& c = running->call;
  if (c.on_device) {
    EndCall(*running,
            c.runtime->RunOnDevice(*c.membership, c.sequence, c.spec,
                                   c.device_input, c.device_output, c.options));
    return;
  }
  // A call on shared memory or on its caller's memory lands in place (its
  // input may be the very bytes it writes): most host plans write there
  // directly (AlgorithmArgs::output_place), the others through a scratch
  // string (a region's is reused).
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
}

void LocalCalls::EndCall(RunningCall& running, absl::StatusOr<RunResult> ran) {
  const LocalCall& call = running.call;
  const Membership& m = *call.membership;
  CallOutcome outcome;
  if (ran.ok()) {
    // A sync admitted newcomers: the rank's next calls carry the new epoch.
    if (ran->next != nullptr) Remember(*ran->next);
    outcome.algorithm = ran->algorithm;
    outcome.chunk_bytes = ran->chunk_bytes;
    if (call.output_region != nullptr) {
      // The run put it in place (PrepareInput checked the room).
      outcome.output_region = call.output_region;
      outcome.shared_output =
          absl::string_view(call.shared_output.data(),
                            OutputBytes(call.spec, m.world_size, m.rank));
    }
    outcome.output_dropped = call.keeps_no_output;
  } else {
    ran = NumberUsed(ran.status(), m, call.sequence);
    outcome.status = ran.status();
  }
  if (call.output_region != nullptr) {
    call.output_region->GiveScratch(std::move(running.scratch));
  }
  if (call.keeps_no_output) {
    // Nothing of the output to wait for: the outcome is kept now.
    ledger_.Keep(m.group, m.rank, m.epoch, call.sequence, std::move(outcome));
    running.done(std::move(ran), nullptr);
    return;
  }
  KeepOutput keep = [this, group = m.group, rank = m.rank, epoch = m.epoch,
                     sequence = call.sequence,
                     outcome = std::move(outcome)](std::string output) mutable {
    if (outcome.output_region == nullptr) outcome.output = std::move(output);
    ledger_.Keep(group, rank, epoch, sequence, std::move(outcome));
  };
  running.done(std::move(ran), std::move(keep));
}

absl::StatusOr<RunResult> LocalCalls::RunOnThisThread(LocalCall call,
                                                      absl::Time deadline,
                                                      absl::string_view input,
                                                      std::string* output) {
  call.wait_here = true;
  call.keeps_no_output = true;
  absl::StatusOr<RunResult> ended = absl::InternalError("the call never ended");
  // With wait_here the call, and `done`, run on this thread.
  StartCall(std::move(call), deadline, input, output,
            [&ended](absl::StatusOr<RunResult> result, KeepOutput) {
              ended = std::move(result);
            });
  return ended;
}

absl::StatusOr<RunResult> LocalCalls::RunInPlace(
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

absl::StatusOr<RunResult> LocalCalls::RunHere(
    const v1::LocalCollectiveRequest& request, absl::Time deadline,
    absl::string_view input, std::string* output) {
  absl::StatusOr<LocalCall> call =
      PrepareInPlace(request, input, std::numeric_limits<uint64_t>::max());
  if (!call.ok()) return call.status();
  absl::StatusOr<RunResult> ran =
      RunOnThisThread(*std::move(call), deadline, input, output);
  if (!ran.ok()) output->clear();
  return ran;
}

void LocalCalls::StartInPlace(const v1::LocalCollectiveRequest& request,
                              absl::Time deadline, const CallerMemory& memory,
                              InPlaceDone done) {
  InPlace(request, deadline, memory, /*wait_here=*/false, std::move(done));
}

void LocalCalls::InPlace(const v1::LocalCollectiveRequest& request,
                         absl::Time deadline, const CallerMemory& memory,
                         bool wait_here, InPlaceDone done) {
  absl::StatusOr<LocalCall> call =
      PrepareInPlace(request, memory.input, memory.output.size());
  if (!call.ok()) {
    done(call.status());
    return;
  }
  call->in_place = true;
  call->keeps_no_output = true;
  call->shared_output = memory.output;
  call->wait_here = wait_here;
  StartCall(*std::move(call), deadline, memory.input, /*output=*/nullptr,
            [done = std::move(done)](absl::StatusOr<RunResult> result,
                                     KeepOutput) { done(std::move(result)); });
}

absl::StatusOr<LocalCall> LocalCalls::PrepareOnDevice(
    const v1::LocalCollectiveRequest& request, const void* input, void* output,
    void* stream) const {
  absl::Status bare = CheckNoPayload(request);
  if (!bare.ok()) return bare;
  // The buffers' sizes are the spec's: CheckDeviceMemory checks the spec.
  absl::StatusOr<LocalCall> call = PrepareCall(request);
  if (!call.ok()) return call.status();
  const Membership& m = *call->membership;
  const Device device = call->options.device.value_or(m.device);
  absl::Status usable =
      call->runtime->CheckDeviceMemory(m, call->spec, device, input, output);
  if (!usable.ok()) return usable;
  call->options.stream = stream;
  call->on_device = true;
  call->device_input = input;
  call->device_output = output;
  call->checked = true;
  return call;
}

absl::StatusOr<RunResult> LocalCalls::RunOnDevice(
    const v1::LocalCollectiveRequest& request, absl::Time deadline,
    const void* input, void* output, void* stream) {
  absl::StatusOr<LocalCall> call =
      PrepareOnDevice(request, input, output, stream);
  if (!call.ok()) return call.status();
  return RunOnThisThread(*std::move(call), deadline, absl::string_view(),
                         nullptr);
}

void LocalCalls::StartOnDevice(const v1::LocalCollectiveRequest& request,
                               absl::Time deadline, const void* input,
                               void* output, void* stream, InPlaceDone done) {
  absl::StatusOr<LocalCall> call =
      PrepareOnDevice(request, input, output, stream);
  if (!call.ok()) {
    done(call.status());
    return;
  }
  call->keeps_no_output = true;
  StartCall(*std::move(call), deadline, absl::string_view(), nullptr,
            [done = std::move(done)](absl::StatusOr<RunResult> result,
                                     KeepOutput) { done(std::move(result)); });
}

}  // namespace chorus
