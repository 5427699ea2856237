// DeviceBuffers, the worker's GPU memory for Cuda(n) ranks. With a GPU: a
// DeviceReduceBuffer does exactly what a HostReduceBuffer does to the same
// bytes (combine in both orders, store, read, avg), its staging sets are
// reused, and CUDA errors come back as statuses naming the device. Without a
// GPU the same calls must refuse cleanly: UNAVAILABLE naming Cuda(0) and the
// CUDA error where CUDA is built in, the device refusal where it is not.

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#ifdef CHORUS_TEST_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/worker/algorithms/reduce_buffer.h"
#include "server/worker/cuda_probe.h"
#include "server/worker/gpu/device_buffers.h"
#include "tests/testing/reduce_buffer_steps.h"

namespace chorus {
namespace {

using test::AllReduceSpec;
using test::Ints;
using test::Steps;
using ::testing::HasSubstr;
using ::testing::StartsWith;

bool HaveGpu() { return !ProbeCuda().gpus.empty(); }

TEST(DeviceBuffersTest, Steps_SameBytesAsHostBuffer) {
  if (!HaveGpu())
    GTEST_SKIP() << "no CUDA GPU: " << ProbeCuda().unavailable_reason;
  DeviceBuffers buffers;
  for (uint64_t count :
       {uint64_t{1}, uint64_t{17}, uint64_t{4095}, uint64_t{1} << 20}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAvg}) {
      SCOPED_TRACE(absl::StrCat(count, " elements, op ", static_cast<int>(op)));
      const CollectiveSpec spec = AllReduceSpec(DType::kI32, op, count);
      const std::string input = Ints(1, count);
      std::string host = input;
      HostReduceBuffer on_host(spec, &host);
      ASSERT_TRUE(Steps(on_host, input.size()).ok());

      auto on_gpu = buffers.FromHost(0, spec, input);
      ASSERT_TRUE(on_gpu.ok()) << on_gpu.status();
      ASSERT_TRUE(Steps(**on_gpu, input.size()).ok());
      std::string result;
      ASSERT_TRUE((*on_gpu)->CopyToHost(&result).ok());
      EXPECT_TRUE(result == host) << "GPU and CPU results differ";
    }
  }
  EXPECT_GE(buffers.idle_sets(), 1);
}

#ifdef CHORUS_TEST_WITH_CUDA
TEST(DeviceBuffersTest, FromDeviceAndCopyToDevice_UserMemoryRoundTrip) {
  if (!HaveGpu())
    GTEST_SKIP() << "no CUDA GPU: " << ProbeCuda().unavailable_reason;
  DeviceBuffers buffers;
  const uint64_t count = 100000;
  const std::string input = Ints(5, count);
  const std::string addend = Ints(-2, count);
  void* in = nullptr;
  void* out = nullptr;
  ASSERT_EQ(cudaMalloc(&in, input.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, input.size()), cudaSuccess);
  ASSERT_TRUE(buffers.CopyToDevice(0, input, in).ok());

  const CollectiveSpec spec = AllReduceSpec(DType::kI32, ReduceOp::kSum, count);
  auto buffer = buffers.FromDevice(0, spec, in, input.size());
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  ASSERT_TRUE((*buffer)->Combine(Range{0, input.size()}, addend, false).ok());
  ASSERT_TRUE((*buffer)->CopyToDevice(out).ok());
  buffer->reset();

  std::string result;
  ASSERT_TRUE(buffers.CopyFromDevice(0, out, input.size(), &result).ok());
  std::string expected = input;
  HostReduceBuffer host(spec, &expected);
  ASSERT_TRUE(host.Combine(Range{0, input.size()}, addend, false).ok());
  EXPECT_TRUE(result == expected);
  // The input was only read.
  std::string unchanged;
  ASSERT_TRUE(buffers.CopyFromDevice(0, in, input.size(), &unchanged).ok());
  EXPECT_TRUE(unchanged == input);
  cudaFree(in);
  cudaFree(out);
}

