// WorkerRuntime: calls under the leader plan (algorithms/leader_call.h),
// which never reach the coordinator, and the account of them it gets with
// the rank's next call there (CollectiveRequest.leader_ran).
#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_detail.h"
#include "server/worker/algorithms/leader_call.h"
#include "server/worker/dataplane/peer_transport.h"
#include "server/worker/worker_runtime.h"

namespace chorus {
namespace {

// The key of a rank's leader-plan account.
std::string RankKey(const Membership& membership) {
  return absl::StrCat(membership.group, "/", membership.epoch, "/",
                      membership.rank);
}

}  // namespace

bool WorkerRuntime::RunsAtLeader(const Membership& membership,
                                 const CollectiveSpec& spec,
                                 const CallBuffers& buffers,
                                 const RunOptions& options) {
  if (!membership.leader_calls || buffers.on_device ||
      options.algorithm != Algorithm::kUnspecified ||
      options.device.has_value() || spec.kind == CollectiveKind::kSync) {
    return false;
  }
  return spec.kind == CollectiveKind::kBarrier ||
         CarriesInlineData(spec, membership.world_size, options.algorithm,
                           spec.kind == CollectiveKind::kAllReduce
                               ? membership.all_reduce_inline_max_bytes
                               : membership.inline_max_bytes);
}

absl::StatusOr<RunResult> WorkerRuntime::RunAtLeader(
    const Membership& membership, uint64_t sequence, const CollectiveSpec& spec,
    const CallBuffers& buffers, const RunOptions& options) {
  absl::Status valid = ValidateRankCall(membership, spec, buffers, options);
  if (!valid.ok()) return valid;
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + options.timeout;
  const absl::Duration patience = Patience(membership, options);
  PeerTransport transport(
      TransportOptions(membership, sequence, start + 2 * patience), &inbox_,
      sender_.get());
  LeaderCallArgs args;
  args.group = membership.group;
  args.epoch = membership.epoch;
  args.sequence = sequence;
  args.spec = spec;
  args.input = buffers.host_input;
  args.output = buffers.host_output;
  args.transport = &transport;
  args.patience_by = start + patience;
  args.grace_until = start + 2 * patience;
  absl::StatusOr<LeaderEnd> ended = RunLeaderCall(args);
  if (ended.ok() && *ended == LeaderEnd::kAskCoordinator) {
    RunOptions rest = options;
    rest.timeout = deadline - absl::Now();
    absl::StatusOr<RunResult> asked =
        AskAndFinish(membership, sequence, spec, buffers, rest);
    // The group epoch ended: later calls end at once instead of waiting
    // for the leader's patience first.
    if (std::optional<v1::ErrorDetail> detail = ErrorDetailOf(asked.status());
        absl::IsAborted(asked.status()) && detail.has_value() &&
        detail->group() == membership.group &&
        detail->epoch() == membership.epoch) {
      AbortLocally(membership.group, membership.epoch, asked.status());
    }
    return asked;
  }
  absl::Status status = ended.status();
  if (status.ok()) {
    // Done at the leader: the coordinator counts it with the next call it
    // gets from this rank.
    NoteLeaderRan(membership, sequence);
  } else {
    status = ReportFailure(membership, sequence, status, deadline);
  }
  RunResult result;
  result.sequence = sequence;
  result.algorithm = Algorithm::kLeader;
  return EndCall(status, buffers, buffers.host_output, result);
}

absl::Status WorkerRuntime::ValidateRankCall(const Membership& membership,
                                             const CollectiveSpec& spec,
                                             const CallBuffers& buffers,
                                             const RunOptions& options) {
  return ValidateCall(spec, membership.world_size, membership.rank,
                      buffers.host_input.size(), options.algorithm);
}

absl::Duration WorkerRuntime::Patience(const Membership& membership,
                                       const RunOptions& options) {
  return std::min(membership.leader_patience, options.timeout / 4);
}

void WorkerRuntime::NoteLeaderRan(const Membership& membership,
                                  uint64_t sequence) {
  absl::MutexLock lock(&leader_ran_mu_);
  std::vector<std::pair<uint64_t, uint64_t>>& ranges =
      leader_ran_[RankKey(membership)];
  if (!ranges.empty() && ranges.back().second + 1 == sequence) {
    ranges.back().second = sequence;
  } else {
    ranges.emplace_back(sequence, sequence);
  }
}

void WorkerRuntime::AttachLeaderRan(const Membership& membership,
                                    v1::CollectiveRequest* request) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  {
    absl::MutexLock lock(&leader_ran_mu_);
    if (leader_ran_.empty()) return;
    auto it = leader_ran_.find(RankKey(membership));
    if (it == leader_ran_.end()) return;
    ranges = std::move(it->second);
    leader_ran_.erase(it);
  }
  for (const auto& [first, last] : ranges) {
    v1::SequenceRange* range = request->add_leader_ran();
    range->set_first(first);
    range->set_last(last);
  }
}

}  // namespace chorus
