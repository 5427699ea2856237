// Helpers for code that calls the CUDA runtime: CUDA errors as statuses that
// name the device and quote the CUDA error string, and a scope that makes a
// device current for the calling thread.
//
// Stateless functions; ScopedDevice is used by one thread.
#ifndef CHORUS_SERVER_REDUCE_CUDA_CUDA_STATUS_H_
#define CHORUS_SERVER_REDUCE_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace chorus {
namespace cuda_reduce {

// "Cuda(<device>)".
std::string CudaDeviceName(int device);

// Returns a status for `error` raised while `doing` on `device`:
// "Cuda(0): <doing>: <CUDA error string> (<error name>)". INVALID_ARGUMENT
// for an invalid device, value or handle; UNAVAILABLE when there is no
// driver or device; RESOURCE_EXHAUSTED when memory ran out; INTERNAL else.
// Clears the thread's last CUDA error.
absl::Status CudaError(int device, cudaError_t error, absl::string_view doing);

// Makes a device current for the calling thread and restores the thread's
// previous context when it goes out of scope (none, for a thread that had
// none: no context is made on GPU 0 for a thread that never used it).
class ScopedDevice {
 public:
  ScopedDevice() = default;
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

  // Switches to `device`. Returns OK, INVALID_ARGUMENT for a negative index,
  // or the failing call's CudaError.
  absl::Status Enter(int device);

 private:
  int previous_ = 0;
  bool switched_ = false;
  // The thread's context before Enter() (a CUcontext; null: none), when the
  // driver told it.
  void* saved_context_ = nullptr;
  bool saved_context_known_ = false;
};

}  // namespace cuda_reduce
}  // namespace chorus

#endif  // CHORUS_SERVER_REDUCE_CUDA_CUDA_STATUS_H_
