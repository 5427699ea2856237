// Instantiates the max kernels for every dtype; see reduce_launch.h.
#include "server/reduce/cuda/reduce_kernels.cuh"
#include "server/reduce/cuda/reduce_launch.h"

namespace chorus {
namespace cuda_reduce {
namespace internal {

bool LaunchMax(DType dtype, void* dst, const void* a, const void* b,
               size_t count, int max_blocks, cudaStream_t stream) {
  return LaunchCombine(reduce::MaxOp{}, dtype, dst, a, b, count, max_blocks,
                       stream);
}

}  // namespace internal
}  // namespace cuda_reduce
}  // namespace chorus
