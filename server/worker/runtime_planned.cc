// WorkerRuntime: the data-plane half of a planned collective (RunPlanned),
// its commit, and failure reports to the coordinator.
#include <glog/logging.h>
#include <grpcpp/client_context.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/answer_margin.h"
#include "common/grpc_status.h"
#include "common/status_detail.h"
#include "server/worker/algorithms/algorithm.h"
#include "server/worker/coordinator_status.h"
#include "server/worker/dataplane/peer_transport.h"
#include "server/worker/worker_runtime.h"

namespace chorus {
namespace {

// The shortest time a failure report gets, even past the call's deadline.
constexpr absl::Duration kMinReportTime = absl::Milliseconds(50);

}  // namespace

// What a planned call's algorithm works on besides the caller's buffers: a
// GPU buffer when the rank reduces on its GPU, and host copies of a device
// input or of an input converted to a wider type.
struct WorkerRuntime::StagedInput {
  absl::string_view host_input;
  std::unique_ptr<DeviceReduceBuffer> gpu;
  std::string staged;
  std::string host_copy;
  // The GPU buffer holds accumulators wider than the spec's type.
  bool widens = false;
};

absl::Status WorkerRuntime::RunPlanned(
    const Membership& membership, uint64_t sequence, const CollectiveSpec& spec,
    RunResult* plan, const Device& device, const CallBuffers& buffers,
    absl::string_view host_input, std::string* host_output, absl::Time deadline,
    bool may_bind, v1::CommitRequest* commit) {
  // Waits on peers end a margin before the rank must answer: time to
  // report the failure and hear the group's verdict (answer_margin.h).
  const absl::Duration left = deadline - absl::Now();
  const absl::Time data_deadline = deadline - AnswerMargin(left);
  PeerTransport transport(TransportOptions(membership, sequence, data_deadline),
                          &inbox_, sender_.get());
  AlgorithmArgs args;
  args.spec = spec;
  args.chunk_bytes = std::max<uint64_t>(1, plan->chunk_bytes);
  args.transport = &transport;
  args.output = host_output;
  args.output_place = buffers.host_output_place;
  // Kinds whose output every rank holds identically are checked at the
  // commit: each rank hashes its output as it writes it.
  std::optional<ResultHash> hash;
  if (options_.check_results && (spec.kind == CollectiveKind::kAllReduce ||
                                 spec.kind == CollectiveKind::kAllGather ||
                                 spec.kind == CollectiveKind::kBroadcast)) {
    hash.emplace(spec.dtype);
    args.hash = &*hash;
  }
  args.corrupt_for_testing = corrupt_results_for_testing_.load();
  std::shared_ptr<SameHostBinding> binding;
  if (may_bind && plan->algorithm == Algorithm::kSameHost) {
    args.bind_same_host = &binding;
  }
  const absl::Status status =
      plan->algorithm == Algorithm::kNccl
          ? RunOnNccl(membership, sequence, device, buffers, host_input,
                      data_deadline, args)
          : RunOnDataPlane(device, buffers, host_input, args, &plan->algorithm);
  if (!status.ok()) {
    return ReportFailure(membership, sequence, status, deadline);
  }
  if (binding != nullptr) KeepBinding(membership, spec, std::move(binding));
  // A hash that missed part of the output (recursive doubling on a GPU
  // buffer hashes nothing) is not sent: the call is then not checked.
  std::optional<uint64_t> result_hash;
  if (hash.has_value() &&
      hash->bytes() ==
          OutputBytes(spec, membership.world_size, membership.rank)) {
    result_hash = hash->value();
  }
  // The output is final: it reaches the caller's place before the verdict.
  PlaceOutput(buffers, host_output);
  commit->set_group(membership.group);
  commit->set_epoch(membership.epoch);
  commit->set_rank(membership.rank);
  commit->set_sequence(sequence);
  if (result_hash.has_value()) commit->set_result_hash(*result_hash);
  return absl::OkStatus();
}

PeerTransportOptions WorkerRuntime::TransportOptions(
    const Membership& membership, uint64_t sequence, absl::Time deadline) {
  PeerTransportOptions options;
  options.group = membership.group;
  options.epoch = membership.epoch;
  options.sequence = sequence;
  options.rank = membership.rank;
  options.addresses = membership.addresses;
  options.self_address = address_;
  options.worker_names = membership.worker_names;
  options.deadline = deadline;
  if (!membership.members_listed) {
    options.resolve = [this, &membership, deadline](int rank) {
      return ResolvePeer(membership, rank, deadline);
    };
  }
  return options;
}

absl::Status WorkerRuntime::RunOnDataPlane(const Device& device,
                                           const CallBuffers& buffers,
                                           absl::string_view host_input,
                                           AlgorithmArgs& args,
                                           Algorithm* algorithm) {
  StagedInput staged;
  absl::Status status =
      StageInput(args.spec, *algorithm, device, buffers, host_input, &staged);
  args.work = staged.gpu.get();
  args.input = staged.gpu != nullptr ? absl::string_view() : staged.host_input;
  if (status.ok()) status = RunAlgorithm(args, algorithm);
  if (status.ok()) {
    status = DeliverOutput(args.spec, device, buffers, staged, args.output);
  }
  return status;
}

absl::Status WorkerRuntime::RunOnNccl(const Membership& membership,
                                      uint64_t sequence, const Device& device,
                                      const CallBuffers& buffers,
                                      absl::string_view host_input,
                                      absl::Time deadline,
                                      const AlgorithmArgs& args) {
  if (device.kind != DeviceKind::kCuda) {
    return absl::InternalError(absl::StrCat(
        "the coordinator planned nccl for a rank on ", CanonicalName(device)));
  }
  NcclCall call;
  call.group = membership.group;
  call.epoch = membership.epoch;
  call.sequence = sequence;
  call.rank = membership.rank;
  call.world_size = membership.world_size;
  call.device = device.index;
  call.spec = args.spec;
  call.on_device = buffers.on_device;
  call.device_input = buffers.device_input;
  call.device_output = buffers.device_output;
  call.caller_stream = buffers.stream;
  call.host_input = host_input;
  call.host_output = args.output;
  call.deadline = deadline;
  call.aborted = [this, &membership] {
    return inbox_.AbortStatus(membership.group, membership.epoch);
  };
  call.hash = args.hash;
  return nccl_calls_->Run(call, *args.transport);
}

absl::Status WorkerRuntime::StageInput(const CollectiveSpec& spec,
                                       Algorithm algorithm,
                                       const Device& device,
                                       const CallBuffers& buffers,
                                       absl::string_view host_input,
                                       StagedInput* staged) {
  staged->host_input = host_input;
  // A Cuda(n) rank reduces on its GPU under the ring and recursive doubling.
  const bool on_gpu = device.kind == DeviceKind::kCuda &&
                      KindReduces(spec.kind) &&
                      (algorithm == Algorithm::kRing ||
                       algorithm == Algorithm::kRecursiveDoubling);
  // A reduction in a wider type than the spec's (f16/bf16 in f32, integer
  // avg in 64 bits) converts on the host: the GPU buffer holds the wide
  // accumulators that travel between ranks.
  const CollectiveSpec work_spec = WorkSpec(spec);
  staged->widens = on_gpu && work_spec.dtype != spec.dtype;
  absl::StatusOr<std::unique_ptr<DeviceReduceBuffer>> made;
  if (staged->widens) {
    absl::Status status;
    if (buffers.on_device) {
      status = device_buffers_->CopyFromDevice(
          device.index, buffers.device_input, buffers.host_input.size(),
          &staged->host_copy, buffers.stream);
      staged->host_input = staged->host_copy;
    }
    if (status.ok()) {
      status = ConvertBytes(spec.dtype, work_spec.dtype, staged->host_input,
                            &staged->staged);
    }
    if (!status.ok()) return status;
    made = device_buffers_->FromHost(device.index, work_spec, staged->staged);
  } else if (on_gpu) {
    made = buffers.on_device
               ? device_buffers_->FromDevice(
                     device.index, spec, buffers.device_input,
                     buffers.host_input.size(), buffers.stream)
               : device_buffers_->FromHost(device.index, spec, host_input);
  } else {
    if (buffers.on_device && host_input.data() == buffers.device_input) {
      // Byte-moving kinds and the same_host plan run on host bytes.
      absl::Status copied = device_buffers_->CopyFromDevice(
          device.index, buffers.device_input, buffers.host_input.size(),
          &staged->staged, buffers.stream);
      staged->host_input = staged->staged;
      return copied;
    }
    return absl::OkStatus();
  }
  if (!made.ok()) return made.status();
  staged->gpu = *std::move(made);
  return absl::OkStatus();
}

absl::Status WorkerRuntime::RunAlgorithm(const AlgorithmArgs& args,
                                         Algorithm* algorithm) {
  switch (*algorithm) {
    case Algorithm::kRing:
      return RunRing(args);
    case Algorithm::kRecursiveDoubling:
      return RunRecursiveDoubling(args);
    case Algorithm::kSameHost:
      return RunSameHost(args, algorithm);
    default:
      return absl::InternalError(
          absl::StrCat("the coordinator planned ", AlgorithmName(*algorithm),
                       ", which this worker does not run"));
  }
}

absl::Status WorkerRuntime::DeliverOutput(const CollectiveSpec& spec,
                                          const Device& device,
                                          const CallBuffers& buffers,
                                          const StagedInput& staged,
                                          std::string* host_output) {
  // all_reduce leaves its result in the GPU buffer; other results of a
  // device call are on the host. Either reaches its place (or, with a
  // caller's stream, is enqueued there) before the commit, so a failed copy
  // is reported like any data-plane failure.
  // (A widened all_reduce rounds its result into the host output.)
  if (staged.gpu != nullptr && spec.kind == CollectiveKind::kAllReduce &&
      !staged.widens) {
    return buffers.on_device
               ? staged.gpu->CopyToDevice(buffers.device_output, buffers.stream)
               : staged.gpu->CopyToHost(host_output);
  }
  if (buffers.on_device && !host_output->empty()) {
    return device_buffers_->CopyToDevice(device.index, *host_output,
                                         buffers.device_output, buffers.stream);
  }
  return absl::OkStatus();
}

absl::Status WorkerRuntime::ReportRankGone(const Membership& membership,
                                           const absl::Status& why,
                                           bool leaving) {
  // Sequence 0: no collective of it failed; the rank left.
  return ReportFailure(membership, /*sequence=*/0, why,
                       absl::Now() + options_.rpc_timeout, leaving);
}

bool WorkerRuntime::CallPortReady(absl::Time deadline) {
  // Not ready (no port, or it cannot be reached, e.g. firewalled): the
  // gRPC paths carry the call instead.
  return call_port_ != nullptr && session_->call_port() > 0 &&
         call_port_->Ready(deadline).ok();
}

absl::Status WorkerRuntime::CommitOnce(const v1::CommitRequest& request,
                                       absl::Time deadline) {
  if (CallPortReady(deadline)) return call_port_->Commit(request, deadline);
  v1::CommitResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  const absl::Time start = absl::Now();
  return FromCoordinator(
      session_->stub()->Commit(&context, request, &response),
      options_.coordinator,
      absl::StrCat("the commit of collective #", request.sequence(),
                   " of group ", request.group()),
      start);
}

absl::Status WorkerRuntime::ReportFailure(const Membership& membership,
                                          uint64_t sequence,
                                          const absl::Status& failure,
                                          absl::Time answer_by, bool leaving) {
  // The group's abort already reached this worker: that is the verdict.
  if (absl::Status aborted =
          inbox_.AbortStatus(membership.group, membership.epoch);
      !aborted.ok()) {
    return aborted;
  }
  v1::ReportFailureRequest request;
  request.set_group(membership.group);
  request.set_epoch(membership.epoch);
  request.set_rank(membership.rank);
  request.set_sequence(sequence);
  request.set_code(static_cast<int>(failure.code()));
  request.set_message(std::string(failure.message()));
  request.set_leaving(leaving);
  // A broken connection names the peer it lost (PeerGoneError,
  // UnreachableError): an elastic group goes on without it.
  if (std::optional<v1::ErrorDetail> detail = ErrorDetailOf(failure);
      detail.has_value() && detail->reason() == "PEER_LOST") {
    *request.mutable_lost_ranks() = detail->lost_ranks();
  }
  // The report is not a wait: the coordinator answers at once, unless it
  // is gone or paused; the rank's answer must not wait longer than its
  // call may.
  const absl::Time now = absl::Now();
  const absl::Time deadline = std::min(
      now + options_.rpc_timeout, std::max(answer_by, now + kMinReportTime));
  v1::ReportFailureResponse response;
  absl::Status reported;
  if (CallPortReady(deadline)) {
    absl::StatusOr<v1::ReportFailureResponse> answered =
        call_port_->ReportFailure(request, deadline);
    reported = answered.status();
    if (answered.ok()) response = *std::move(answered);
  } else {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    reported = FromCoordinator(
        session_->stub()->ReportFailure(&context, request, &response),
        options_.coordinator, "the failure report", now);
  }
  if (!reported.ok()) {
    LOG(WARNING) << "could not report "
                 << failure.ToString(absl::StatusToStringMode::kWithNoExtraData)
                 << ": " << reported;
    // The rank's own account, and why the group's verdict is missing.
    return RewordedStatus(
        failure, failure.code(),
        absl::StrCat(failure.message(), "; ", reported.message()));
  }
  if (!response.has_abort()) return failure;
  const absl::Status verdict =
      StatusWithDetail(static_cast<absl::StatusCode>(response.abort().code()),
                       response.abort().message(), response.abort().detail());
  AbortLocally(membership.group, membership.epoch, verdict);
  return verdict;
}

}  // namespace chorus
