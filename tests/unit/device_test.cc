#include "common/device.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

Device Make(DeviceKind kind, int index, std::string other = "") {
  Device d;
  d.kind = kind;
  d.index = index;
  d.other_kind = std::move(other);
  return d;
}

TEST(CanonicalName, EveryKind_MatchesDesign) {
  EXPECT_EQ(CanonicalName(Make(DeviceKind::kCpu, 0)), "Cpu");
  EXPECT_EQ(CanonicalName(Make(DeviceKind::kCuda, 0)), "Cuda(0)");
  EXPECT_EQ(CanonicalName(Make(DeviceKind::kRocm, 1)), "Rocm(1)");
  EXPECT_EQ(CanonicalName(Make(DeviceKind::kVulkan, 0)), "Vulkan(0)");
  EXPECT_EQ(CanonicalName(Make(DeviceKind::kMetal, 0)), "Metal(0)");
  EXPECT_EQ(CanonicalName(Make(DeviceKind::kWgpu, 0)), "Wgpu(0)");
  EXPECT_EQ(CanonicalName(Make(DeviceKind::kTpu, 3)), "Tpu(3)");
  EXPECT_EQ(CanonicalName(Make(DeviceKind::kOther, 2, "Npu")), "Npu(2)");
}

TEST(UnsupportedDeviceError, NoReason_ExactMessage) {
  absl::Status status = UnsupportedDeviceError(Make(DeviceKind::kVulkan, 0));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(status.message(),
            "Distributed operations are not supported for device Vulkan(0)");
}

TEST(UnsupportedDeviceError, WithReason_ReasonAfterPrefix) {
  absl::Status status =
      UnsupportedDeviceError(Make(DeviceKind::kCuda, 1), "no such GPU");
  EXPECT_EQ(status.message(),
            "Distributed operations are not supported for device Cuda(1): "
            "no such GPU");
}

TEST(CheckDeviceSupported, Cpu_Ok) {
  EXPECT_TRUE(CheckDeviceSupported(Make(DeviceKind::kCpu, 0), {}).ok());
}

TEST(CheckDeviceSupported, CudaWithoutCudaBuild_Unimplemented) {
  absl::Status status = CheckDeviceSupported(Make(DeviceKind::kCuda, 0), {});
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(status.message(),
            "Distributed operations are not supported for device Cuda(0): "
            "this worker was built without CUDA");
}

TEST(CheckDeviceSupported, CudaIndexOutOfRange_Unimplemented) {
  DeviceSupport support;
  support.cuda_built = true;
  support.cuda_device_count = 1;
  EXPECT_TRUE(CheckDeviceSupported(Make(DeviceKind::kCuda, 0), support).ok());
  absl::Status status =
      CheckDeviceSupported(Make(DeviceKind::kCuda, 1), support);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(status.message()),
              StartsWith("Distributed operations are not supported for "
                         "device Cuda(1): this worker has 1 CUDA device"));
}

TEST(CheckDeviceSupported, CudaRefusedGpu_UnimplementedQuotingWhy) {
  DeviceSupport support;
  support.cuda_built = true;
  support.cuda_device_count = 2;
  support.cuda_refused[1] =
      "compute capability 7.0, this build has kernels for 8.0 and 9.0";
  EXPECT_TRUE(CheckDeviceSupported(Make(DeviceKind::kCuda, 0), support).ok());
  const absl::Status status =
      CheckDeviceSupported(Make(DeviceKind::kCuda, 1), support);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(status.message(),
            "Distributed operations are not supported for device Cuda(1): "
            "compute capability 7.0, this build has kernels for 8.0 and 9.0");
}

TEST(CheckDeviceSupported, CudaCountUnknown_Ok) {
  DeviceSupport support;
  support.cuda_built = true;
  EXPECT_TRUE(CheckDeviceSupported(Make(DeviceKind::kCuda, 7), support).ok());
}

TEST(CheckDeviceSupported, OtherKinds_UnimplementedQuotingDevice) {
  DeviceSupport support;
  support.cuda_built = true;
  support.cuda_device_count = 8;
  for (const Device& d :
       {Make(DeviceKind::kRocm, 1), Make(DeviceKind::kVulkan, 0),
        Make(DeviceKind::kMetal, 0), Make(DeviceKind::kWgpu, 0),
        Make(DeviceKind::kTpu, 3), Make(DeviceKind::kOther, 2, "Npu")}) {
    absl::Status status = CheckDeviceSupported(d, support);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
    EXPECT_EQ(status.message(),
              "Distributed operations are not supported for device " +
                  CanonicalName(d));
  }
}

TEST(ValidateDevice, Malformed_InvalidArgument) {
  EXPECT_EQ(ValidateDevice(Make(DeviceKind::kUnspecified, 0)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateDevice(Make(static_cast<DeviceKind>(42), 0)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateDevice(Make(DeviceKind::kCuda, -1)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateDevice(Make(DeviceKind::kCpu, 1)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateDevice(Make(DeviceKind::kOther, 0)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateDevice(Make(DeviceKind::kCuda, 0, "Npu")).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidateDevice(Make(DeviceKind::kOther, 2, "Npu")).ok());
}

TEST(ParseDeviceSpec, KnownKinds_CaseInsensitive) {
  absl::StatusOr<Device> cuda = ParseDeviceSpec("CUDA:3");
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_EQ(CanonicalName(*cuda), "Cuda(3)");
  absl::StatusOr<Device> cpu = ParseDeviceSpec("cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(CanonicalName(*cpu), "Cpu");
  absl::StatusOr<Device> vulkan = ParseDeviceSpec("vulkan");
  ASSERT_TRUE(vulkan.ok());
  EXPECT_EQ(CanonicalName(*vulkan), "Vulkan(0)");
}

TEST(ParseDeviceSpec, UnknownKind_KeptAsGiven) {
  absl::StatusOr<Device> npu = ParseDeviceSpec("Npu:2");
  ASSERT_TRUE(npu.ok());
  EXPECT_EQ(npu->kind, DeviceKind::kOther);
  EXPECT_EQ(CanonicalName(*npu), "Npu(2)");
}

TEST(ParseDeviceSpec, Malformed_InvalidArgument) {
  for (const char* spec : {"", ":1", "cuda:", "cuda:-1", "cuda:x", "cpu:1",
                           "np u:1", "cuda:99999999999"}) {
    EXPECT_EQ(ParseDeviceSpec(spec).status().code(),
              absl::StatusCode::kInvalidArgument)
        << spec;
  }
}

TEST(ParseDeviceList, Duplicate_InvalidArgument) {
  absl::StatusOr<std::vector<Device>> devices =
      ParseDeviceList("cpu,cuda:0,CUDA:0");
  EXPECT_EQ(devices.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(devices.status().message()), HasSubstr("Cuda(0)"));
}

TEST(ParseDeviceList, Valid_InOrder) {
  absl::StatusOr<std::vector<Device>> devices =
      ParseDeviceList("cpu, cuda:0,vulkan:1");
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 3u);
  EXPECT_EQ(CanonicalName((*devices)[2]), "Vulkan(1)");
}

TEST(ParseDeviceList, Empty_InvalidArgument) {
  EXPECT_EQ(ParseDeviceList(" , ").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace chorus
