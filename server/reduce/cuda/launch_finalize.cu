// Instantiates the avg finalize kernels for every dtype; see reduce_launch.h.
#include "server/reduce/cuda/reduce_kernels.cuh"
#include "server/reduce/cuda/reduce_launch.h"

namespace chorus {
namespace cuda_reduce {
namespace internal {

bool LaunchFinalizeAvg(DType dtype, void* data, size_t count, int world_size,
                       int max_blocks, cudaStream_t stream) {
  return reduce::DispatchDType(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    LaunchFinalizeKernel<T>(reduce::AvgFinalize{world_size},
                            static_cast<T*>(data), count, max_blocks, stream);
  });
}

}  // namespace internal
}  // namespace cuda_reduce
}  // namespace chorus
