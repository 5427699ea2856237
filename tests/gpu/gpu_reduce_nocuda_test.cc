// Stands in for gpu_reduce_test in builds without CUDA, so that the gpu label
// reports a skip with the reason instead of finding no test.
#include "gtest/gtest.h"

namespace chorus {
namespace {

TEST(GpuReduceTest, Kernels_BuiltWithoutCuda_Skip) {
  GTEST_SKIP() << "built without CUDA (CHORUS_HAVE_CUDA is OFF): "
                  "chorus_reduce_cuda is not built, nothing to test";
}

}  // namespace
}  // namespace chorus
