// The worker's Unix sockets: where the local API's socket is by default and
// how it is readied and kept private (its permissions are what guard the
// local API, which runs collectives as any rank), and the call socket
// beside it, a door of the local-call core.
//
// LocalCallSocket: a Unix socket (worker.proto, LocalCallFrame) where an
// application sends its collectives as plain frames rather than gRPC calls:
// a call costs one small write and one small read on each side, with no
// HTTP/2 and no thread hand-offs, which is most of the time of a small
// all-reduce from Python. Each frame runs through RunLocalCallFrame, so
// checks, sequence numbers, retries, codes and ErrorDetails are
// WorkerLocal.Collective's. Its permissions (0600, in the local socket's
// 0700 directory) guard it as they guard the local socket.
// Exists because: at 8 B a gRPC call from Python to the worker costs
// 300-700 us here, several times a whole embedded all-reduce, and the call
// socket brought Python ranks' 8 B all-reduce from 13.5x to about 2-3x of
// embedded ranks (bench/README.md, "Python client next to embedded ranks").
//
// A FrameServer serves the connections with one thread: calls start in the
// order each connection sent them and reply in the order they end. A frame
// that does not parse, or has call_id 0, gets a reply with call_id 0 and
// INVALID_ARGUMENT and the connection is closed; one over the limit the
// same with RESOURCE_EXHAUSTED; timeout_us 0 gets INVALID_ARGUMENT under its
// call id.
//
// Lifecycle: Start() listens and serves until Shutdown() (or destruction),
// which closes every connection (replies still due are dropped) and removes
// the socket. The core must outlive it. Thread safety: the functions are
// thread-safe; all methods may be called from any thread.
#ifndef CHORUS_SERVER_WORKER_LOCAL_CALL_SOCKET_H_
#define CHORUS_SERVER_WORKER_LOCAL_CALL_SOCKET_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/frame_server.h"
#include "common/local_socket_path.h"
#include "server/worker/local/local_calls.h"

namespace chorus {

// Readies `path` for a new socket: creates its directory (mode 0700) when
// missing and removes a socket left by a worker that is gone. Returns
// FAILED_PRECONDITION when a live process answers on it, `path` is not a
// socket, or its directory lets another user replace it (owned by another
// user, or writable by others without the sticky bit), INVALID_ARGUMENT for a
// path too long for a socket address, and UNAVAILABLE when the directory cannot
// be made.
absl::Status PrepareLocalSocket(const std::string& path);

// Makes the socket at `path` accessible to its owner only (mode 0600).
// Returns UNAVAILABLE when it cannot.
absl::Status RestrictLocalSocket(const std::string& path);

class LocalCallSocket {
 public:
  // Listens at `path` (a socket left there by a worker that is gone is
  // removed first) and serves calls into `calls` (not owned). Frames over
  // `max_frame_bytes` are refused. The serving thread polls `spin` for the
  // next frame before it blocks (AdaptiveSpin). Returns PrepareLocalSocket's
  // codes, and UNAVAILABLE when it cannot listen there.
  static absl::StatusOr<std::unique_ptr<LocalCallSocket>> Start(
      const std::string& path, LocalCalls* calls, uint64_t max_frame_bytes,
      absl::Duration spin = absl::ZeroDuration());

  ~LocalCallSocket();
  LocalCallSocket(const LocalCallSocket&) = delete;
  LocalCallSocket& operator=(const LocalCallSocket&) = delete;

  const std::string& path() const { return path_; }
  // Connections open now.
  size_t connections() const { return frames_->connections(); }

  // Stops serving, closes every connection and removes the socket.
  // Idempotent.
  void Shutdown();

 private:
  LocalCallSocket(std::string path, std::unique_ptr<FrameServer> frames)
      : path_(std::move(path)), frames_(std::move(frames)) {}

  const std::string path_;
  const std::unique_ptr<FrameServer> frames_;
  std::atomic<bool> shut_down_{false};
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_LOCAL_CALL_SOCKET_H_
