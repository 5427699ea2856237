#include "chorus/communicator.h"

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "chorus/status_facts.h"
#include "chorus/v1/worker.grpc.pb.h"
#include "client/src/membership_hold.h"
#include "common/collective_spec_proto.h"
#include "common/device_proto.h"
#include "common/grpc_status.h"
#include "common/local_socket_path.h"
#include "common/net.h"
#include "server/worker/local/in_process_door.h"
#include "server/worker/local/local_worker.h"

namespace chorus {
namespace {

// Whether the daemon refused a call before it took its number: those
// refusals carry no ErrorDetail with number_used (worker.proto, "Sequence
// numbers"), and neither does gRPC's own refusal of an oversized message.
bool TookNoNumber(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kResourceExhausted:
      break;
    default:
      return false;
  }
  const std::optional<StatusFacts> facts = StatusFactsOf(status);
  return !facts.has_value() || !facts->number_used;
}

// A handle whose result is `refusal`, for a call refused before it took a
// sequence number.
CollectiveHandle Refused(absl::Status refusal) {
  std::promise<absl::StatusOr<CallResult>> failed;
  failed.set_value(std::move(refusal));
  return CollectiveHandle(failed.get_future());
}

// How long joining through a daemon waits for the connection to it.
constexpr absl::Duration kConnectWait = absl::Seconds(5);

// Runs collectives through a worker daemon's local API.
class DaemonCommunicator final : public Communicator {
 public:
  DaemonCommunicator(std::unique_ptr<v1::WorkerLocal::Stub> stub,
                     std::string group, int world_size, int rank,
                     uint64_t epoch, const JoinOptions& options)
      : Communicator(std::move(group), world_size, rank, epoch),
        device_(options.device),
        timeout_(options.timeout),
        stub_(std::move(stub)),
        hold_(std::make_unique<MembershipHold>(stub_.get(), this->group(),
                                               epoch, rank)) {}
  ~DaemonCommunicator() override {
    WaitForAsyncCalls();
    // The rank leaves on purpose: the daemon does not report it gone.
    hold_->Release();
  }

 protected:
  absl::StatusOr<CallResult> RunSequenced(uint64_t sequence,
                                          const CollectiveSpec& spec,
                                          absl::string_view input,
                                          std::string* output,
                                          const CallOptions& options) override {
    v1::LocalCollectiveRequest request;
    request.set_group(group());
    request.set_rank(rank());
    request.set_epoch(epoch());
    request.set_sequence(sequence);
    *request.mutable_spec() = SpecToProto(spec);
    request.set_algorithm(static_cast<v1::Algorithm>(options.algorithm));
    request.set_data(input.data(), input.size());
    if (options.device.has_value()) {
      *request.mutable_device() = DeviceToProto(*options.device);
    }
    v1::LocalCollectiveResponse response;
    grpc::ClientContext context;
    context.set_deadline(DeadlineAfter(options.timeout));
    absl::Status status =
        FromGrpcStatus(stub_->Collective(&context, request, &response));
    if (!status.ok()) {
      if (TookNoNumber(status)) GiveBackSequence(sequence);
      return status;
    }
    *output = std::move(*response.mutable_data());
    CallResult result;
    result.sequence = response.sequence();
    result.algorithm = static_cast<Algorithm>(response.plan().algorithm());
    result.joiners_waiting = response.joiners_waiting();
    if (response.has_next()) result.next = MembershipOf(response.next());
    return result;
  }

  absl::StatusOr<GroupMembership> FollowEpoch(uint64_t epoch,
                                              int rank) override {
    v1::LocalJoinRequest request;
    request.set_group(group());
    request.set_rank(rank);
    request.set_follow_epoch(epoch);
    *request.mutable_device() = DeviceToProto(device_);
    v1::LocalJoinResponse response;
    grpc::ClientContext context;
    context.set_deadline(DeadlineAfter(timeout_));
    absl::Status status =
        FromGrpcStatus(stub_->JoinGroup(&context, request, &response));
    if (!status.ok()) return status;
    const GroupMembership next = MembershipOf(response);
    hold_->Move(next.epoch, next.rank);
    return next;
  }

