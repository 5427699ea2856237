// CallPort: the coordinator's call port, a TCP listener next to its gRPC
// port where workers send collective calls, commits and failure
// reports as frames (call_frame.h) instead of gRPC messages. A call costs one
// small write and one small read on each side, with no HTTP/2 framing and no
// thread hand-offs in between, which is most of the time of a small
// all-reduce. Each request goes into the core (TakeCallPortRequest) exactly
// as the unary RPC would, so verdicts, deadlines and errors are the same.
// Exists because: an 8 B all_reduce took 24.7 us through it against
// 122.2 us as gRPC messages at 2 ranks, 83.3 against 251.4 us at 4
// (bench/README.md, "Before and after: the call port"); the unary RPCs stay
// for any gRPC client and for workers that cannot reach the port.
//
// A FrameServer serves the connections with one thread: it takes each
// connection's calls into the core in the order it sent them; verdicts are
// written by whichever thread produces them. A connection that does not
// start with the hello, or has not sent it (after its TLS handshake) within
// 5 s, is closed without a reply; a frame over the limit or
// a payload that does not parse gets one reply with call id 0 and the reason
// (RESOURCE_EXHAUSTED or INVALID_ARGUMENT) and the connection is closed; a
// request that carries nothing, or has a negative timeout, gets
// INVALID_ARGUMENT under its call id. A connection that closes drops the
// verdicts still due to it.
//
// With TLS the port speaks mutual TLS from the first byte (frame_server.h):
// a client without a certificate from the CA is closed during the
// handshake, and each request is authorized as the gRPC service authorizes
// it: only a worker acting for a rank it holds, else PERMISSION_DENIED under
// the request's call id, with nothing sent to the core.
//
// Lifecycle: Start() listens and serves until Shutdown() (or destruction),
// which closes every connection. The core must outlive it.
// Thread safety: Shutdown(), connections() and port() may be called from any
// thread.
#ifndef CHORUS_SERVER_COORDINATOR_CALL_PORT_H_
#define CHORUS_SERVER_COORDINATOR_CALL_PORT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/frame_server.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/leadership.h"

namespace chorus {

class CallPort {
 public:
  // Listens on `host` at `port` (0 picks a free one) and serves calls
  // into `core` (not owned), with mutual TLS when `tls`. Frames over
  // `max_frame_bytes` are refused. While `leadership` (not owned; null:
  // always) says this coordinator does not lead, every request gets its
  // UNAVAILABLE naming the leader under its call id. The serving thread
  // polls `spin` for the next frame before it blocks (AdaptiveSpin).
  // Returns UNAVAILABLE when the address cannot be bound, INTERNAL when the
  // serving thread's epoll or eventfd cannot be made, FAILED_PRECONDITION
  // for TLS in a process without it.
  static absl::StatusOr<std::unique_ptr<CallPort>> Start(
      const std::string& host, int port, Coordinator* core,
      uint64_t max_frame_bytes, bool tls = false,
      const Leadership* leadership = nullptr,
      absl::Duration spin = absl::ZeroDuration());

  CallPort(const CallPort&) = delete;
  CallPort& operator=(const CallPort&) = delete;

  int port() const { return port_; }
  // Connections open now.
  size_t connections() const { return frames_->connections(); }

  // Stops serving, closes every connection (verdicts still due are
  // dropped) and the listener. Idempotent.
  void Shutdown() { frames_->Shutdown(); }

 private:
  CallPort(std::unique_ptr<FrameServer> frames, int port)
      : frames_(std::move(frames)), port_(port) {}

  const std::unique_ptr<FrameServer> frames_;
  const int port_;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_CALL_PORT_H_
