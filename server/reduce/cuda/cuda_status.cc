#include "server/reduce/cuda/cuda_status.h"

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

ScopedDevice::~ScopedDevice() {
  if (switched_) cudaSetDevice(previous_);
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
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return CudaError(device, e, "selecting the device");
  }
  switched_ = true;
  return absl::OkStatus();
}

}  // namespace cuda_reduce
}  // namespace chorus
