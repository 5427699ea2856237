// EmulatedNcclRuntime: NCCL communicators between the GPUs of an
// EmulatedDeviceRuntime, for ranks of one process (the embedded runtimes of
// a test). A communicator's ranks meet under the id one of them made; each
// collective waits on its rank's stream until every rank enqueued it (as
// NCCL's kernel waits for its peers), then the last to arrive computes
// every rank's output with the CPU engine and writes it into their device
// memory. An abort ends the rank's waiting collectives at once, unfinished
// (the other ranks' wait on until they are aborted too, as NCCL's kernels
// in other processes would). A device that faulted runs nothing.
// Exists because: see nccl_runtime.h (NCCL needs a GPU).
//
// Lifecycle: owned by its EmulatedDeviceRuntime, which it must not outlive.
// Thread safety: thread-safe.
#ifndef CHORUS_SERVER_WORKER_GPU_EMULATED_NCCL_RUNTIME_H_
#define CHORUS_SERVER_WORKER_GPU_EMULATED_NCCL_RUNTIME_H_

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/worker/gpu/nccl_runtime.h"

namespace chorus {

class EmulatedDeviceRuntime;

class EmulatedNcclRuntime final : public NcclRuntime {
 public:
  // The version an emulated worker advertises.
  static constexpr int kVersion = 1;

  // `gpus` (not owned) outlives this.
  explicit EmulatedNcclRuntime(EmulatedDeviceRuntime* gpus);
  ~EmulatedNcclRuntime() override;

  int version() const override { return kVersion; }
  absl::StatusOr<std::string> NewId() override;
  absl::StatusOr<Comm> StartComm(int device, absl::string_view id, int world,
                                 int rank) override;
  absl::StatusOr<bool> CommReady(Comm comm) override;
  absl::Status Enqueue(Comm comm, const CollectiveSpec& spec, const void* input,
                       void* output, DeviceRuntime::Stream stream,
                       absl::Time until) override;
  void Abort(Comm comm) override;

  // Test only: how many communicators were started and aborted so far.
  int starts() const;
  int aborts() const;

  // The ranks of one communicator (defined in the .cc).
  struct Clique;

 private:
  EmulatedDeviceRuntime* const gpus_;
  mutable absl::Mutex mu_;
  // The communicators being made or in use, by id.
  std::map<std::string, std::weak_ptr<Clique>> cliques_ ABSL_GUARDED_BY(mu_);
  int starts_ ABSL_GUARDED_BY(mu_) = 0;
  int aborts_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_GPU_EMULATED_NCCL_RUNTIME_H_
