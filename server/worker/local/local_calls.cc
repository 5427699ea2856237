#include "server/worker/local/local_calls.h"

#include <glog/logging.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/collective.h"
#include "common/collective_spec_proto.h"
#include "common/device.h"
#include "common/device_proto.h"
#include "common/metrics.h"
#include "common/status_detail.h"

namespace chorus {
namespace {

// Joins and collectives alive at once that make a burst, whose freed memory
// goes back to the system (burst_memory.h).
constexpr int kBurstCalls = 1000;

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

void ToPlanProto(const RunResult& result, v1::Plan* plan) {
  plan->set_algorithm(static_cast<v1::Algorithm>(result.algorithm));
  plan->set_chunk_bytes(result.chunk_bytes);
}

void ToJoinResponse(const Membership& membership,
                    const std::string& call_socket,
                    v1::LocalJoinResponse* response) {
  response->set_epoch(membership.epoch);
  response->set_world_size(membership.world_size);
  response->set_rank(membership.rank);
  // A large group's members are not listed to its workers.
  if (membership.members_listed) {
    for (const Device& d : membership.devices) {
      response->add_member_devices(CanonicalName(d));
    }
  }
  response->set_call_socket(call_socket);
  response->set_min_world_size(membership.min_world_size);
  response->set_max_world_size(membership.max_world_size);
}

v1::SyncOutcome LocalCalls::SyncOutcomeOf(const RunResult& result) const {
  v1::SyncOutcome outcome;
  outcome.set_joiners_waiting(result.joiners_waiting);
  if (result.next != nullptr) {
    ToJoinResponse(*result.next, CallSocket(), outcome.mutable_next());
  }
  return outcome;
}

LocalCalls::LocalCalls(uint64_t max_tensor_bytes, uint64_t max_shared_bytes)
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

LocalCalls::~LocalCalls() = default;

void LocalCalls::Bind(CallRuntime* runtime) {
  absl::MutexLock lock(&mu_);
  runtime_ = runtime;
}

CallRuntime* LocalCalls::runtime() const {
  absl::MutexLock lock(&mu_);
  return runtime_;
}

void LocalCalls::SetCallSocket(std::string path) {
  absl::MutexLock lock(&mu_);
  call_socket_ = std::move(path);
}

void LocalCalls::BeginShutdown() {
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
  }
  ledger_.Close();
}

void LocalCalls::Drain() {
  tasks_.WaitIdle();
  absl::MutexLock lock(&calls_mu_);
  calls_mu_.Await(absl::Condition(
      +[](int* running) { return *running == 0; }, &calls_running_));
}

std::string LocalCalls::WorkerName() const {
  CallRuntime* bound = runtime();
  return bound == nullptr ? std::string() : bound->name();
}

void LocalCalls::Join(const JoinArgs& args, absl::Duration timeout,
                      JoinDone done) {
  CallRuntime* runtime = this->runtime();
  if (runtime == nullptr) {
    done(absl::UnavailableError("this worker is not registered yet"));
    return;
  }
  runtime->JoinAsync(
      args, timeout,
      [this, old_rank = args.rank, old_epoch = args.follow_epoch,
       done = std::move(done)](absl::StatusOr<Membership> joined) {
        if (!joined.ok()) {
          done(joined.status());
          return;
        }
        JoinedRank rank;
        rank.call_socket = Remember(*joined);
        if (old_epoch != 0) {
          Membership old;
          old.group = joined->group;
          old.rank = old_rank;
          old.epoch = old_epoch;
          Forget(old);
        }
        rank.membership = *std::move(joined);
        done(std::move(rank));
      });
}

std::string LocalCalls::CallSocket() const {
  absl::MutexLock lock(&mu_);
  return call_socket_;
}

std::string LocalCalls::Remember(const Membership& membership) {
  absl::MutexLock lock(&mu_);
  memberships_[{membership.group, membership.rank}] =
      std::make_shared<const Membership>(membership);
  return call_socket_;
}

absl::StatusOr<Membership> LocalCalls::FindMembership(const std::string& group,
                                                      uint64_t epoch,
                                                      int rank) const {
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

void LocalCalls::EndHold(const Membership& membership, bool released,
                         absl::string_view peer) {
  // A rank of an elastic group that leaves on purpose is reported too: its
  // group goes on without it at once.
  const bool leaving = released && membership.min_world_size > 0;
  if (leaving) {
    ReportGone(membership, absl::CancelledError("it left the group"), true);
  } else if (!released) {
    ReportGone(membership,
               absl::UnavailableError(absl::StrCat(
                   "its client process went away (its hold on the local API "
                   "of worker ",
                   WorkerName(), " from ", peer, " ended)")),
               false);
  }
  Forget(membership);
}

void LocalCalls::JoinUnanswered(const Membership& membership,
                                absl::string_view peer) {
  ReportGone(membership,
             absl::UnavailableError(absl::StrCat(
                 "its client process went away before its join through "
                 "worker ",
                 WorkerName(), " was answered (caller ", peer, ")")),
             false);
  Forget(membership);
}

void LocalCalls::ReportGone(const Membership& membership, absl::Status why,
                            bool leaving) {
  CallRuntime* bound = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (!shutting_down_) bound = runtime_;
  }
  if (bound == nullptr) return;
  tasks_.Spawn([bound, membership, leaving, why = std::move(why)] {
    const absl::Status verdict =
        bound->ReportRankGone(membership, why, leaving);
    LOG(WARNING) << "rank " << membership.rank << " of group "
                 << membership.group << " is gone (" << why
                 << "); the group's verdict: "
                 << verdict.ToString(
                        absl::StatusToStringMode::kWithNoExtraData);
  });
}

void LocalCalls::Forget(const Membership& membership) {
  {
    absl::MutexLock lock(&mu_);
    auto it = memberships_.find({membership.group, membership.rank});
    if (it != memberships_.end() && it->second->epoch == membership.epoch) {
      memberships_.erase(it);
    }
  }
  ledger_.Forget(membership.group, membership.rank, membership.epoch);
  regions_.Forget(membership.group, membership.rank, membership.epoch);
  CallRuntime* bound = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (!shutting_down_) bound = runtime_;
  }
  if (bound != nullptr) bound->RankEnded(membership);
}

