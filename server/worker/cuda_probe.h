// CudaProbe: asks the CUDA runtime which GPUs this process can use. Built
// from cuda_probe_cudart.cc with CUDA and cuda_probe_none.cc without.
//
// Thread-safe; may be slow the first time (driver initialisation).
#ifndef CHORUS_SERVER_WORKER_CUDA_PROBE_H_
#define CHORUS_SERVER_WORKER_CUDA_PROBE_H_

#include <map>
#include <string>
#include <vector>

#include "common/device.h"

namespace chorus {

struct CudaProbeResult {
  bool built_with_cuda = false;
  // Cuda(0..n-1) with model, memory and compute capability, every GPU
  // found, refused or not.
  std::vector<Device> gpus;
  // The GPUs this build has no kernels for, by index, with why.
  std::map<int, std::string> refused;
  // Why no GPU is usable ("no CUDA driver", ...) when gpus is empty.
  std::string unavailable_reason;
};

CudaProbeResult ProbeCuda();

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_CUDA_PROBE_H_
