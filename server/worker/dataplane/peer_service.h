// PeerService: the receiving end of the data plane. Each peer worker keeps
// one Exchange stream open to this worker; every chunk read is handed to the
// Inbox. While the inbox holds too much of a stream's data, the stream stops
// reading, so gRPC flow control holds the sender back.
//
// Lifecycle: registered with the worker's server; the inbox must outlive it.
// Thread safety: reactors run on gRPC's callback threads.
#ifndef CHORUS_SERVER_WORKER_DATAPLANE_PEER_SERVICE_H_
#define CHORUS_SERVER_WORKER_DATAPLANE_PEER_SERVICE_H_

#include "chorus/v1/worker.grpc.pb.h"
#include "server/worker/dataplane/inbox.h"

namespace chorus {

class PeerService final : public v1::Peer::CallbackService {
 public:
  // `inbox` is not owned.
  explicit PeerService(Inbox* inbox) : inbox_(inbox) {}

  grpc::ServerReadReactor<v1::Chunk>* Exchange(
      grpc::CallbackServerContext* context, v1::ChunkAck* response) override;

 private:
  Inbox* const inbox_;  // not owned
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_DATAPLANE_PEER_SERVICE_H_
