#include "server/worker/local/call_frames.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"

namespace chorus {
namespace {

// Sets the call id and the status of `reply`.
void FillReply(uint64_t call_id, const absl::Status& status,
               v1::LocalCallReply* reply) {
  reply->set_call_id(call_id);
  reply->set_code(static_cast<int>(status.code()));
  reply->set_message(std::string(status.message()));
  if (!status.ok()) {
    // The google.rpc.Status with its ErrorDetail, as gRPC would send it.
    reply->set_status_details(ToGrpcStatus(status).error_details());
  }
}

}  // namespace

v1::LocalCallReply LocalCallReplyFor(uint64_t call_id,
                                     const absl::Status& status) {
  v1::LocalCallReply reply;
  FillReply(call_id, status, &reply);
  return reply;
}

void RunLocalCallFrame(LocalCalls* calls, v1::LocalCallFrame frame,
                       LocalReplySink send) {
  const uint64_t id = frame.call_id();
  if (frame.timeout_us() == 0) {
    v1::LocalCallReply answer = LocalCallReplyFor(
        id, absl::InvalidArgumentError("a call with timeout_us 0 cannot run"));
    send(answer);
    return;
  }
  const absl::Time deadline =
      absl::Now() + absl::Microseconds(static_cast<int64_t>(
                        std::min<uint64_t>(frame.timeout_us(), INT64_MAX)));
  // The request and the reply live until the call ended: the input is a
  // view of the request's data, and the output lands in the reply.
  struct Running {
    v1::LocalCallFrame frame;
    v1::LocalCallReply reply;
  };
  auto running = std::make_shared<Running>();
  running->frame = std::move(frame);
  BurstMemory* burst = calls->burst_memory();
  burst->Began();
  calls->Run(running->frame.call(), deadline, running->reply.mutable_response(),
             [running, burst, id, send = std::move(send)](
                 absl::StatusOr<RunResult> result, KeepOutput keep) mutable {
               v1::LocalCallReply& answer = running->reply;
               FillReply(id, result.status(), &answer);
               if (!result.ok()) answer.clear_response();
               send(answer);
               if (keep) {
                 keep(std::move(*answer.mutable_response()->mutable_data()));
               }
               // The reply went out: nothing of the call is left but this.
               send = nullptr;
               running = nullptr;
               burst->Ended();
             });
}

}  // namespace chorus
