#include "server/coordinator/call_port.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/authorization.h"
#include "common/call_frame.h"
#include "common/tcp_socket.h"
#include "server/coordinator/collective_proto.h"

namespace chorus {
namespace {

std::string ErrorPayload(const absl::Status& status) {
  return CallPortStatusReply(0, status).SerializeAsString();
}

// OK when `peer` (null without TLS) may send `request`: a role the
// authorization table lets send it, and a worker acting for a rank it holds,
// as the gRPC service checks (coordinator_service.cc). PERMISSION_DENIED
// otherwise.
absl::Status AuthorizeRequest(const Coordinator& core,
                              const v1::CallPortRequest& request,
                              const Identity* peer) {
  if (peer == nullptr) return absl::OkStatus();
  const char* action = "call port: Collective";
  const std::string* group = &request.call().group();
  uint64_t epoch = request.call().epoch();
  int rank = request.call().rank();
  if (request.has_commit()) {
    action = "call port: Commit";
    group = &request.commit().group();
    epoch = request.commit().epoch();
    rank = request.commit().rank();
  } else if (request.has_failure()) {
    action = "call port: ReportFailure";
    group = &request.failure().group();
    epoch = request.failure().epoch();
    rank = request.failure().rank();
  } else if (!request.has_call()) {
    return absl::OkStatus();  // refused by the core as carrying nothing
  }
  if (absl::Status allowed = Authorize(action, *peer); !allowed.ok()) {
    return allowed;
  }
  return core.AuthorizeRank(*peer, *group, epoch, rank);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CallPort>> CallPort::Start(
    const std::string& host, int port, Coordinator* core,
    uint64_t max_frame_bytes, bool tls, const Leadership* leadership,
    absl::Duration spin) {
  absl::StatusOr<Listener> listener = ListenTcp(host, port);
  if (!listener.ok()) return listener.status();
  FrameServer::Options options;
  options.name = "call port";
  options.spin = spin;
  options.hello = std::string(kCallHello);
  options.max_frame_bytes = max_frame_bytes;
  options.error_payload = ErrorPayload;
  options.tls = tls;
  absl::StatusOr<std::unique_ptr<FrameServer>> frames = FrameServer::Start(
      listener->fd, std::move(options),
      [core, leadership](std::string payload, FrameServer::Replier reply,
                         const Identity* peer) {
        v1::CallPortRequest request;
        if (!request.ParseFromString(payload)) {
          reply.Send(ErrorPayload(absl::InvalidArgumentError(
              "a call frame that is not a CallPortRequest")));
          return false;
        }
        absl::Status allowed = CheckLeading(leadership);
        if (allowed.ok()) allowed = AuthorizeRequest(*core, request, peer);
        if (!allowed.ok()) {
          reply.Send(CallPortStatusReply(request.call_id(), allowed)
                         .SerializeAsString());
          // A revoked certificate's connection closes after the refusal.
          return !absl::IsUnauthenticated(allowed);
        }
        // In the order sent: each call is in the core before the next is
        // read.
        TakeCallPortRequest(*core, peer == nullptr ? "" : peer->job, request,
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
