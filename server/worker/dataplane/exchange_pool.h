// ExchangePool: the PeerSender for networks that let only a worker's gRPC
// port through (deploy/README.md: a worker started with
// --tcp_data_plane=false, e.g. behind a firewall or a Kubernetes Service
// that exposes one port). Keeps one long-lived Peer.Exchange stream per peer
// address, reused by every collective, and writes each message as a Chunk on
// it; the receiver's PeerService hands it to its inbox. Slower than
// TcpPeerPool (a protobuf copy per chunk, gRPC framing), which is why it is
// not the default. A broken stream is reopened once on the next send.
//
// Lifecycle: one per worker runtime. Shutdown() (or the destructor) closes
// every stream.
// Thread safety: Send() may be called concurrently; writes to one peer are
// serialised.
#ifndef CHORUS_SERVER_WORKER_DATAPLANE_EXCHANGE_POOL_H_
#define CHORUS_SERVER_WORKER_DATAPLANE_EXCHANGE_POOL_H_

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
#include "server/worker/dataplane/peer_sender.h"

namespace chorus {

class ExchangePool final : public PeerSender {
 public:
  ExchangePool() = default;
  ~ExchangePool() override;

  ExchangePool(const ExchangePool&) = delete;
  ExchangePool& operator=(const ExchangePool&) = delete;

  // As PeerSender::Send. A write blocked by the peer's flow control waits
  // for the stream rather than for `deadline`.
  absl::Status Send(const std::string& address, const MessageKey& key,
                    absl::string_view data, absl::Time deadline) override;

  // Makes every later send return UNAVAILABLE, then ends every stream
  // (waiting for writes in progress).
  void Shutdown() override;

 private:
  struct Peer {
    absl::Mutex mu;
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Peer::Stub> stub;
    // The open Exchange stream, if any.
    std::unique_ptr<grpc::ClientContext> context ABSL_GUARDED_BY(mu);
    v1::ChunkAck ack ABSL_GUARDED_BY(mu);
    std::unique_ptr<grpc::ClientWriter<v1::Chunk>> writer ABSL_GUARDED_BY(mu);
  };

  Peer* GetPeer(const std::string& address);
  absl::Status OpenLocked(Peer& peer, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(peer.mu);
  absl::Status WriteLocked(Peer& peer, const MessageKey& key,
                           absl::string_view data)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(peer.mu);
  static void CloseLocked(Peer& peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(peer.mu);

  std::atomic<bool> shut_down_{false};
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Peer>> peers_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_DATAPLANE_EXCHANGE_POOL_H_
