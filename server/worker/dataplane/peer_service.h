// PeerService: the gRPC side of the data plane's receiving end. It tells
// peers where this worker's TCP data plane listens (DataPlane); the data
// itself travels there as wire frames (tcp_listener.h).
//
// Lifecycle: registered with the worker's server.
// Thread safety: its method runs on gRPC's callback threads.
#ifndef CHORUS_SERVER_WORKER_DATAPLANE_PEER_SERVICE_H_
#define CHORUS_SERVER_WORKER_DATAPLANE_PEER_SERVICE_H_

#include "chorus/v1/worker.grpc.pb.h"

namespace chorus {

class PeerService final : public v1::Peer::CallbackService {
 public:
  // `tcp_port` is the TCP data plane's port. With TLS, DataPlane answers
  // only worker certificates (PERMISSION_DENIED otherwise).
  explicit PeerService(int tcp_port) : tcp_port_(tcp_port) {}

  grpc::ServerUnaryReactor* DataPlane(grpc::CallbackServerContext* context,
                                      const v1::DataPlaneRequest* request,
                                      v1::DataPlaneInfo* response) override;

 private:
  const int tcp_port_;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_DATAPLANE_PEER_SERVICE_H_
