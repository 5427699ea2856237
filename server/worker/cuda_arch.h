// Whether a build's CUDA code can run on a GPU of a given compute
// capability. A build carries machine code for some architectures ("80-real":
// sm_80) and PTX for others ("90-virtual": compute_90), as CMake's
// CUDA_ARCHITECTURES lists them. Machine code for X.y runs on X.z with
// z >= y; PTX for X.y is compiled by the driver for any X.y or newer. A GPU
// the build has no code for is refused when the worker starts, rather than
// failing at its first kernel launch.
//
// Pure function; thread-safe.
#ifndef CHORUS_SERVER_WORKER_CUDA_ARCH_H_
#define CHORUS_SERVER_WORKER_CUDA_ARCH_H_

#include <string>

#include "absl/strings/string_view.h"

namespace chorus {

// Returns "" when code built for `architectures` ("80-real;90-real;
// 90-virtual", or with commas; a bare "80" means both machine code and PTX)
// runs on a GPU of
// `compute_capability` ("8.6"); otherwise why not, as a refusal's reason:
// "compute capability 7.0, this build has kernels for 8.0 and 9.0". An
// unknown capability (empty or malformed) or an empty list gives "" (nothing
// to judge by).
std::string CudaKernelGap(absl::string_view compute_capability,
                          absl::string_view architectures);

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_CUDA_ARCH_H_
