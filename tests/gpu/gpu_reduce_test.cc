// Checks every CUDA reduce kernel x dtype x op against the CPU engine, bit for
// bit (NaN payloads aside), on sizes around the 16-byte pack boundaries and
// one large size, with aligned and misaligned (by one element) pointers.
// Without a usable GPU the kernel tests skip with the reason; the argument
// checks that need no GPU still run.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/half.h"
#include "gtest/gtest.h"
#include "server/reduce/cpu/cpu_reduce.h"
#include "server/reduce/cuda/cuda_reduce.h"
#include "tests/unit/reduce/reference.h"
#include "tests/unit/reduce/test_values.h"

namespace chorus {
namespace {

using reduce_test::DTypeOf;
using reduce_test::RandomValues;
using reduce_test::SameResult;

constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin,
                                ReduceOp::kMax, ReduceOp::kAvg};
constexpr size_t kLargeSize = size_t{1} << 24;
constexpr size_t kSizes[] = {0, 1, 15, 16, 17, 4095, kLargeSize};
constexpr int kDevice = 0;
constexpr int kAvgRanks = 3;

// Element offsets of dst, a and b from 16-byte aligned allocations.
struct Offsets {
  size_t dst;
  size_t a;
  size_t b;
  const char* name;
};
constexpr Offsets kOffsets[] = {
    {0, 0, 0, "aligned"},
    {1, 1, 1, "all offset by one"},  // Scalar head, then 16-byte packs.
    {1, 0, 1, "dst and b offset"},   // No common alignment: all scalar.
};

// Returns "" when a CUDA device is usable, else why not.
std::string NoGpuReason() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return absl::StrCat("no usable CUDA device: cudaGetDeviceCount failed: ",
                        cudaGetErrorString(error));
  }
  if (count == 0) return "no usable CUDA device: cudaGetDeviceCount found 0";
  return "";
}

#define CHORUS_CUDA_ASSERT(call)                              \
  do {                                                        \
    const cudaError_t chorus_error = (call);                  \
    ASSERT_EQ(chorus_error, cudaSuccess)                      \
        << #call << ": " << cudaGetErrorString(chorus_error); \
  } while (false)

// One device allocation, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);
  }
  cudaError_t Allocate(size_t bytes) { return cudaMalloc(&data_, bytes); }
  template <typename T>
  T* As() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
};

template <typename T>
::testing::AssertionResult SameElements(const std::vector<T>& got,
                                        const std::vector<T>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << "sizes " << got.size() << " != " << want.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (!SameResult(got[i], want[i])) {
      uint64_t got_bits = 0;
      uint64_t want_bits = 0;
      std::memcpy(&got_bits, &got[i], sizeof(T));
      std::memcpy(&want_bits, &want[i], sizeof(T));
      return ::testing::AssertionFailure()
             << "element " << i << " (of the checked range incl. guards): "
             << "gpu bits 0x" << std::hex << got_bits << ", cpu bits 0x"
             << want_bits;
    }
  }
  return ::testing::AssertionSuccess();
}

template <typename T>
class GpuReduceTypedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = NoGpuReason();
    if (!reason.empty()) GTEST_SKIP() << reason;
    CHORUS_CUDA_ASSERT(cudaSetDevice(kDevice));
    CHORUS_CUDA_ASSERT(
        cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  cudaStream_t stream_ = nullptr;
};

using AllTypes =
    ::testing::Types<Float16, BFloat16, float, double, int8_t, uint8_t, int32_t,
                     int64_t, uint32_t, uint64_t>;
TYPED_TEST_SUITE(GpuReduceTypedTest, AllTypes);