absl::StatusOr<std::shared_ptr<SharedRegion>> LocalCalls::OpenRegion(
    const std::string& group, uint64_t epoch, int rank, uint64_t bytes) {
  absl::Status joined = FindMembership(group, epoch, rank).status();
  if (!joined.ok()) return joined;
  absl::StatusOr<std::shared_ptr<SharedRegion>> region =
      regions_.Open(group, rank, epoch, bytes);
  if (region.ok() && !FindMembership(group, epoch, rank).ok()) {
    // The rank left meanwhile (its Forget may have come first).
    regions_.Forget(group, rank, epoch);
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " of group ", group,
                     " left while its shared region was made"));
  }
  return region;
}

absl::Status LocalCalls::ReleaseRegion(const std::string& group, uint64_t epoch,
                                       int rank, uint64_t id) {
  absl::Status joined = FindMembership(group, epoch, rank).status();
  if (!joined.ok()) return joined;
  return regions_.Release(group, rank, epoch, id);
}

absl::StatusOr<LocalCall> LocalCalls::PrepareCall(
    const v1::LocalCollectiveRequest& request) const {
  LocalCall call;
  {
    absl::MutexLock lock(&mu_);
    call.runtime = runtime_;
    if (call.runtime == nullptr) {
      return absl::UnavailableError("this worker is not registered yet");
    }
    auto it = memberships_.find({request.group(), request.rank()});
    if (it == memberships_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("this worker has not joined group ", request.group(),
                       " as rank ", request.rank(), "; join first"));
    }
    if (it->second->epoch != request.epoch()) {
      return WithErrorDetail(
          absl::FailedPreconditionError(absl::StrCat(
              "stale epoch ", request.epoch(), " for group ", request.group(),
              "; this worker joined it at epoch ", it->second->epoch)),
          MakeErrorDetail("STALE_EPOCH", request.group(), request.epoch(), 0));
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

absl::StatusOr<absl::string_view> LocalCalls::PrepareInput(
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
  // Not bounded by a message: by --max_tensor_bytes, as a stream.
  absl::Status sized = CheckSizes(*call, input->size());
  if (!sized.ok()) return sized;
  call->checked = true;
  call->input_region = *std::move(input_region);
  call->output_region = *std::move(output_region);
  call->shared_output = *output;
  return absl::string_view(input->data(), input->size());
}

absl::Status LocalCalls::CheckSizes(const LocalCall& call,
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

absl::StatusOr<LocalCall> LocalCalls::PrepareStreamed(
    const v1::LocalCollectiveRequest& request, uint64_t input_bytes) const {
  if (!request.data().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CollectiveChunked: the header's call carries ", request.data().size(),
        " bytes of data; send the input in data pieces after the header"));
  }
  if (request.has_shared_input() || request.has_shared_output()) {
    return absl::InvalidArgumentError(
        "CollectiveChunked streams the data: shared_input and shared_output "
        "are for Collective");
  }
  absl::StatusOr<LocalCall> call = PrepareCall(request);
  if (!call.ok()) return call.status();
  absl::Status sized = CheckSizes(*call, input_bytes);
  if (!sized.ok()) return sized;
  call->checked = true;
  return call;
}

absl::Status LocalCalls::CheckNoPayload(
    const v1::LocalCollectiveRequest& request) {
  if (!request.data().empty() || request.has_shared_input() ||
      request.has_shared_output()) {
    return absl::InvalidArgumentError(
        "a call on its caller's own memory carries no data and no shared "
        "buffers");
  }
  return absl::OkStatus();
}

absl::StatusOr<LocalCall> LocalCalls::PrepareInPlace(
    const v1::LocalCollectiveRequest& request, absl::string_view input,
    uint64_t output_room) const {
  absl::Status bare = CheckNoPayload(request);
  if (!bare.ok()) return bare;
  absl::StatusOr<LocalCall> call = PrepareCall(request);
  if (!call.ok()) return call.status();
  absl::Status sized = CheckSizes(*call, input.size());
  if (!sized.ok()) return sized;
  const Membership& m = *call->membership;
  const uint64_t output_bytes = OutputBytes(call->spec, m.world_size, m.rank);
  if (output_room < output_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the output has room for ", output_room, " bytes; rank ",
                     m.rank, "'s output of ", DescribeSpec(call->spec), " is ",
                     output_bytes, " bytes"));
  }
  call->checked = true;
  return call;
}

}  // namespace chorus