 private:
  static GroupMembership MembershipOf(const v1::LocalJoinResponse& response) {
    GroupMembership membership;
    membership.epoch = response.epoch();
    membership.world_size = response.world_size();
    membership.rank = response.rank();
    return membership;
  }

  const Device device_;
  const absl::Duration timeout_;
  std::unique_ptr<v1::WorkerLocal::Stub> stub_;
  // Holds the rank on the daemon for as long as this process lives.
  std::unique_ptr<MembershipHold> hold_;
};

RunOptions ToRunOptions(const CallOptions& options) {
  RunOptions run;
  run.algorithm = options.algorithm;
  run.timeout = options.timeout;
  run.device = options.device;
  run.stream = options.stream;
  return run;
}

// Runs collectives through the in-process door of a worker in this process.
class EmbeddedCommunicator final : public Communicator {
 public:
  EmbeddedCommunicator(InProcessDoor* door, Membership membership)
      : Communicator(membership.group, membership.world_size, membership.rank,
                     membership.epoch),
        door_(door),
        membership_(std::make_shared<const Membership>(std::move(membership))) {
  }
  ~EmbeddedCommunicator() override {
    WaitForAsyncCalls();
    door_->Leave(*current());
  }

 protected:
  absl::StatusOr<CallResult> RunSequenced(uint64_t sequence,
                                          const CollectiveSpec& spec,
                                          absl::string_view input,
                                          std::string* output,
                                          const CallOptions& options) override {
    return Ended(sequence, door_->Run(*current(), sequence, spec, input, output,
                                      ToRunOptions(options)));
  }

  // The door checks device memory before the call takes its number.
  absl::Status CheckDeviceMemory(const CollectiveSpec&, const Device&,
                                 const void*, const void*) const override {
    return absl::OkStatus();
  }

  absl::StatusOr<CallResult> RunSequencedOnDevice(
      uint64_t sequence, const CollectiveSpec& spec, const void* input,
      void* output, const CallOptions& options) override {
    return Ended(sequence, door_->RunOnDevice(*current(), sequence, spec, input,
                                              output, ToRunOptions(options)));
  }

  absl::StatusOr<GroupMembership> FollowEpoch(uint64_t epoch,
                                              int rank) override {
    JoinArgs args;
    args.group = group();
    args.rank = rank;
    args.follow_epoch = epoch;
    args.device = current()->device;
    absl::StatusOr<Membership> next = door_->Join(args, kFollowTimeout);
    if (!next.ok()) return next.status();
    return Moved(std::make_shared<const Membership>(*std::move(next)));
  }

 private:
  // How long a rank waits to follow its group into the next epoch (while the
  // group is below its minimum).
  static constexpr absl::Duration kFollowTimeout = absl::Minutes(1);

  std::shared_ptr<const Membership> current() const {
    absl::MutexLock lock(&membership_mu_);
    return membership_;
  }

  // Records `next` as the rank's membership; returns it as the caller sees.
  GroupMembership Moved(std::shared_ptr<const Membership> next) {
    GroupMembership moved;
    moved.epoch = next->epoch;
    moved.world_size = next->world_size;
    moved.rank = next->rank;
    absl::MutexLock lock(&membership_mu_);
    membership_ = std::move(next);
    return moved;
  }

  // The result of call `sequence`, whose number is given back when the call
  // was refused before it took it: in this process every failure after the
  // number carries an ErrorDetail with number_used set.
  absl::StatusOr<CallResult> Ended(uint64_t sequence,
                                   absl::StatusOr<RunResult> ran) {
    if (!ran.ok()) {
      const std::optional<StatusFacts> facts = StatusFactsOf(ran.status());
      if (!facts.has_value() || !facts->number_used) {
        GiveBackSequence(sequence);
      }
      return ran.status();
    }
    CallResult result;
    result.sequence = ran->sequence;
    result.algorithm = ran->algorithm;
    result.joiners_waiting = ran->joiners_waiting;
    if (ran->next != nullptr) result.next = Moved(ran->next);
    return result;
  }