TYPED_TEST(GpuReduceTypedTest, EveryKernel_SizesAndOffsets_MatchCpuEngine) {
  using T = TypeParam;
  const DType dtype = DTypeOf<T>();
  const cudaStream_t stream = this->stream_;
  // dst starts one 16-byte pack into its buffer (plus its offset), so that a
  // guard element before it can be checked without changing its alignment.
  const size_t lead = 16 / sizeof(T);
  const size_t capacity = lead + kLargeSize + 2;
  const size_t bytes = capacity * sizeof(T);
  const std::vector<T> a = RandomValues<T>(capacity, 101);
  const std::vector<T> b = RandomValues<T>(capacity, 202);
  const std::vector<T> init = RandomValues<T>(capacity, 303);
  DeviceBuffer dev_a, dev_b, dev_init, dev_out;
  CHORUS_CUDA_ASSERT(dev_a.Allocate(bytes));
  CHORUS_CUDA_ASSERT(dev_b.Allocate(bytes));
  CHORUS_CUDA_ASSERT(dev_init.Allocate(bytes));
  CHORUS_CUDA_ASSERT(dev_out.Allocate(bytes));
  CHORUS_CUDA_ASSERT(
      cudaMemcpy(dev_a.As<T>(), a.data(), bytes, cudaMemcpyHostToDevice));
  CHORUS_CUDA_ASSERT(
      cudaMemcpy(dev_b.As<T>(), b.data(), bytes, cudaMemcpyHostToDevice));
  CHORUS_CUDA_ASSERT(
      cudaMemcpy(dev_init.As<T>(), init.data(), bytes, cudaMemcpyHostToDevice));

  for (size_t size : kSizes) {
    for (const Offsets& off : kOffsets) {
      // The result goes to [at, at + size); the checked window adds one
      // guard element on each side, which must come back unchanged.
      const size_t at = lead + off.dst;
      const size_t first = at - 1;
      const size_t window = size + 2;
      for (ReduceOp op : kAllOps) {
        for (bool in_place : {true, false}) {
          SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " ", ReduceOpName(op),
                                    in_place ? " into" : "", " size ", size,
                                    " ", off.name));
          CHORUS_CUDA_ASSERT(cudaMemcpyAsync(
              dev_out.As<T>() + first, dev_init.As<T>() + first,
              window * sizeof(T), cudaMemcpyDeviceToDevice, stream));
          std::vector<T> want(init.begin() + first,
                              init.begin() + first + window);
          absl::Status gpu;
          absl::Status cpu;
          if (in_place) {
            gpu = cuda_reduce::ReduceInto(kDevice, op, dtype,
                                          dev_out.As<T>() + at,
                                          dev_b.As<T>() + off.b, size, stream);
            cpu = cpu_reduce::ReduceInto(op, dtype, want.data() + 1,
                                         b.data() + off.b, size);
          } else {
            gpu = cuda_reduce::Reduce(kDevice, op, dtype, dev_out.As<T>() + at,
                                      dev_a.As<T>() + off.a,
                                      dev_b.As<T>() + off.b, size, stream);
            cpu = cpu_reduce::Reduce(op, dtype, want.data() + 1,
                                     a.data() + off.a, b.data() + off.b, size);
          }
          ASSERT_TRUE(gpu.ok()) << gpu;
          ASSERT_TRUE(cpu.ok()) << cpu;
          if (op == ReduceOp::kAvg) {
            gpu = cuda_reduce::FinalizeAvg(kDevice, dtype, dev_out.As<T>() + at,
                                           size, kAvgRanks, stream);
            cpu = cpu_reduce::FinalizeAvg(dtype, want.data() + 1, size,
                                          kAvgRanks);
            ASSERT_TRUE(gpu.ok()) << gpu;
            ASSERT_TRUE(cpu.ok()) << cpu;
          }
          std::vector<T> got(window);
          CHORUS_CUDA_ASSERT(cudaMemcpyAsync(
              got.data(), dev_out.As<T>() + first, window * sizeof(T),
              cudaMemcpyDeviceToHost, stream));
          CHORUS_CUDA_ASSERT(cudaStreamSynchronize(stream));
          ASSERT_TRUE(SameElements(got, want));
        }
      }
    }
  }
}

