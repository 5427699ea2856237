// EmbeddedWorker: the worker runtime that a chorus._embedded.Worker runs
// in this process (a LocalWorker, admitted as tls_admission.h says), with
// the reply queues of the Calls channels made from it, so that closing it
// ends their waits.
//
// A fork of the process that started it has none of its threads: there it
// is left alone (closing would wait for threads that do not exist, and its
// sockets are the parent's). OwnedHere() tells the two apart with no
// system call, from a count of forks that the module's init keeps
// (CountFork, run by pthread_atfork in every child).
//
// Lifecycle: Start() admits and starts it; Close() ends its channels,
// deregisters and stops serving, once. The Python Worker that holds it
// deletes it (in the process that started it only).
// Thread safety: all methods are thread-safe; none needs the GIL, and
// Start() and Close() wait, so call them without.
#ifndef CHORUS_CLIENT_PYTHON_EMBEDDED_EMBEDDED_WORKER_H_
#define CHORUS_CLIENT_PYTHON_EMBEDDED_EMBEDDED_WORKER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/python/embedded/reply_queue.h"
#include "server/worker/gpu/emulated_device_runtime.h"
#include "server/worker/local/local_worker.h"

namespace chorus {

// Counts one more fork below the process that loaded the module; for
// pthread_atfork's child handler.
void CountFork();

class EmbeddedWorker {
 public:
  // Admits a worker with `tls_dir` (AdmitWorker, which may fill in
  // options.runtime.name) and starts it: it serves and is registered, with
  // `emulated_gpus` GPUs emulated in host memory (EmulatedDeviceRuntime)
  // instead of this machine's when that is above 0. Returns AdmitWorker's or
  // LocalWorker::Start's errors (having admitted nothing).
  static absl::StatusOr<std::unique_ptr<EmbeddedWorker>> Start(
      LocalWorkerOptions options, const std::string& tls_dir,
      int emulated_gpus = 0);
  ~EmbeddedWorker();
  EmbeddedWorker(const EmbeddedWorker&) = delete;
  EmbeddedWorker& operator=(const EmbeddedWorker&) = delete;

  // Whether this process started it (and is not a fork of that one).
  bool OwnedHere() const;

  LocalWorker& worker() { return *worker_; }

  // Its emulated GPUs (shared: their memory may outlive the worker); null
  // where it uses this machine's.
  const std::shared_ptr<EmulatedDeviceRuntime>& emulated() const {
    return emulated_;
  }

  // Adds the queue of a new Calls channel, which Close() closes. Returns
  // false when closed already.
  bool AddQueue(std::shared_ptr<ReplyQueue> queue);

  // Ends every channel's waits, deregisters and stops serving. Idempotent.
  void Close();

 private:
  EmbeddedWorker();

  // The forks below the process that loaded the module when it started.
  const uint64_t owner_;
  // Declared first: the worker uses it until it is gone.
  std::shared_ptr<EmulatedDeviceRuntime> emulated_;
  std::unique_ptr<LocalWorker> worker_;
  absl::Mutex mu_;
  std::vector<std::weak_ptr<ReplyQueue>> queues_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace chorus

#endif  // CHORUS_CLIENT_PYTHON_EMBEDDED_EMBEDDED_WORKER_H_
