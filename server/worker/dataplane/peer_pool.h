// PeerPool: the sending end of the data plane. Keeps one persistent
// connection per peer address, reused by every collective. It asks each
// peer (Peer.DataPlane, once per connection) where its TCP data plane
// listens and sends wire frames (wire_frame.h) straight from the caller's
// buffer; to a peer without one, or when TCP is turned off, it sends chunks
// on a gRPC Exchange stream instead. A broken connection is reopened once
// on the next send.
//
// Lifecycle: one per worker runtime. Shutdown() (or the destructor) says
// goodbye on and closes every connection.
// Thread safety: Send() may be called concurrently; writes to one peer are
// serialised.
#ifndef CHORUS_SERVER_WORKER_DATAPLANE_PEER_POOL_H_
#define CHORUS_SERVER_WORKER_DATAPLANE_PEER_POOL_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/v1/worker.grpc.pb.h"
#include "server/worker/dataplane/inbox.h"

namespace chorus {

class PeerPool {
 public:
  // `use_tcp` false sends everything through gRPC Exchange streams.
  explicit PeerPool(bool use_tcp = true);
  ~PeerPool();

  PeerPool(const PeerPool&) = delete;
  PeerPool& operator=(const PeerPool&) = delete;

  // Sends `data` as the message `key` to the worker at `address`,
  // connecting first if needed (waiting for the connection until
  // `deadline`, 2 s at most). Blocks while the peer's flow control holds it
  // back, until `deadline`. Returns UNAVAILABLE naming the address when no
  // connection could be made or the connection broke and reopening it
  // failed, DEADLINE_EXCEEDED when the peer took no data until `deadline`,
  // INVALID_ARGUMENT for a key the wire cannot carry.
  absl::Status Send(const std::string& address, const MessageKey& key,
                    absl::string_view data, absl::Time deadline);

  // Ends sends in progress on TCP connections (they return UNAVAILABLE, as
  // every later send does), then says goodbye on and closes every
  // connection.
  void Shutdown();

 private:
  enum class Route { kUnknown, kTcp, kGrpc };

  struct Peer {
    absl::Mutex mu;
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Peer::Stub> stub;
    Route route ABSL_GUARDED_BY(mu) = Route::kUnknown;
    // TCP route: the connected socket, or -1.
    int fd ABSL_GUARDED_BY(mu) = -1;
    // gRPC route: the open Exchange stream, if any.
    std::unique_ptr<grpc::ClientContext> context ABSL_GUARDED_BY(mu);
    v1::ChunkAck ack ABSL_GUARDED_BY(mu);
    std::unique_ptr<grpc::ClientWriter<v1::Chunk>> writer ABSL_GUARDED_BY(mu);
  };

  Peer* GetPeer(const std::string& address);
  // Picks the route (asking the peer for its TCP port) and connects.
  absl::Status OpenLocked(Peer& peer, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(peer.mu);
  absl::Status OpenTcpLocked(Peer& peer, int port, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(peer.mu);
  absl::Status WriteLocked(Peer& peer, const MessageKey& key,
                           absl::string_view data, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(peer.mu);
  // Says goodbye when `goodbye` and the connection is healthy, then closes.
  static void CloseLocked(Peer& peer, bool goodbye)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(peer.mu);

  const bool use_tcp_;
  // An eventfd that Shutdown() makes readable, waking every TCP send that
  // waits for its peer.
  const int shutdown_fd_;
  std::atomic<bool> shut_down_{false};
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Peer>> peers_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_DATAPLANE_PEER_POOL_H_
