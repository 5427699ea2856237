// CallPort: the coordinator's call port, a plain TCP listener next to its
// gRPC port where workers send collective calls, commits and failure
// reports as frames (call_frame.h) instead of gRPC messages. A call costs one
// small write and one small read on each side, with no HTTP/2 framing and no
// thread hand-offs in between, which is most of the time of a small
// all-reduce. Each request goes into the core (TakeCallPortRequest) exactly
// as the unary RPC would, so verdicts, deadlines and errors are the same.
//
// One thread serves every connection with epoll: it reads frames and takes
// the calls into the core in the order each connection sent them. Verdicts
// are written by whichever thread produces them, straight to the socket when
// it has room, else queued for the serving thread. A connection that does
// not start with the hello is closed without a reply; a frame over the
// limit or a payload that does not parse gets one reply with call id 0 and
// the reason (RESOURCE_EXHAUSTED or INVALID_ARGUMENT) and the connection is
// closed; a request that carries nothing, or has a negative timeout, gets
// INVALID_ARGUMENT under its call id. A connection that closes drops the
// verdicts still due to it. Each wake-up reads at most 1 MiB of one connection,
// so none starves the others; out of file descriptors, it stops accepting until
// one closes.
//
// Lifecycle: Start() listens and serves until Shutdown() (or destruction),
// which closes every connection. The core must outlive it.
// Thread safety: Shutdown() and port() may be called from any thread.
#ifndef CHORUS_SERVER_COORDINATOR_CALL_PORT_H_
#define CHORUS_SERVER_COORDINATOR_CALL_PORT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/coordinator/coordinator.h"

namespace chorus {

class CallPort {
 public:
  // Listens on `host` at `port` (0 picks a free one) and serves calls
  // into `core` (not owned). Frames over `max_frame_bytes` are refused.
  // Returns UNAVAILABLE when the address cannot be bound, INTERNAL when the
  // serving thread's epoll or eventfd cannot be made.
  static absl::StatusOr<std::unique_ptr<CallPort>> Start(
      const std::string& host, int port, Coordinator* core,
      uint64_t max_frame_bytes);

  ~CallPort();
  CallPort(const CallPort&) = delete;
  CallPort& operator=(const CallPort&) = delete;

  int port() const { return port_; }
  // Connections open now.
  size_t connections() const {
    return open_connections_.load(std::memory_order_relaxed);
  }

  // Stops serving, closes every connection (verdicts still due are
  // dropped) and the listener. Idempotent.
  void Shutdown();

  struct Connection;

 private:
  CallPort(Coordinator* core, uint64_t max_frame_bytes)
      : core_(core), max_frame_bytes_(max_frame_bytes) {}

  void Serve();
  void Accept();
  // Reads what `connection` has and handles its whole frames. Returns false
  // when the connection must be closed.
  bool ReadFrom(const std::shared_ptr<Connection>& connection);
  // Takes the whole frames buffered for `connection` into the core. Returns
  // false when the connection must be closed.
  bool TakeFrames(const std::shared_ptr<Connection>& connection);
  void Close(int fd);

  Coordinator* const core_;  // not owned
  const uint64_t max_frame_bytes_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: Shutdown() wakes the serving thread
  int port_ = 0;
  std::thread thread_;
  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  // Owned by the serving thread.
  absl::flat_hash_map<int, std::shared_ptr<Connection>> connections_;
  bool accept_paused_ = false;
  std::atomic<size_t> open_connections_{0};
};

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_CALL_PORT_H_
