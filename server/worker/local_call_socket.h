// LocalCallSocket: a worker's call socket (worker.proto, LocalCallFrame), a
// Unix socket beside the local API's where an application sends its
// collectives as plain frames rather than gRPC calls: a call costs one
// small write and one small read on each side, with no HTTP/2 and no thread
// hand-offs, which is most of the time of a small all-reduce from Python.
// Each frame runs through LocalApiService::RunCall, so checks, sequence
// numbers, retries, codes and ErrorDetails are Collective's. The socket's
// permissions (0600, in the local socket's 0700 directory) are what guard
// it, as they guard the local socket.
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
// the socket. The LocalApiService must outlive it. Thread safety: all
// methods may be called from any thread.
#ifndef CHORUS_SERVER_WORKER_LOCAL_CALL_SOCKET_H_
#define CHORUS_SERVER_WORKER_LOCAL_CALL_SOCKET_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "chorus/v1/worker.pb.h"
#include "server/common/frame_server.h"
#include "server/worker/local_api_service.h"

namespace chorus {

// The reply to call `call_id` that ended with `status`: its code and message
// and, when not OK, the google.rpc.Status with its ErrorDetail as gRPC would
// send it.
v1::LocalCallReply LocalCallReplyFor(uint64_t call_id,
                                     const absl::Status& status);

// Takes the reply of a frame: may move what it needs out of it (but not its
// response's data, which goes to the call's ledger after it returns). Runs
// once, on a thread of the worker's that must not block.
using LocalReplySink = std::function<void(v1::LocalCallReply& reply)>;

// Runs one frame (call_id nonzero) as the call socket does, for any
// transport of frames: LocalApiService::RunCall with the frame's timeout;
// timeout_us 0 is answered with INVALID_ARGUMENT. `send` gets the reply,
// possibly before this returns.
void RunLocalCallFrame(LocalApiService* api, v1::LocalCallFrame frame,
                       LocalReplySink send);

// What every call socket connection starts with.
inline constexpr absl::string_view kLocalCallHello = "CHORUS-LOCAL/1\n";

// Where a worker whose local socket is `local_socket` serves its call
// socket: beside it, with ".calls" appended.
std::string CallSocketPath(const std::string& local_socket);

class LocalCallSocket {
 public:
  // Listens at `path` (a socket left there by a worker that is gone is
  // removed first) and serves calls into `api` (not owned). Frames over
  // `max_frame_bytes` are refused. Returns FAILED_PRECONDITION when a live
  // process answers at `path`, INVALID_ARGUMENT for a path too long for a
  // socket, UNAVAILABLE when it cannot listen there.
  static absl::StatusOr<std::unique_ptr<LocalCallSocket>> Start(
      const std::string& path, LocalApiService* api, uint64_t max_frame_bytes);

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
