#include "server/worker/cuda_probe.h"

namespace chorus {

CudaProbeResult ProbeCuda() {
  CudaProbeResult result;
  result.unavailable_reason = "this worker was built without CUDA";
  return result;
}

}  // namespace chorus
