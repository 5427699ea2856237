// LocalWorker: a worker runtime with its local-call core and the core's
// doors: the gRPC local API (on the runtime's server and on a Unix socket),
// the call socket beside that socket, and the in-process door. It is what
// chorus-worker runs and what a program that embeds the runtime starts
// (C++ ranks through Communicator::JoinEmbedded, Python ranks through
// chorus._embedded, chorusctl's and chorus-bench's own workers).
//
// Lifecycle: Create() starts serving (local calls get UNAVAILABLE until
// registered), Register() registers and opens the local calls; Start() does
// both. Shutdown() (or the destructor) ends the local calls, deregisters,
// stops serving and removes the sockets.
// Thread safety: Register() and Shutdown() are called by the owner;
// everything else is thread-safe.
#ifndef CHORUS_SERVER_WORKER_LOCAL_LOCAL_WORKER_H_
#define CHORUS_SERVER_WORKER_LOCAL_LOCAL_WORKER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/net.h"
#include "server/worker/local/in_process_door.h"
#include "server/worker/local/local_calls.h"
#include "server/worker/worker_runtime.h"

namespace chorus {

class LocalApiService;
class LocalCallSocket;

struct LocalWorkerOptions {
  // The runtime's options. Its unix_socket_path, when set, is where the
  // gRPC local API is served too (mode 0600 in a 0700 directory).
  RuntimeOptions runtime;
  // Bounds of a streamed or shared-memory call's tensors and of the shared
  // regions held at once (LocalCalls).
  uint64_t max_tensor_bytes = kDefaultMaxTensorBytes;
  uint64_t max_shared_bytes = kDefaultMaxSharedBytes;
  // Serve the call socket beside runtime.unix_socket_path
  // (CallSocketPath), taking frames of at most max_frame_bytes.
  bool call_socket = false;
  uint64_t max_frame_bytes = kDefaultMaxMessageBytes;
};

class LocalWorker {
 public:
  // Starts serving. Codes as WorkerRuntime::Create(), and
  // PrepareLocalSocket's for the Unix socket.
  static absl::StatusOr<std::unique_ptr<LocalWorker>> Create(
      LocalWorkerOptions options);
  // Create() and Register().
  static absl::StatusOr<std::unique_ptr<LocalWorker>> Start(
      LocalWorkerOptions options);

  ~LocalWorker();
  LocalWorker(const LocalWorker&) = delete;
  LocalWorker& operator=(const LocalWorker&) = delete;

  // Registers (WorkerRuntime::Register's codes: CANCELLED after
  // RequestStop()), starts the call socket (a worker that cannot serve it
  // logs why: clients then send their calls through gRPC) and opens the
  // local calls.
  absl::Status Register();

  // Ends the local calls, deregisters and stops serving; idempotent.
  void Shutdown();

  WorkerRuntime& runtime() { return *runtime_; }
  // The door of ranks in this process.
  InProcessDoor* door() { return &door_; }
  // The call socket's path, "" when none is served.
  std::string call_socket_path() const;

 private:
  explicit LocalWorker(const LocalWorkerOptions& options);

  const LocalWorkerOptions options_;
  LocalCalls calls_;
  InProcessDoor door_{&calls_};
  std::unique_ptr<LocalApiService> grpc_door_;
  std::unique_ptr<WorkerRuntime> runtime_;
  std::unique_ptr<LocalCallSocket> call_socket_;
  bool shut_down_ = false;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_LOCAL_LOCAL_WORKER_H_