  InProcessDoor* const door_;  // not owned
  mutable absl::Mutex membership_mu_;
  std::shared_ptr<const Membership> membership_ ABSL_GUARDED_BY(membership_mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::JoinThroughDaemon(
    const std::string& worker_address, const std::string& group, int world_size,
    int rank, const JoinOptions& options) {
  if (absl::Status peer = CheckSocketPeer(worker_address); !peer.ok()) {
    return peer;
  }
  std::shared_ptr<grpc::Channel> channel =
      MakeChannel(worker_address, Role::kWorker);
  // A fresh channel's first connection attempt can fail on a busy host; let
  // it retry (with its backoff) for a moment rather than fail the join at
  // once. A daemon that is not there still fails the join, after this wait.
  channel->WaitForConnected(absl::ToChronoTime(
      absl::Now() + std::min(options.timeout, kConnectWait)));
  auto stub = v1::WorkerLocal::NewStub(channel);
  const bool newcomer = rank == kNewcomer;
  v1::LocalJoinRequest request;
  request.set_group(group);
  request.set_world_size(newcomer ? 0 : world_size);
  request.set_rank(newcomer ? 0 : rank);
  request.set_newcomer(newcomer);
  *request.mutable_device() = DeviceToProto(options.device);
  request.set_min_world_size(options.min_world_size);
  request.set_max_world_size(options.max_world_size);
  v1::LocalJoinResponse response;
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(options.timeout));
  absl::Status status =
      FromGrpcStatus(stub->JoinGroup(&context, request, &response));
  if (!status.ok()) return status;
  return std::unique_ptr<Communicator>(
      new DaemonCommunicator(std::move(stub), group, response.world_size(),
                             response.rank(), response.epoch(), options));
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::JoinEmbedded(
    LocalWorker* worker, const std::string& group, int world_size, int rank,
    const JoinOptions& options) {
  InProcessDoor* door = worker->door();
  JoinArgs args;
  args.group = group;
  args.newcomer = rank == kNewcomer;
  args.world_size = args.newcomer ? 0 : world_size;
  args.rank = args.newcomer ? 0 : rank;
  args.device = options.device;
  args.min_world_size = options.min_world_size;
  args.max_world_size = options.max_world_size;
  absl::StatusOr<Membership> membership = door->Join(args, options.timeout);
  if (!membership.ok()) return membership.status();
  return std::unique_ptr<Communicator>(
      new EmbeddedCommunicator(door, *std::move(membership)));
}

Communicator::~Communicator() = default;

int Communicator::rank() const {
  absl::MutexLock lock(&mu_);
  return rank_;
}

int Communicator::world_size() const {
  absl::MutexLock lock(&mu_);
  return world_size_;
}

uint64_t Communicator::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

void Communicator::MoveTo(const GroupMembership& membership) {
  absl::MutexLock lock(&mu_);
  epoch_ = membership.epoch;
  world_size_ = membership.world_size;
  rank_ = membership.rank;
  next_sequence_ = 1;
}

absl::StatusOr<CallResult> Communicator::Settled(
    absl::StatusOr<CallResult> result) {
  if (result.ok()) {
    if (result->next.has_value()) MoveTo(*result->next);
    return result;
  }
  const std::optional<StatusFacts> facts = StatusFactsOf(result.status());
  if (!facts.has_value() || facts->reason != "MEMBERSHIP_CHANGED") {
    return result;
  }
  int rank;
  {
    absl::MutexLock lock(&mu_);
    // Another call of the revoked epoch moved already.
    if (epoch_ != facts->epoch) return result;
    rank = rank_;
  }
  absl::StatusOr<GroupMembership> next = FollowEpoch(facts->epoch, rank);
  if (!next.ok()) return next.status();
  MoveTo(*next);
  return result;
}

absl::StatusOr<GroupMembership> Communicator::Sync(const CallOptions& options) {
  const int world = world_size();
  CollectiveSpec spec;
  spec.kind = CollectiveKind::kSync;
  std::string unused;
  absl::StatusOr<CallResult> synced = Run(spec, "", &unused, options);
  if (!synced.ok()) return synced.status();
  GroupMembership membership;
  {
    absl::MutexLock lock(&mu_);
    membership.epoch = epoch_;
    membership.world_size = world_size_;
    membership.rank = rank_;
  }
  for (int rank = world; rank < membership.world_size; ++rank) {
    membership.joined.push_back(rank);
  }
  return membership;
}

void Communicator::WaitForAsyncCalls() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* in_flight) { return *in_flight == 0; }, &in_flight_));
}

