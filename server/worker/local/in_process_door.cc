#include "server/worker/local/in_process_door.h"

#include <optional>
#include <utility>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/collective_spec_proto.h"
#include "common/device_proto.h"

namespace chorus {
namespace {

// The request of call `sequence` of `membership`, with no data.
v1::LocalCollectiveRequest RequestOf(const Membership& membership,
                                     uint64_t sequence,
                                     const CollectiveSpec& spec,
                                     const RunOptions& options) {
  v1::LocalCollectiveRequest request;
  request.set_group(membership.group);
  request.set_rank(membership.rank);
  request.set_epoch(membership.epoch);
  request.set_sequence(sequence);
  *request.mutable_spec() = SpecToProto(spec);
  request.set_algorithm(static_cast<v1::Algorithm>(options.algorithm));
  if (options.device.has_value()) {
    *request.mutable_device() = DeviceToProto(*options.device);
  }
  return request;
}

}  // namespace

absl::StatusOr<Membership> InProcessDoor::Join(const JoinArgs& args,
                                               absl::Duration timeout) {
  absl::Notification joined;
  std::optional<absl::StatusOr<JoinedRank>> result;
  calls_->Join(args, timeout, [&](absl::StatusOr<JoinedRank> rank) {
    result = std::move(rank);
    joined.Notify();
  });
  joined.WaitForNotification();
  if (!result->ok()) return result->status();
  return std::move((*result)->membership);
}

void InProcessDoor::Leave(const Membership& membership) {
  calls_->EndHold(membership, /*released=*/true, "this process");
}

absl::StatusOr<RunResult> InProcessDoor::Run(
    const Membership& membership, uint64_t sequence, const CollectiveSpec& spec,
    absl::string_view input, std::string* output, const RunOptions& options) {
  return calls_->RunHere(RequestOf(membership, sequence, spec, options),
                         absl::Now() + options.timeout, input, output);
}

absl::StatusOr<RunResult> InProcessDoor::RunOnDevice(
    const Membership& membership, uint64_t sequence, const CollectiveSpec& spec,
    const void* input, void* output, const RunOptions& options) {
  return calls_->RunOnDevice(RequestOf(membership, sequence, spec, options),
                             absl::Now() + options.timeout, input, output,
                             options.stream);
}

absl::StatusOr<RunResult> InProcessDoor::RunOnDevice(
    const v1::LocalCollectiveRequest& request, absl::Time deadline,
    const void* input, void* output, void* stream) {
  return calls_->RunOnDevice(request, deadline, input, output, stream);
}

void InProcessDoor::StartOnDevice(const v1::LocalCollectiveRequest& request,
                                  absl::Time deadline, const void* input,
                                  void* output, void* stream,
                                  InPlaceDone done) {
  calls_->StartOnDevice(request, deadline, input, output, stream,
                        std::move(done));
}

void InProcessDoor::RunFrame(v1::LocalCallFrame frame, LocalReplySink send) {
  RunLocalCallFrame(calls_, std::move(frame), std::move(send));
}

absl::StatusOr<RunResult> InProcessDoor::RunInPlace(
    const v1::LocalCollectiveRequest& request, absl::Time deadline,
    const CallerMemory& memory) {
  BurstMemory* burst = calls_->burst_memory();
  burst->Began();
  absl::StatusOr<RunResult> ran = calls_->RunInPlace(request, deadline, memory);
  burst->Ended();
  return ran;
}

absl::StatusOr<std::string> InProcessDoor::SyncInPlace(
    const v1::LocalCollectiveRequest& request, absl::Time deadline) {
  absl::StatusOr<RunResult> ran = RunInPlace(request, deadline, CallerMemory{});
  if (!ran.ok()) return ran.status();
  return calls_->SyncOutcomeOf(*ran).SerializeAsString();
}

void InProcessDoor::StartInPlace(const v1::LocalCollectiveRequest& request,
                                 absl::Time deadline,
                                 const CallerMemory& memory, InPlaceDone done) {
  BurstMemory* burst = calls_->burst_memory();
  burst->Began();
  calls_->StartInPlace(
      request, deadline, memory,
      [burst, done = std::move(done)](absl::StatusOr<RunResult> result) {
        done(std::move(result));
        burst->Ended();
      });
}

}  // namespace chorus
