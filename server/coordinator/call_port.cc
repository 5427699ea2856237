#include "server/coordinator/call_port.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/call_frame.h"
#include "server/common/tcp_socket.h"
#include "server/coordinator/collective_proto.h"

namespace chorus {
namespace {

std::string ErrorPayload(const absl::Status& status) {
  v1::CallPortReply reply;
  reply.set_call_id(0);
  reply.set_code(static_cast<int>(status.code()));
  reply.set_message(std::string(status.message()));
  return reply.SerializeAsString();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CallPort>> CallPort::Start(
    const std::string& host, int port, Coordinator* core,
    uint64_t max_frame_bytes) {
  absl::StatusOr<Listener> listener = ListenTcp(host, port);
  if (!listener.ok()) return listener.status();
  FrameServer::Options options;
  options.name = "call port";
  options.hello = std::string(kCallHello);
  options.max_frame_bytes = max_frame_bytes;
  options.error_payload = ErrorPayload;
  absl::StatusOr<std::unique_ptr<FrameServer>> frames = FrameServer::Start(
      listener->fd, std::move(options),
      [core](std::string payload, FrameServer::Replier reply) {
        v1::CallPortRequest request;
        if (!request.ParseFromString(payload)) {
          reply.Send(ErrorPayload(absl::InvalidArgumentError(
              "a call frame that is not a CallPortRequest")));
          return false;
        }
        // In the order sent: each call is in the core before the next is
        // read.
        TakeCallPortRequest(*core, request,
                            [reply](const v1::CallPortReply& verdict) {
                              reply.Send(verdict.SerializeAsString());
                            });
        return true;
      });
  if (!frames.ok()) return frames.status();
  return std::unique_ptr<CallPort>(
      new CallPort(*std::move(frames), listener->port));
}

}  // namespace chorus
