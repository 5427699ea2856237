#include "server/worker/dataplane/peer_service.h"

#include "common/grpc_status.h"
#include "common/transport_security.h"

namespace chorus {

grpc::ServerUnaryReactor* PeerService::DataPlane(
    grpc::CallbackServerContext* context, const v1::DataPlaneRequest* request,
    v1::DataPlaneInfo* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status allowed = RequireRole(*context, "chorus.v1.Peer/DataPlane");
  if (allowed.ok()) response->set_tcp_port(tcp_port_);
  reactor->Finish(ToGrpcStatus(allowed));
  return reactor;
}

}  // namespace chorus