TEST(DeviceBuffersTest, NotDeviceMemory_RefusedNamingDevice) {
  if (!HaveGpu())
    GTEST_SKIP() << "no CUDA GPU: " << ProbeCuda().unavailable_reason;
  DeviceBuffers buffers;
  const CollectiveSpec spec = AllReduceSpec(DType::kI32, ReduceOp::kSum, 4);
  const std::string host = Ints(0, 4);
  for (const void* bad : {static_cast<const void*>(host.data()),
                          reinterpret_cast<const void*>(0x10)}) {
    auto buffer = buffers.FromDevice(0, spec, bad, 16);
    ASSERT_FALSE(buffer.ok());
    EXPECT_EQ(buffer.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(buffer.status().message()),
                StartsWith("Cuda(0): the input pointer 0x"));
    EXPECT_THAT(std::string(buffer.status().message()),
                HasSubstr("is not memory of this GPU"));
  }
  std::string out;
  EXPECT_EQ(buffers.CopyFromDevice(0, host.data(), 16, &out).code(),
            absl::StatusCode::kInvalidArgument);
  // Nothing was spoiled: a fresh call works.
  auto fresh = buffers.FromHost(0, spec, Ints(0, 4));
  EXPECT_TRUE(fresh.ok()) << fresh.status();
}
TEST(DeviceBuffersTest, RangePastTheAllocation_RefusedNamingWhatIsLeft) {
  if (!HaveGpu())
    GTEST_SKIP() << "no CUDA GPU: " << ProbeCuda().unavailable_reason;
  DeviceBuffers buffers;
  void* small = nullptr;
  ASSERT_EQ(cudaMalloc(&small, 64), cudaSuccess);
  const char* middle = static_cast<const char*>(small) + 32;
  const CollectiveSpec spec = AllReduceSpec(DType::kI32, ReduceOp::kSum, 12);
  auto buffer = buffers.FromDevice(0, spec, middle, 48);
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(buffer.status().message()),
              HasSubstr("has 32 bytes of this GPU's memory behind it, not 48"));
  // The whole range is fine.
  auto fits = buffers.FromDevice(0, spec, middle, 32);
  EXPECT_TRUE(fits.ok()) << fits.status();
  fits = absl::InternalError("released");
  cudaFree(small);
}
#endif  // CHORUS_TEST_WITH_CUDA

TEST(DeviceBuffersTest, BadRange_InvalidArgument) {
  if (!HaveGpu())
    GTEST_SKIP() << "no CUDA GPU: " << ProbeCuda().unavailable_reason;
  DeviceBuffers buffers;
  const CollectiveSpec spec = AllReduceSpec(DType::kI32, ReduceOp::kSum, 4);
  auto buffer = buffers.FromHost(0, spec, Ints(0, 4));
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ((*buffer)->Read(Range{8, 16}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*buffer)->Combine(Range{0, 8}, Ints(0, 1), false).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DeviceBuffersTest, MissingGpu_ErrorNamesDevice) {
  DeviceBuffers buffers;
  const CollectiveSpec spec = AllReduceSpec(DType::kF32, ReduceOp::kSum, 4);
  const int missing = HaveGpu() ? 99 : 0;
  auto buffer = buffers.FromHost(missing, spec, std::string(16, '\0'));
  ASSERT_FALSE(buffer.ok());
  const std::string name = absl::StrCat("Cuda(", missing, ")");
#ifndef CHORUS_TEST_WITH_CUDA
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(buffer.status().message()),
              StartsWith(absl::StrCat(
                  "Distributed operations are not supported for device ", name,
                  ": this worker was built without CUDA")));
  return;
#endif
  // No driver or no device: UNAVAILABLE; a GPU index that does not exist:
  // INVALID_ARGUMENT. Either way the message names the device and quotes
  // CUDA.
  EXPECT_THAT(buffer.status().code(),
              ::testing::AnyOf(absl::StatusCode::kUnavailable,
                               absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(buffer.status().message()),
              StartsWith(absl::StrCat(name, ": ")));
  EXPECT_THAT(std::string(buffer.status().message()), HasSubstr("(cuda"));
  EXPECT_EQ(buffers.idle_sets(), 0);
}

}  // namespace
}  // namespace chorus
