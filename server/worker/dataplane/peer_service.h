// PeerService: the gRPC side of the data plane's receiving end. It tells
// peers where this worker's TCP data plane listens (DataPlane), and serves
// Exchange streams for peers that send chunks through gRPC instead: every
// chunk read is handed to the Inbox. While the inbox holds too much of a
// stream's data, the stream stops reading, so gRPC flow control holds the
// sender back.
//
// Lifecycle: registered with the worker's server; the inbox must outlive it
// and every Exchange stream, which WaitForStreams() waits for (after the
// server's Shutdown()).
// Thread safety: reactors run on gRPC's callback threads; WaitForStreams()
// may be called from any thread.
#ifndef CHORUS_SERVER_WORKER_DATAPLANE_PEER_SERVICE_H_
#define CHORUS_SERVER_WORKER_DATAPLANE_PEER_SERVICE_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "chorus/v1/worker.grpc.pb.h"
#include "server/worker/dataplane/inbox.h"
#include "server/worker/dataplane/peer_directory.h"

namespace chorus {

class PeerService final : public v1::Peer::CallbackService {
 public:
  // `inbox` and `directory` are not owned. `tcp_port` is the TCP data
  // plane's port, 0 when there is none. With TLS, Exchange accepts only
  // worker certificates, and delivers a chunk only from the worker that
  // holds its sending rank (`directory`); PERMISSION_DENIED ends the stream
  // otherwise.
  PeerService(Inbox* inbox, PeerDirectory* directory, int tcp_port)
      : inbox_(inbox), directory_(directory), tcp_port_(tcp_port) {}

  grpc::ServerReadReactor<v1::Chunk>* Exchange(
      grpc::CallbackServerContext* context, v1::ChunkAck* response) override;

  grpc::ServerUnaryReactor* DataPlane(grpc::CallbackServerContext* context,
                                      const v1::DataPlaneRequest* request,
                                      v1::DataPlaneInfo* response) override;

  // Blocks until every Exchange stream has ended and let go of the inbox.
  void WaitForStreams();

 private:
  friend class ExchangeReactor;
  void StreamEnded();

  Inbox* const inbox_;              // not owned
  PeerDirectory* const directory_;  // not owned
  const int tcp_port_;
  absl::Mutex mu_;
  int live_streams_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_DATAPLANE_PEER_SERVICE_H_