absl::Status Communicator::CheckCall(const CollectiveSpec& spec,
                                     uint64_t input_bytes,
                                     const CallOptions& options) const {
  absl::Status valid =
      ValidateCall(spec, world_size(), rank(), input_bytes, options.algorithm);
  if (valid.ok() && options.device.has_value()) {
    valid = ValidateDevice(*options.device);
  }
  return valid;
}

void Communicator::GiveBackSequence(uint64_t sequence) {
  absl::MutexLock lock(&mu_);
  if (next_sequence_ == sequence + 1) next_sequence_ = sequence;
}

uint64_t Communicator::NextSequence() {
  absl::MutexLock lock(&mu_);
  return next_sequence_++;
}

absl::StatusOr<CallResult> Communicator::Run(const CollectiveSpec& spec,
                                             absl::string_view input,
                                             std::string* output,
                                             const CallOptions& options) {
  // Refuse bad input before it takes a sequence number.
  absl::Status valid = CheckCall(spec, input.size(), options);
  if (!valid.ok()) return valid;
  return Settled(RunSequenced(NextSequence(), spec, input, output, options));
}

struct Communicator::DeviceCall {
  // options.device set to the tensors' device.
  CallOptions options;
  // Null where the call reads or writes nothing.
  const void* input = nullptr;
  void* output = nullptr;
  // Cpu tensors: their sizes; the call runs on host bytes.
  bool on_host = false;
  uint64_t input_bytes = 0;
  uint64_t output_bytes = 0;
};

absl::StatusOr<Communicator::DeviceCall> Communicator::CheckDeviceCall(
    const CollectiveSpec& spec, const DeviceTensor& input,
    const DeviceTensor& output, const CallOptions& options) const {
  const Device& device = input.device;
  if (!SameDevice(device, output.device)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the input is on ", CanonicalName(device),
                     " but the output on ", CanonicalName(output.device)));
  }
  if (options.device.has_value() && !SameDevice(*options.device, device)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the tensors are on ", CanonicalName(device),
                     " but the call names ", CanonicalName(*options.device)));
  }
  if (input.dtype != spec.dtype || output.dtype != spec.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("the tensors hold ", DTypeName(input.dtype), " and ",
                     DTypeName(output.dtype), " but the call is on ",
                     DTypeName(spec.dtype)));
  }
  DeviceCall call;
  call.options = options;
  call.options.device = device;
  const int world = world_size();
  const int rank = this->rank();
  absl::Status valid = ValidateSpec(spec, world);
  if (!valid.ok()) return valid;
  const uint64_t element = DTypeSize(spec.dtype);
  const uint64_t in_bytes = InputBytes(spec, world, rank);
  const uint64_t out_bytes = OutputBytes(spec, world, rank);
  const uint64_t max_count = std::numeric_limits<uint64_t>::max() / element;
  // As with host buffers, an off-root rank of broadcast or scatter may pass
  // nothing or a full-size input, which the call ignores.
  const bool input_fits =
      input.count <= max_count &&
      CheckInputSize(spec, world, rank, input.count * element).ok();
  if (!input_fits || output.count > max_count ||
      output.count * element != out_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensors of ", input.count, " and ", output.count,
                     " elements for a call that takes ", in_bytes / element,
                     InputMayBeEmpty(spec, rank) ? " (or a full-size one)" : "",
                     " and gives ", out_bytes / element));
  }
  call.output = output.count == 0 ? nullptr : output.data;
  if (device.kind == DeviceKind::kCpu) {
    call.on_host = true;
    call.input = input.data;
    call.input_bytes = input.count * element;
    call.output_bytes = out_bytes;
    valid = CheckCall(spec, call.input_bytes, call.options);
    if (!valid.ok()) return valid;
    return call;
  }
  // An input the call ignores (off-root) passes no pointer.
  const bool ignored = in_bytes == 0 && InputMayBeEmpty(spec, rank);
  valid = CheckCall(spec, ignored ? 0 : input.count * element, call.options);
  call.input = ignored || input.count == 0 ? nullptr : input.data;
  if (valid.ok()) {
    valid = CheckDeviceMemory(spec, device, call.input, call.output);
  }
  if (!valid.ok()) return valid;
  return call;
}

