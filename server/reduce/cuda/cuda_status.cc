#include "server/reduce/cuda/cuda_status.h"

#include <cuda.h>

#include "absl/strings/str_cat.h"

namespace chorus {
namespace cuda_reduce {

std::string CudaDeviceName(int device) {
  return absl::StrCat("Cuda(", device, ")");
}

absl::Status CudaError(int device, cudaError_t error, absl::string_view doing) {
  // The error was reported; do not let it resurface on this thread's next
  // cudaGetLastError().
  cudaGetLastError();
  absl::StatusCode code = absl::StatusCode::kInternal;
  switch (error) {
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidValue:
    case cudaErrorInvalidResourceHandle:
      code = absl::StatusCode::kInvalidArgument;
      break;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
      code = absl::StatusCode::kUnavailable;
      break;
    case cudaErrorMemoryAllocation:
      code = absl::StatusCode::kResourceExhausted;
      break;
    default:
      break;
  }
  return absl::Status(code, absl::StrCat(CudaDeviceName(device), ": ", doing,
                                         ": ", cudaGetErrorString(error), " (",
                                         cudaGetErrorName(error), ")"));
}

namespace {

// The driver's cuCtxGetCurrent and cuCtxSetCurrent, found through the
// runtime (the library does not link the driver); null where the driver
// lacks them.
struct ContextCalls {
  CUresult (*get)(CUcontext*) = nullptr;
  CUresult (*set)(CUcontext) = nullptr;
};

const ContextCalls& Contexts() {
  static const ContextCalls calls = [] {
    ContextCalls found;
    void* get = nullptr;
    void* set = nullptr;
    cudaDriverEntryPointQueryResult got = cudaDriverEntryPointSymbolNotFound;
    cudaDriverEntryPointQueryResult put = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 12000,
                                         cudaEnableDefault,
                                         &got) == cudaSuccess &&
        cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &set, 12000,
                                         cudaEnableDefault,
                                         &put) == cudaSuccess &&
        got == cudaDriverEntryPointSuccess &&
        put == cudaDriverEntryPointSuccess) {
      found.get = reinterpret_cast<CUresult (*)(CUcontext*)>(get);
      found.set = reinterpret_cast<CUresult (*)(CUcontext)>(set);
    }
    cudaGetLastError();  // a lookup's failure is not sticky; clear it
    return found;
  }();
  return calls;
}

}  // namespace

ScopedDevice::~ScopedDevice() {
  if (!switched_) return;
  // The thread's own context back, or none: restoring "device 0" on a
  // thread that had no context would create one on GPU 0.
  if (saved_context_known_) {
    Contexts().set(static_cast<CUcontext>(saved_context_));
  } else {
    cudaSetDevice(previous_);
  }
}

absl::Status ScopedDevice::Enter(int device) {
  if (device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(CudaDeviceName(device), ": negative device index"));
  }
  if (cudaError_t e = cudaGetDevice(&previous_); e != cudaSuccess) {
    return CudaError(device, e, "querying the current device");
  }
  if (previous_ == device) return absl::OkStatus();
  const ContextCalls& contexts = Contexts();
  CUcontext current = nullptr;
  saved_context_known_ = contexts.get != nullptr && contexts.set != nullptr &&
                         contexts.get(&current) == CUDA_SUCCESS;
  saved_context_ = current;
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return CudaError(device, e, "selecting the device");
  }
  switched_ = true;
  return absl::OkStatus();
}

}  // namespace cuda_reduce
}  // namespace chorus
