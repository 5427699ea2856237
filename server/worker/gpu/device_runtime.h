// DeviceRuntime: the operations of a GPU that DeviceBuffers orchestrates
// (device_buffers.h): streams that run work in order, events recorded on a
// stream that the host can wait for, device and pinned host memory, copies
// and the reduce kernels enqueued on a stream, and checks of pointers a user
// hands in. DeviceBuffers holds the staging, ordering and pooling logic once;
// a runtime only does what it is told.
//
// Implementations: this build's (BuiltInDeviceRuntime(): CUDA's when built
// with CUDA, else one that refuses every device) and EmulatedDeviceRuntime
// (emulated_device_runtime.h), GPUs emulated in host memory with a thread
// per stream, so that the orchestration runs in tests on every machine.
// Exists because: the CUDA runtime cannot run on machines without a GPU,
// where CI runs; the emulation is what exercises DeviceBuffers there.
//
// Every operation names its device (GPU index); errors start with the
// device's name ("Cuda(0): ") and say what was being done: INVALID_ARGUMENT
// (a bad pointer, range or device index), UNAVAILABLE (no driver or
// device), RESOURCE_EXHAUSTED (out of memory), INTERNAL (a fault, e.g. a
// kernel's), UNIMPLEMENTED (the device refusal: no GPU support built in).
// An operation that enqueues work returns once it is enqueued; a failure
// of the work itself surfaces at the next Wait on an event recorded after
// it.
//
// Lifecycle: a runtime outlives every handle and buffer it gave out.
// Thread safety: thread-safe; a stream is used by one thread at a time.
#ifndef CHORUS_SERVER_WORKER_GPU_DEVICE_RUNTIME_H_
#define CHORUS_SERVER_WORKER_GPU_DEVICE_RUNTIME_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/device.h"
#include "common/dtype.h"

namespace chorus {

class NcclRuntime;

class DeviceRuntime {
 public:
  // Opaque handles, each of one device.
  struct StreamHandle;
  struct EventHandle;
  using Stream = StreamHandle*;
  using Event = EventHandle*;

  virtual ~DeviceRuntime() = default;

  // The GPUs this runtime has, when it knows them itself (an emulation);
  // nullopt: the worker discovers them (cuda_probe.h).
  virtual std::optional<std::vector<Device>> Gpus() const {
    return std::nullopt;
  }

  // NCCL between this runtime's GPUs (nccl_runtime.h): this build's for the
  // built-in runtimes, the emulation's for an emulation. Never null.
  virtual NcclRuntime* Nccl() = 0;

  // "Cuda(<device>)".
  static std::string Name(int device) {
    return absl::StrCat("Cuda(", device, ")");
  }

  // A stream of `device` that runs the work enqueued on it in order, not
  // ordered against any other stream.
  virtual absl::StatusOr<Stream> NewStream(int device) = 0;
  // Waits for the stream's work, then frees it.
  virtual void DeleteStream(int device, Stream stream) = 0;
  // An event of `device`; one never recorded is complete.
  virtual absl::StatusOr<Event> NewEvent(int device) = 0;
  virtual void DeleteEvent(int device, Event event) = 0;

  // `bytes` bytes of memory of the device, or pinned host memory the device
  // copies from and to directly. Freeing null does nothing.
  virtual absl::StatusOr<void*> AllocDevice(int device, uint64_t bytes) = 0;
  virtual void FreeDevice(int device, void* memory) = 0;
  virtual absl::StatusOr<char*> AllocPinned(int device, uint64_t bytes) = 0;
  virtual void FreePinned(int device, char* memory) = 0;

  // Enqueues a copy of `bytes` bytes from `src` to `dst` on `stream`; each
  // is host memory or memory of the device. `doing` names it in errors.
  virtual absl::Status CopyAsync(int device, void* dst, const void* src,
                                 uint64_t bytes, Stream stream,
                                 absl::string_view doing) = 0;
  // Enqueues dst[i] = op(a[i], b[i]) for i < count, elements of `dtype` in
  // memory of the device (the CPU engine's element semantics).
  virtual absl::Status Reduce(int device, ReduceOp op, DType dtype, void* dst,
                              const void* a, const void* b, size_t count,
                              Stream stream) = 0;
  // Enqueues data[i] /= world_size for i < count (avg's last step).
  virtual absl::Status FinalizeAvg(int device, DType dtype, void* data,
                                   size_t count, int world_size,
                                   Stream stream) = 0;

  // Enqueues `fn` on `stream`: a host thread runs it once the work enqueued
  // before it completed (or ended, e.g. aborted), and the stream's later
  // work waits for it to return. `fn` must not block or call this runtime
  // (CUDA's cudaLaunchHostFunc).
  virtual absl::Status EnqueueHost(int device, Stream stream,
                                   std::function<void()> fn) = 0;

  // Enqueues `event` on `stream`: it completes once the work enqueued
  // before it did.
  virtual absl::Status Record(int device, Event event, Stream stream) = 0;
  // Enqueues on `stream` a wait for `event` as last recorded before this
  // call: work enqueued on `stream` afterwards runs once that work did.
  // The calling thread does not wait; recording `event` again later does not
  // change what `stream` waits for (CUDA's cudaStreamWaitEvent).
  virtual absl::Status StreamWait(int device, Stream stream, Event event) = 0;
  // Blocks the calling thread (without spinning) until `event` completed.
  // Returns the error of the work it waited for, naming `what`.
  virtual absl::Status Wait(int device, Event event,
                            absl::string_view what) = 0;

  // Returns OK when all of [ptr, ptr + bytes) is memory of the device, or
  // `bytes` is 0; INVALID_ARGUMENT naming `what` ("input pointer")
  // otherwise, without reading the memory. (CUDA's asks the driver for the
  // allocation's extent; a driver without that entry point gets the start
  // checked alone.)
  virtual absl::Status CheckPointer(int device, const void* ptr, uint64_t bytes,
                                    absl::string_view what) = 0;
};

// This build's runtime: CUDA's when Chorus is built with CUDA, else one
// whose every operation returns the device refusal (UNIMPLEMENTED,
// "Distributed operations are not supported for device Cuda(n): this worker
// was built without CUDA"). Never null; lives for the whole process.
DeviceRuntime* BuiltInDeviceRuntime();

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_GPU_DEVICE_RUNTIME_H_