absl::StatusOr<CallResult> Communicator::RunDeviceCall(
    uint64_t sequence, const CollectiveSpec& spec, const DeviceCall& call) {
  if (!call.on_host) {
    return RunSequencedOnDevice(sequence, spec, call.input, call.output,
                                call.options);
  }
  std::string result;
  absl::StatusOr<CallResult> ran = RunSequenced(
      sequence, spec,
      absl::string_view(static_cast<const char*>(call.input), call.input_bytes),
      &result, call.options);
  if (!ran.ok()) return ran;
  if (!result.empty()) std::memcpy(call.output, result.data(), result.size());
  return ran;
}

absl::StatusOr<CallResult> Communicator::RunOnDevice(
    const CollectiveSpec& spec, const DeviceTensor& input,
    const DeviceTensor& output, const CallOptions& options) {
  absl::StatusOr<DeviceCall> call =
      CheckDeviceCall(spec, input, output, options);
  if (!call.ok()) return call.status();
  return Settled(RunDeviceCall(NextSequence(), spec, *call));
}

CollectiveHandle Communicator::RunOnDeviceAsync(const CollectiveSpec& spec,
                                                const DeviceTensor& input,
                                                const DeviceTensor& output,
                                                const CallOptions& options) {
  absl::StatusOr<DeviceCall> call =
      CheckDeviceCall(spec, input, output, options);
  if (!call.ok()) return Refused(call.status());
  return InBackground([this, spec, call = *std::move(call)](uint64_t sequence) {
    return RunDeviceCall(sequence, spec, call);
  });
}

absl::Status Communicator::CheckDeviceMemory(const CollectiveSpec&,
                                             const Device& device, const void*,
                                             const void*) const {
  return absl::FailedPreconditionError(
      absl::StrCat("a worker daemon cannot reach this process's memory on ",
                   CanonicalName(device),
                   "; send host bytes with Run() and name the device in "
                   "CallOptions.device, or join with JoinEmbedded"));
}

absl::StatusOr<CallResult> Communicator::RunSequencedOnDevice(
    uint64_t, const CollectiveSpec&, const void*, void*, const CallOptions&) {
  return absl::FailedPreconditionError(
      "this communicator cannot reach device memory");
}

CollectiveHandle Communicator::RunAsync(const CollectiveSpec& spec,
                                        std::string input, std::string* output,
                                        const CallOptions& options) {
  absl::Status valid = CheckCall(spec, input.size(), options);
  if (!valid.ok()) return Refused(valid);
  return InBackground([this, spec, input = std::move(input), output,
                       options](uint64_t sequence) {
    return RunSequenced(sequence, spec, input, output, options);
  });
}

CollectiveHandle Communicator::InBackground(
    std::function<absl::StatusOr<CallResult>(uint64_t)> run) {
  uint64_t sequence;
  {
    absl::MutexLock lock(&mu_);
    sequence = next_sequence_++;
    ++in_flight_;
  }
  return CollectiveHandle(
      std::async(std::launch::async, [this, sequence, run = std::move(run)] {
        absl::StatusOr<CallResult> result = Settled(run(sequence));
        absl::MutexLock lock(&mu_);
        --in_flight_;
        return result;
      }));
}

absl::Status Communicator::Barrier(const CallOptions& options) {
  CollectiveSpec spec;
  spec.kind = CollectiveKind::kBarrier;
  std::string unused;
  return Run(spec, "", &unused, options).status();
}

}  // namespace chorus
