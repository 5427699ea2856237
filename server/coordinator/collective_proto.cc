#include "server/coordinator/collective_proto.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/device_proto.h"

namespace chorus {

CollectiveCall CollectiveCallFromProto(const v1::CollectiveRequest& request,
                                       absl::Time deadline) {
  CollectiveCall call;
  call.group = request.group();
  call.epoch = request.epoch();
  call.rank = request.rank();
  call.sequence = request.sequence();
  call.spec.kind = static_cast<CollectiveKind>(request.kind());
  call.spec.dtype = static_cast<DType>(request.dtype());
  call.spec.count = request.count();
  call.spec.op = static_cast<ReduceOp>(request.op());
  call.spec.root = request.root();
  call.algorithm = static_cast<Algorithm>(request.algorithm());
  if (request.has_device()) call.device = DeviceFromProto(request.device());
  call.has_data = request.has_inline_data();
  call.data = request.inline_data();
  call.deadline = deadline;
  return call;
}

CommitCall CommitCallFromProto(const v1::CommitRequest& request,
                               absl::Time deadline) {
  CommitCall call;
  call.group = request.group();
  call.epoch = request.epoch();
  call.rank = request.rank();
  call.sequence = request.sequence();
  if (request.has_result_hash()) call.result_hash = request.result_hash();
  call.deadline = deadline;
  return call;
}

void CollectiveOutcomeToProto(CollectiveOutcome outcome,
                              v1::CollectiveResponse* response) {
  response->set_sequence(outcome.sequence);
  response->mutable_plan()->set_algorithm(
      static_cast<v1::Algorithm>(outcome.plan.algorithm));
  response->mutable_plan()->set_chunk_bytes(outcome.plan.chunk_bytes);
  response->set_inline_result(std::move(outcome.data));
}

absl::Time CoreDeadline(absl::Time now, absl::Time client_deadline,
                        absl::Duration max_wait) {
  const absl::Time deadline = std::min(now + max_wait, client_deadline);
  const absl::Duration margin = std::clamp(
      (deadline - now) / 10, absl::Milliseconds(5), absl::Milliseconds(250));
  return deadline - margin;
}

v1::CollectiveStreamReply StreamReply(
    uint64_t call_id, absl::StatusOr<CollectiveOutcome> outcome) {
  v1::CollectiveStreamReply reply;
  reply.set_call_id(call_id);
  if (outcome.ok()) {
    CollectiveOutcomeToProto(*std::move(outcome), reply.mutable_response());
  } else {
    reply.set_code(static_cast<int>(outcome.status().code()));
    reply.set_message(std::string(outcome.status().message()));
  }
  return reply;
}

void StartStreamedCall(CollectiveCallHost& host,
                       const v1::CollectiveStreamRequest& request,
                       std::function<void(v1::CollectiveStreamReply)> reply) {
  const uint64_t call_id = request.call_id();
  if (request.has_call() == request.has_commit()) {
    reply(StreamReply(
        call_id, absl::InvalidArgumentError(absl::StrCat(
                     "collective stream call ", call_id,
                     request.has_call() ? " carries both a CollectiveRequest "
                                          "and a CommitRequest"
                                        : " carries no CollectiveRequest"))));
    return;
  }
  if (request.timeout_us() < 0) {
    reply(StreamReply(call_id, absl::InvalidArgumentError(absl::StrCat(
                                   "collective stream call ", call_id,
                                   " has a negative timeout (",
                                   request.timeout_us(), " us)"))));
    return;
  }
  const absl::Time client_deadline =
      request.timeout_us() == 0
          ? absl::InfiniteFuture()
          : host.Now() + absl::Microseconds(request.timeout_us());
  if (request.has_commit()) {
    host.StartCommit(request.commit(), client_deadline,
                     [call_id, reply = std::move(reply)](absl::Status status) {
                       v1::CollectiveStreamReply verdict;
                       verdict.set_call_id(call_id);
                       verdict.set_code(static_cast<int>(status.code()));
                       verdict.set_message(std::string(status.message()));
                       reply(std::move(verdict));
                     });
    return;
  }
  host.StartCollective(request.call(), client_deadline,
                       [call_id, reply = std::move(reply)](
                           absl::StatusOr<CollectiveOutcome> outcome) {
                         reply(StreamReply(call_id, std::move(outcome)));
                       });
}

}  // namespace chorus
