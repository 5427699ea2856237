// WorkerRuntime: same-host all-reduces repeated on the segments kept from
// a same_host call (algorithms/same_host_binding.h), which never reach the
// coordinator, and the bindings kept per group epoch and rank.
#include <algorithm>
#include <optional>
#include <utility>

#include "common/answer_margin.h"
#include "server/worker/algorithms/same_host_binding.h"
#include "server/worker/dataplane/peer_transport.h"
#include "server/worker/worker_runtime.h"

namespace chorus {

bool WorkerRuntime::MayBindSameHost(const CollectiveSpec& spec,
                                    const CallBuffers& buffers,
                                    bool forced) const {
  // Checked results need the commit, where the coordinator compares them.
  return options_.bound_same_host && !options_.check_results &&
         spec.kind == CollectiveKind::kAllReduce && !buffers.on_device &&
         !forced;
}

std::shared_ptr<SameHostBinding> WorkerRuntime::ClaimBinding(
    const Membership& membership, const CollectiveSpec& spec,
    const CallBuffers& buffers, const RunOptions& options) const {
  const bool forced = options.algorithm != Algorithm::kUnspecified ||
                      options.device.has_value();
  if (!MayBindSameHost(spec, buffers, forced)) return nullptr;
  std::shared_ptr<SameHostBinding> binding = same_host_bindings_.Find(
      membership.group, membership.epoch, membership.rank);
  if (binding == nullptr || !binding->Fits(spec) || !binding->TryClaim()) {
    return nullptr;
  }
  return binding;
}

std::shared_ptr<const void> WorkerRuntime::AskToRepeat(
    const Membership& membership, const CollectiveSpec& spec,
    const CallBuffers& buffers, const RunOptions& options) {
  const bool forced = options.algorithm != Algorithm::kUnspecified ||
                      options.device.has_value();
  if (!MayBindSameHost(spec, buffers, forced) || membership.world_size < 2) {
    return nullptr;
  }
  std::shared_ptr<SameHostBinding> binding = same_host_bindings_.Find(
      membership.group, membership.epoch, membership.rank);
  if (binding != nullptr && binding->Fits(spec)) return nullptr;
  return repeat_asks_.TryAsk(membership.group, membership.epoch,
                             membership.rank, spec);
}

void WorkerRuntime::WithdrawFromBinding(const Membership& membership,
                                        uint64_t sequence) {
  std::shared_ptr<SameHostBinding> binding = same_host_bindings_.Find(
      membership.group, membership.epoch, membership.rank);
  if (binding != nullptr) WithdrawBound(*binding, sequence);
}

void WorkerRuntime::KeepBinding(const Membership& membership,
                                const CollectiveSpec& spec,
                                std::shared_ptr<SameHostBinding> binding) {
  binding->AddShape(spec);
  same_host_bindings_.Keep(membership.group, membership.epoch, membership.rank,
                           std::move(binding));
}

absl::StatusOr<RunResult> WorkerRuntime::RunBound(SameHostBinding& binding,
                                                  const Membership& membership,
                                                  uint64_t sequence,
                                                  const CollectiveSpec& spec,
                                                  const CallBuffers& buffers,
                                                  const RunOptions& options) {
  const absl::Time start = absl::Now();
  std::optional<absl::StatusOr<RunResult>> ran =
      RunOnBinding(binding, membership, sequence, spec, buffers, options);
  if (ran.has_value()) return *std::move(ran);
  RunOptions rest = options;
  rest.timeout = start + options.timeout - absl::Now();
  return AskAndFinish(membership, sequence, spec, buffers, rest);
}

std::optional<absl::StatusOr<RunResult>> WorkerRuntime::RunOnBinding(
    SameHostBinding& binding, const Membership& membership, uint64_t sequence,
    const CollectiveSpec& spec, const CallBuffers& buffers,
    const RunOptions& options) {
  // The binding is free again once the call is off it.
  struct Unclaimer {
    SameHostBinding& binding;
    ~Unclaimer() { binding.Unclaim(); }
  } unclaimer{binding};
  absl::Status valid = ValidateRankCall(membership, spec, buffers, options);
  if (!valid.ok()) return valid;
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + options.timeout;
  const absl::Duration patience = Patience(membership, options);
  PeerTransport patient(
      TransportOptions(membership, sequence, start + patience), &inbox_,
      sender_.get());
  PeerTransport transport(
      TransportOptions(membership, sequence,
                       deadline - AnswerMargin(options.timeout)),
      &inbox_, sender_.get());
  BoundCallArgs args;
  args.sequence = sequence;
  args.spec = spec;
  args.input = buffers.host_input;
  args.output = buffers.host_output;
  args.output_place = buffers.host_output_place;
  args.patience = &patient;
  args.transport = &transport;
  args.grace = patience;
  // A group aborted here goes to the coordinator for its verdict.
  absl::StatusOr<BoundEnd> ended = BoundEnd::kAskCoordinator;
  if (inbox_.AbortStatus(membership.group, membership.epoch).ok()) {
    ended = RunBoundSameHost(binding, args);
  }
  if (ended.ok() && *ended == BoundEnd::kAskCoordinator) return std::nullopt;
  absl::Status status = ended.status();
  if (status.ok()) {
    // The coordinator counts it with the rank's next call there.
    NoteLeaderRan(membership, sequence);
  } else {
    same_host_bindings_.Drop(membership.group, membership.epoch,
                             membership.rank);
    status = ReportFailure(membership, sequence, status, deadline);
  }
  RunResult result;
  result.sequence = sequence;
  result.algorithm = Algorithm::kSameHost;
  return EndCall(status, buffers, buffers.host_output, result);
}

}  // namespace chorus
