// DeviceBuffers: a worker's GPU memory for collectives of Cuda(n) ranks.
// A rank that reduces on Cuda(n) gets a DeviceReduceBuffer: the collective's
// data in memory of GPU n, combined with Chorus's CUDA kernels on a stream
// the call owns. The data plane still moves host bytes, so each chunk sent
// is copied off the GPU and each chunk received is copied onto it through
// pinned staging memory; copies and kernels of received chunks run while the
// next chunk is on the network (events per staging slot, never a
// device-wide synchronisation); a chunk to send is copied off the GPU once
// the stream's earlier work is done. Waits block on events created with
// cudaEventBlockingSync, so a waiting rank does not spin. Pointers a user
// passes are checked to be memory of the GPU before anything reads them.
// A caller's stream is waited for on the GPU, never by the host: the call's
// stream waits for an event recorded on it before reading the input, and it
// waits for the call's last copy into the output.
//
// The streams, events and buffers of a call (a "staging set") go back to a
// bounded pool when the call ends and are reused by the next call on that
// GPU: at most `max_idle_sets` sets per GPU and `max_idle_bytes` of device
// and pinned host memory per GPU stay allocated while idle.
//
// The GPU's operations come from a DeviceRuntime (device_runtime.h): this
// build's (CUDA's; without CUDA every call returns the device refusal,
// UNIMPLEMENTED, "Distributed operations are not supported for device
// Cuda(n): this worker was built without CUDA"), or an emulated one in
// tests.
//
// Lifecycle: one per worker, outliving the buffers it hands out.
// Thread safety: DeviceBuffers is thread-safe; each DeviceReduceBuffer is
// used by one thread at a time.
#ifndef CHORUS_SERVER_WORKER_GPU_DEVICE_BUFFERS_H_
#define CHORUS_SERVER_WORKER_GPU_DEVICE_BUFFERS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/collective.h"
#include "server/worker/algorithms/reduce_buffer.h"
#include "server/worker/gpu/device_runtime.h"

namespace chorus {

// A ReduceBuffer in GPU memory. Its errors name the device and quote the
// CUDA error string: INVALID_ARGUMENT (bad range, size or pointer),
// UNAVAILABLE (no driver or device), RESOURCE_EXHAUSTED (out of memory),
// INTERNAL (any other CUDA error, e.g. a kernel fault). After an error the
// buffer's staging set is not reused.
class DeviceReduceBuffer : public ReduceBuffer {
 public:
  // Copies all size() bytes to host `out` (resized) and waits for the copy.
  virtual absl::Status CopyToHost(std::string* out) = 0;
  // Copies all size() bytes to `dst`, memory of this buffer's GPU. Without
  // `then`, waits for the copy. With `then` (a stream of that GPU the caller
  // owns) returns once the copy is enqueued, and work enqueued on `then`
  // afterwards runs after the copy: the host does not wait; a fault of the
  // copy itself surfaces on `then` and at the GPU's next use.
  virtual absl::Status CopyToDevice(void* dst, void* then = nullptr) = 0;
};

class DeviceBuffers {
 public:
  // `runtime` (not owned) must outlive this.
  explicit DeviceBuffers(DeviceRuntime* runtime = BuiltInDeviceRuntime(),
                         int max_idle_sets = 2,
                         uint64_t max_idle_bytes = uint64_t{1} << 30);
  ~DeviceBuffers();
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;

  // Returns a buffer on Cuda(`device`) for a collective of `spec` holding a
  // copy of host bytes `input` (whole elements of spec.dtype). Codes as
  // DeviceReduceBuffer's, and UNIMPLEMENTED without CUDA.
  absl::StatusOr<std::unique_ptr<DeviceReduceBuffer>> FromHost(
      int device, const CollectiveSpec& spec, absl::string_view input);

  // Same, holding a copy of `bytes` bytes at `input`, memory of that GPU.
  // `after` is the stream of that GPU that wrote the input (a cudaStream_t,
  // or an emulated runtime's stream, owned by the caller): the input is read
  // once the work enqueued there so far completed, a wait on the GPU, not
  // on the host. Null: whatever wrote it is complete. INVALID_ARGUMENT when
  // `input` is not memory of that GPU.
  absl::StatusOr<std::unique_ptr<DeviceReduceBuffer>> FromDevice(
      int device, const CollectiveSpec& spec, const void* input, uint64_t bytes,
      void* after = nullptr);

  // Copies `bytes` bytes at `src` on Cuda(`device`) to host `out` (resized)
  // once the work on stream `after` so far completed (as FromDevice), and
  // waits for the copy. Codes as FromDevice().
  absl::Status CopyFromDevice(int device, const void* src, uint64_t bytes,
                              std::string* out, void* after = nullptr);
  // Copies host bytes `src` to `dst` on Cuda(`device`): without `then`,
  // waits for the copy; with it, returns once the copy is enqueued (the
  // host bytes taken) and orders stream `then` after it, as
  // DeviceReduceBuffer::CopyToDevice. Codes as FromDevice().
  absl::Status CopyToDevice(int device, absl::string_view src, void* dst,
                            void* then = nullptr);

  // Returns OK when [ptr, ptr + bytes) is memory of Cuda(`device`) or
  // `bytes` is 0; INVALID_ARGUMENT naming `what` ("input pointer")
  // otherwise, without reading the memory (DeviceRuntime::CheckPointer). Codes
  // as FromHost() for a device it cannot use.
  absl::Status CheckPointer(int device, const void* ptr, uint64_t bytes,
                            absl::string_view what);

  // OK unless Cuda(`device`) faulted during a call (a CUDA error that
  // leaves its context unusable: INTERNAL); then the device refusal
  // (UNIMPLEMENTED, "Distributed operations are not supported for device
  // Cuda(n): it faulted (...); restart the worker to use it again"), which
  // every later call on it gets too.
  absl::Status Withdrawn(int device) const;
  // The GPUs withdrawn so far (Cuda(n) of each fault).
  std::vector<Device> WithdrawnDevices() const;

  // Staging sets now idle in the pool, over all GPUs.
  int idle_sets() const;

  struct Pool;

 private:
  // A buffer holding `bytes` bytes copied from `input` (host or device)
  // after stream `after`'s work (null: none).
  absl::StatusOr<std::unique_ptr<DeviceReduceBuffer>> Make(
      int device, const CollectiveSpec& spec, const void* input, uint64_t bytes,
      void* after);
  // Copies `bytes` bytes between host and device memory after stream
  // `after`'s work; waits for it, or orders stream `then` after it.
  absl::Status Copy(int device, void* dst, const void* src, uint64_t bytes,
                    void* after, void* then);

  DeviceRuntime* const runtime_;  // not owned
  std::unique_ptr<Pool> pool_;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_GPU_DEVICE_BUFFERS_H_
