#include "server/worker/local_call_socket.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "chorus/v1/worker.pb.h"
#include "server/common/grpc_status.h"
#include "server/common/tcp_socket.h"
#include "server/worker/local_socket.h"

namespace chorus {
namespace {

std::string ErrorPayload(const absl::Status& status) {
  return LocalCallReplyFor(0, status).SerializeAsString();
}

// Handles one frame of a connection. Returns false to close it.
bool HandleFrame(LocalApiService* api, std::string payload,
                 FrameServer::Replier reply) {
  v1::LocalCallFrame frame;
  if (!frame.ParseFromString(payload) || frame.call_id() == 0) {
    reply.Send(ErrorPayload(absl::InvalidArgumentError(
        "a call socket frame that is not a LocalCallFrame with a nonzero "
        "call_id")));
    return false;
  }
  RunLocalCallFrame(api, std::move(frame), [reply](v1::LocalCallReply& answer) {
    reply.Send(answer.SerializeAsString());
  });
  return true;
}

}  // namespace

v1::LocalCallReply LocalCallReplyFor(uint64_t call_id,
                                     const absl::Status& status) {
  v1::LocalCallReply reply;
  reply.set_call_id(call_id);
  reply.set_code(static_cast<int>(status.code()));
  reply.set_message(std::string(status.message()));
  if (!status.ok()) {
    // The google.rpc.Status with its ErrorDetail, as gRPC would send it.
    reply.set_status_details(ToGrpcStatus(status).error_details());
  }
  return reply;
}

void RunLocalCallFrame(LocalApiService* api, v1::LocalCallFrame frame,
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
  api->RunCall(std::move(*frame.mutable_call()), deadline,
               [send = std::move(send), id](
                   const absl::Status& status,
                   v1::LocalCollectiveResponse& response, KeepOutput keep) {
                 v1::LocalCallReply answer = LocalCallReplyFor(id, status);
                 if (status.ok()) answer.mutable_response()->Swap(&response);
                 send(answer);
                 if (keep) {
                   keep(std::move(*answer.mutable_response()->mutable_data()));
                 }
               });
}

std::string CallSocketPath(const std::string& local_socket) {
  return absl::StrCat(local_socket, ".calls");
}

absl::StatusOr<std::unique_ptr<LocalCallSocket>> LocalCallSocket::Start(
    const std::string& path, LocalApiService* api, uint64_t max_frame_bytes) {
  absl::Status prepared = PrepareLocalSocket(path);
  if (!prepared.ok()) return prepared;
  absl::StatusOr<Listener> listener = ListenUnix(path);
  if (!listener.ok()) return listener.status();
  FrameServer::Options options;
  options.name = "call socket";
  options.hello = std::string(kLocalCallHello);
  options.max_frame_bytes = max_frame_bytes;
  options.error_payload = ErrorPayload;
  absl::StatusOr<std::unique_ptr<FrameServer>> frames = FrameServer::Start(
      listener->fd, std::move(options),
      [api](std::string payload, FrameServer::Replier reply,
            const Identity* /*peer: a Unix socket has none*/) {
        return HandleFrame(api, std::move(payload), std::move(reply));
      });
  if (!frames.ok()) {
    unlink(path.c_str());
    return frames.status();
  }
  return std::unique_ptr<LocalCallSocket>(
      new LocalCallSocket(path, *std::move(frames)));
}

LocalCallSocket::~LocalCallSocket() { Shutdown(); }

void LocalCallSocket::Shutdown() {
  if (shut_down_.exchange(true)) return;
  frames_->Shutdown();
  unlink(path_.c_str());
}

}  // namespace chorus