TYPED_TEST(GpuReduceTypedTest, FinalizeAvg_ManyRankCounts_MatchCpuEngine) {
  using T = TypeParam;
  const DType dtype = DTypeOf<T>();
  const size_t size = 4099;
  const std::vector<T> data = RandomValues<T>(size + 1, 404);
  DeviceBuffer dev;
  CHORUS_CUDA_ASSERT(dev.Allocate((size + 1) * sizeof(T)));
  for (int ranks : {1, 2, 7, 1000}) {
    for (size_t offset : {0, 1}) {
      SCOPED_TRACE(
          absl::StrCat(DTypeName(dtype), " ranks ", ranks, " offset ", offset));
      CHORUS_CUDA_ASSERT(
          cudaMemcpyAsync(dev.As<T>(), data.data(), (size + 1) * sizeof(T),
                          cudaMemcpyHostToDevice, this->stream_));
      ASSERT_TRUE(cuda_reduce::FinalizeAvg(kDevice, dtype, dev.As<T>() + offset,
                                           size, ranks, this->stream_)
                      .ok());
      std::vector<T> want = data;
      ASSERT_TRUE(
          cpu_reduce::FinalizeAvg(dtype, want.data() + offset, size, ranks)
              .ok());
      std::vector<T> got(size + 1);
      CHORUS_CUDA_ASSERT(
          cudaMemcpyAsync(got.data(), dev.As<T>(), (size + 1) * sizeof(T),
                          cudaMemcpyDeviceToHost, this->stream_));
      CHORUS_CUDA_ASSERT(cudaStreamSynchronize(this->stream_));
      ASSERT_TRUE(SameElements(got, want));
    }
  }
}

// ---- Argument checks: no GPU needed, nothing is launched --------------------

// A stream handle that is not the default stream; never used by these tests.
cudaStream_t FakeStream() { return reinterpret_cast<cudaStream_t>(0x10); }

TEST(GpuReduceArgsTest, ReduceInto_DefaultStream_ReturnsInvalidArgument) {
  alignas(16) float buffer[8] = {};
  for (cudaStream_t stream : {static_cast<cudaStream_t>(nullptr),
                              cudaStreamLegacy, cudaStreamPerThread}) {
    const absl::Status status = cuda_reduce::ReduceInto(
        0, ReduceOp::kSum, DType::kF32, buffer, buffer + 4, 4, stream);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StartsWith(status.message(), "Cuda(0): "))
        << status.message();
  }
}

TEST(GpuReduceArgsTest,
     Reduce_InvalidDType_ReturnsInvalidArgumentNamingDevice) {
  alignas(16) float buffer[8] = {};
  const absl::Status status =
      cuda_reduce::Reduce(3, ReduceOp::kSum, static_cast<DType>(77), buffer,
                          buffer, buffer + 4, 4, FakeStream());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(status.message(), "Cuda(3): "))
      << status.message();
}

TEST(GpuReduceArgsTest, ReduceInto_MisalignedPointer_ReturnsInvalidArgument) {
  alignas(16) unsigned char buffer[64] = {};
  const absl::Status status = cuda_reduce::ReduceInto(
      0, ReduceOp::kMax, DType::kF64, buffer + 4, buffer + 32, 2, FakeStream());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "aligned"))
      << status.message();
}

TEST(GpuReduceArgsTest, FinalizeAvg_WorldSizeZero_ReturnsInvalidArgument) {
  alignas(16) float buffer[4] = {};
  EXPECT_EQ(cuda_reduce::FinalizeAvg(0, DType::kF32, buffer, 4, 0, FakeStream())
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GpuReduceArgsTest, ReduceInto_ZeroCount_ReturnsOkWithoutLaunching) {
  EXPECT_TRUE(cuda_reduce::ReduceInto(0, ReduceOp::kSum, DType::kF32, nullptr,
                                      nullptr, 0, FakeStream())
                  .ok());
}

TEST(GpuReduceArgsTest, ReduceInto_DeviceMissing_ReturnsErrorNamingDevice) {
  // The first index past the last GPU: 0 on a machine without one.
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    count = 0;
  }
  alignas(16) float buffer[8] = {};
  const absl::Status status = cuda_reduce::ReduceInto(
      count, ReduceOp::kSum, DType::kF32, buffer, buffer + 4, 4, FakeStream());
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_TRUE(
      absl::StartsWith(status.message(), absl::StrCat("Cuda(", count, "): ")))
      << status.message();
}

}  // namespace
}  // namespace chorus
