#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "server/worker/cuda_arch.h"
#include "server/worker/cuda_probe.h"

namespace chorus {

CudaProbeResult ProbeCuda() {
  CudaProbeResult result;
  result.built_with_cuda = true;
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    // No driver, no device, or a driver too old: zero GPUs.
    result.unavailable_reason = cudaGetErrorString(error);
    cudaGetLastError();  // clear the sticky error
    return result;
  }
  for (int i = 0; i < count; ++i) {
    Device gpu;
    gpu.kind = DeviceKind::kCuda;
    gpu.index = i;
    cudaDeviceProp props;
    if (cudaGetDeviceProperties(&props, i) == cudaSuccess) {
      gpu.model = props.name;
      gpu.memory_bytes = props.totalGlobalMem;
      gpu.compute_capability = absl::StrCat(props.major, ".", props.minor);
      std::string gap =
          CudaKernelGap(gpu.compute_capability, CHORUS_CUDA_ARCHITECTURES);
      if (!gap.empty()) result.refused[i] = std::move(gap);
    }
    result.gpus.push_back(gpu);
  }
  if (count == 0) result.unavailable_reason = "no CUDA device";
  return result;
}

}  // namespace chorus
