// PeerPool: the sending end of the data plane. Keeps one persistent Exchange
// stream per peer address, reused by every collective, and writes chunks to
// it. A broken stream is reopened once on the next send.
//
// Lifecycle: one per worker runtime. Shutdown() (or the destructor) closes
// every stream.
// Thread safety: Send() may be called concurrently; writes to one peer are
// serialised.
#ifndef CHORUS_SERVER_WORKER_DATAPLANE_PEER_POOL_H_
#define CHORUS_SERVER_WORKER_DATAPLANE_PEER_POOL_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/v1/worker.grpc.pb.h"

namespace chorus {

class PeerPool {
 public:
  PeerPool() = default;
  ~PeerPool();

  PeerPool(const PeerPool&) = delete;
  PeerPool& operator=(const PeerPool&) = delete;

  // Writes `chunk` to the stream to `address`, opening it if needed (waiting
  // for the connection until `deadline`). Blocks while the peer's flow
  // control holds it back. Returns UNAVAILABLE naming the address when no
  // connection could be made by `deadline`, or the stream broke and
  // reopening it failed.
  absl::Status Send(const std::string& address, const v1::Chunk& chunk,
                    absl::Time deadline);

  // Closes every stream.
  void Shutdown();

 private:
  struct Stream {
    absl::Mutex mu;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Peer::Stub> stub;
    std::unique_ptr<grpc::ClientContext> context ABSL_GUARDED_BY(mu);
    v1::ChunkAck ack ABSL_GUARDED_BY(mu);
    std::unique_ptr<grpc::ClientWriter<v1::Chunk>> writer ABSL_GUARDED_BY(mu);
  };

  Stream* GetStream(const std::string& address);
  // Connects (waiting until `deadline` at most) and opens the stream.
  static absl::Status OpenLocked(Stream& stream, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stream.mu);
  static void CloseLocked(Stream& stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stream.mu);

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Stream>> streams_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_DATAPLANE_PEER_POOL_H_
