#include "server/coordinator/collective_proto.h"

#include <algorithm>
#include <utility>

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

}  // namespace chorus
