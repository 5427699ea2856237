// EmulatedDeviceRuntime: GPUs emulated in host memory, so that what
// DeviceBuffers and the worker do with a GPU (staging, ordering on streams,
// pooling, pointer checks, errors, a faulted device) runs in tests on every
// machine. Device memory is host memory the runtime allocated and tracks
// (so pointer checks see whole ranges, and a budget per device makes
// allocations fail with RESOURCE_EXHAUSTED); each stream is a thread that
// runs its work in order, asynchronously to the caller; events complete
// when their stream reaches them; copies from and to pageable host memory
// (neither device nor pinned memory) behave as CUDA's: the source is taken
// before CopyAsync returns, and a copy into pageable memory has completed
// when it returns; kernels are the CPU engine's
// (cpu_reduce.h), so results equal the CPU path's bit for bit.
//
// A device can be faulted (Fault(), or at its Nth kernel): as a CUDA
// context after a kernel fault, it never recovers: work not yet run is
// dropped, and every later operation on it fails with INTERNAL
// "Cuda(n): <what was done>: device fault (emulated): <why>".
//
// Lifecycle: outlives every stream, event and allocation it gave out.
// Thread safety: thread-safe.
#ifndef CHORUS_SERVER_WORKER_GPU_EMULATED_DEVICE_RUNTIME_H_
#define CHORUS_SERVER_WORKER_GPU_EMULATED_DEVICE_RUNTIME_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/device.h"
#include "server/worker/gpu/device_runtime.h"
#include "server/worker/gpu/nccl_runtime.h"

namespace chorus {

class EmulatedDeviceRuntime final : public DeviceRuntime {
 public:
  // `devices` GPUs, Cuda(0) .. Cuda(devices - 1), each with
  // `memory_bytes` of device memory.
  explicit EmulatedDeviceRuntime(int devices,
                                 uint64_t memory_bytes = uint64_t{1} << 30);
  ~EmulatedDeviceRuntime() override;

  // The GPUs as a worker registers them (model "emulated GPU").
  std::optional<std::vector<Device>> Gpus() const override;

  // Faults `device` now; see the file comment.
  void Fault(int device, const std::string& why);
  // Faults `device` when the `kernels`-th kernel enqueued on it from now
  // (1: the next) runs; that kernel does nothing.
  void FaultAtKernel(int device, int kernels, const std::string& why);
  // Holds `stream` (a test's stand-in for a caller's stream with work
  // still running): what is enqueued on it after this waits until the
  // returned function is called (once).
  std::function<void()> Hold(Stream stream);
  // Holds every copy into memory at `dst` enqueued from now until the
  // returned function is called (once): each waits on its stream, as a
  // copy still running would.
  std::function<void()> HoldCopiesTo(const void* dst);
  // How many events were recorded on `stream` so far, and how many waits
  // for an event were enqueued on it (StreamWait).
  int RecordedOn(Stream stream) const;
  int WaitsOn(Stream stream) const;
  // Bytes of device memory allocated on `device` now.
  uint64_t AllocatedBytes(int device) const;
  // Enqueues `kernel` on `stream`: the stream's thread runs it, where it
  // may block as a GPU kernel waiting for peers would, unless the device
  // faulted (it counts toward a planned fault, as Reduce's kernels do).
  void EnqueueKernel(int device, Stream stream, std::function<void()> kernel);
  // OK when `device` exists and has not faulted; else the error, saying
  // `doing`.
  absl::Status Usable(int device, absl::string_view doing) const
      ABSL_LOCKS_EXCLUDED(mu_);

  NcclRuntime* Nccl() override;
  absl::Status EnqueueHost(int device, Stream stream,
                           std::function<void()> fn) override;

  absl::StatusOr<Stream> NewStream(int device) override;
  void DeleteStream(int device, Stream stream) override;
  absl::StatusOr<Event> NewEvent(int device) override;
  void DeleteEvent(int device, Event event) override;
  absl::StatusOr<void*> AllocDevice(int device, uint64_t bytes) override;
  void FreeDevice(int device, void* memory) override;
  absl::StatusOr<char*> AllocPinned(int device, uint64_t bytes) override;
  void FreePinned(int device, char* memory) override;
  absl::Status CopyAsync(int device, void* dst, const void* src, uint64_t bytes,
                         Stream stream, absl::string_view doing) override;
  absl::Status Reduce(int device, ReduceOp op, DType dtype, void* dst,
                      const void* a, const void* b, size_t count,
                      Stream stream) override;
  absl::Status FinalizeAvg(int device, DType dtype, void* data, size_t count,
                           int world_size, Stream stream) override;
  absl::Status Record(int device, Event event, Stream stream) override;
  absl::Status StreamWait(int device, Stream stream, Event event) override;
  absl::Status Wait(int device, Event event, absl::string_view what) override;
  absl::Status CheckPointer(int device, const void* ptr, uint64_t bytes,
                            absl::string_view what) override;

 private:
  struct Gpu {
    // Device memory: start address -> size.
    std::map<uintptr_t, uint64_t> allocations;
    uint64_t allocated = 0;
    // Why it faulted; empty while healthy.
    std::string fault;
    // Kernels to run before the planned fault (0: none planned).
    int kernels_until_fault = 0;
    std::string planned_fault;
  };

  absl::Status UsableLocked(int device, absl::string_view doing) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a kernel of `device` may run now (counts it toward a planned
  // fault). Called on a stream's thread.
  bool KernelMayRun(int device) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `device` has faulted.
  bool Faulted(int device) const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `ptr` is pageable host memory: neither memory of a device nor
  // pinned memory this runtime allocated.
  bool Pageable(const void* ptr) const ABSL_LOCKS_EXCLUDED(mu_);

  const int devices_;
  const std::unique_ptr<NcclRuntime> nccl_;
  const uint64_t memory_bytes_;
  mutable absl::Mutex mu_;
  std::vector<Gpu> gpus_ ABSL_GUARDED_BY(mu_);
  // Copies into these destinations wait for their notification.
  std::map<const void*, std::shared_ptr<absl::Notification>> held_copies_
      ABSL_GUARDED_BY(mu_);
  // Pinned host memory: start address -> size.
  std::map<uintptr_t, uint64_t> pinned_ ABSL_GUARDED_BY(mu_);
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_GPU_EMULATED_DEVICE_RUNTIME_H_
