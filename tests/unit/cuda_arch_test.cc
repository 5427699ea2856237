// Which GPUs a build's CUDA code runs on, and how a refusal reads.
#include "server/worker/cuda_arch.h"

#include "gtest/gtest.h"

namespace chorus {
namespace {

constexpr char kDefaultBuild[] = "80-real;90-real;90-virtual";

TEST(CudaKernelGapTest, CudaKernelGap_MachineCodeOfSameMajor_Served) {
  EXPECT_EQ(CudaKernelGap("8.0", kDefaultBuild), "");
  EXPECT_EQ(CudaKernelGap("8.6", kDefaultBuild), "");  // sm_80 runs on 8.6
  EXPECT_EQ(CudaKernelGap("9.0", kDefaultBuild), "");
}

TEST(CudaKernelGapTest, CudaKernelGap_NewerThanEveryKernel_ServedThroughPtx) {
  EXPECT_EQ(CudaKernelGap("10.0", kDefaultBuild), "");
  EXPECT_EQ(CudaKernelGap("12.0", "90"), "");  // a bare 90 carries PTX
  EXPECT_NE(CudaKernelGap("12.0", "80-real;90-real"), "");
}

TEST(CudaKernelGapTest, CudaKernelGap_OlderGpu_RefusedNamingTheKernels) {
  EXPECT_EQ(CudaKernelGap("7.0", kDefaultBuild),
            "compute capability 7.0, this build has kernels for 8.0 and 9.0 "
            "and PTX for 9.0 and newer");
  EXPECT_EQ(CudaKernelGap("8.0", "90-real"),
            "compute capability 8.0, this build has kernels for 9.0");
  EXPECT_EQ(CudaKernelGap("6.1", "70-real,80-real,86-real"),
            "compute capability 6.1, this build has kernels for 7.0, 8.0 and "
            "8.6");
}

TEST(CudaKernelGapTest, CudaKernelGap_NothingToJudgeBy_Served) {
  EXPECT_EQ(CudaKernelGap("", kDefaultBuild), "");
  EXPECT_EQ(CudaKernelGap("seven", kDefaultBuild), "");
  EXPECT_EQ(CudaKernelGap("7.0", ""), "");
}

}  // namespace
}  // namespace chorus
