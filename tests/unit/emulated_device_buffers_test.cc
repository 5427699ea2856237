// DeviceBuffers over EmulatedDeviceRuntime: the staging, ordering, pooling,
// pointer checks and error handling a GPU rank relies on, run on every
// machine. The emulated kernels are the CPU engine's, so a device buffer
// must give exactly the bytes a HostReduceBuffer gives.

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/worker/algorithms/reduce_buffer.h"
#include "server/worker/gpu/device_buffers.h"
#include "server/worker/gpu/emulated_device_runtime.h"
#include "tests/testing/reduce_buffer_steps.h"

namespace chorus {
namespace {

using test::AllReduceSpec;
using test::Ints;
using test::Steps;
using ::testing::HasSubstr;
using ::testing::StartsWith;

class EmulatedDeviceBuffersTest : public ::testing::Test {
 protected:
  EmulatedDeviceRuntime runtime_{2, uint64_t{256} << 20};
};

TEST_F(EmulatedDeviceBuffersTest, Steps_SameBytesAsHostBuffer) {
  {
    DeviceBuffers buffers(&runtime_);
    for (uint64_t count :
         {uint64_t{1}, uint64_t{17}, uint64_t{4095}, uint64_t{1} << 20}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAvg}) {
        SCOPED_TRACE(
            absl::StrCat(count, " elements, op ", static_cast<int>(op)));
        const CollectiveSpec spec = AllReduceSpec(DType::kI32, op, count);
        const std::string input = Ints(1, count);
        std::string host = input;
        HostReduceBuffer on_host(spec, &host);
        ASSERT_TRUE(Steps(on_host, input.size()).ok());

        auto on_gpu = buffers.FromHost(1, spec, input);
        ASSERT_TRUE(on_gpu.ok()) << on_gpu.status();
        ASSERT_TRUE(Steps(**on_gpu, input.size()).ok());
        std::string result;
        ASSERT_TRUE((*on_gpu)->CopyToHost(&result).ok());
        EXPECT_TRUE(result == host) << "device and host results differ";
      }
    }
    // One staging set served every call, and stays for the next.
    EXPECT_EQ(buffers.idle_sets(), 1);
    EXPECT_GT(runtime_.AllocatedBytes(1), 0u);
    EXPECT_EQ(runtime_.AllocatedBytes(0), 0u);
  }
  // The pool freed its memory with the buffers.
  EXPECT_EQ(runtime_.AllocatedBytes(1), 0u);
}

TEST_F(EmulatedDeviceBuffersTest,
       FromDeviceAndCopyToDevice_UserMemoryRoundTrip) {
  DeviceBuffers buffers(&runtime_);
  const uint64_t count = 100000;
  const std::string input = Ints(5, count);
  const std::string addend = Ints(-2, count);
  absl::StatusOr<void*> in = runtime_.AllocDevice(0, input.size());
  absl::StatusOr<void*> out = runtime_.AllocDevice(0, input.size());
  ASSERT_TRUE(in.ok() && out.ok());
  ASSERT_TRUE(buffers.CopyToDevice(0, input, *in).ok());

  const CollectiveSpec spec = AllReduceSpec(DType::kI32, ReduceOp::kSum, count);
  auto buffer = buffers.FromDevice(0, spec, *in, input.size());
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  ASSERT_TRUE((*buffer)->Combine(Range{0, input.size()}, addend, false).ok());
  ASSERT_TRUE((*buffer)->CopyToDevice(*out).ok());
  buffer->reset();

  std::string result;
  ASSERT_TRUE(buffers.CopyFromDevice(0, *out, input.size(), &result).ok());
  std::string expected = input;
  HostReduceBuffer host(spec, &expected);
  ASSERT_TRUE(host.Combine(Range{0, input.size()}, addend, false).ok());
  EXPECT_TRUE(result == expected);
  std::string unchanged;
  ASSERT_TRUE(buffers.CopyFromDevice(0, *in, input.size(), &unchanged).ok());
  EXPECT_TRUE(unchanged == input);
  runtime_.FreeDevice(0, *in);
  runtime_.FreeDevice(0, *out);
}

// Calls `release` once `returned` is notified, or after a bound a call
// that does not block its host never needs (then `blocked` is set).
class ReleaseWhenReturned {
 public:
  explicit ReleaseWhenReturned(std::function<void()> release)
      : thread_([this, release = std::move(release)] {
          blocked_ =
              !returned_.WaitForNotificationWithTimeout(absl::Seconds(30));
          release();
        }) {}
  // Returns whether the call blocked until the bound.
  bool Returned() {
    returned_.Notify();
    thread_.join();
    return !blocked_;
  }

 private:
  absl::Notification returned_;
  bool blocked_ = false;
  std::thread thread_;
};

TEST_F(EmulatedDeviceBuffersTest,
       FromDeviceAndCopyToDevice_CallersStream_OrderedOnGpuHostNeverWaits) {
  DeviceBuffers buffers(&runtime_);
  const uint64_t count = 4096;
  const std::string input = Ints(3, count);
  const std::string addend = Ints(10, count);
  const CollectiveSpec spec = AllReduceSpec(DType::kI32, ReduceOp::kSum, count);
  absl::StatusOr<void*> in = runtime_.AllocDevice(0, input.size());
  absl::StatusOr<void*> out = runtime_.AllocDevice(0, input.size());
  absl::StatusOr<char*> staged = runtime_.AllocPinned(0, input.size());
  absl::StatusOr<DeviceRuntime::Stream> stream = runtime_.NewStream(0);
  absl::StatusOr<DeviceRuntime::Event> event = runtime_.NewEvent(0);
  ASSERT_TRUE(in.ok() && out.ok() && staged.ok() && stream.ok() && event.ok());
  std::memcpy(*staged, input.data(), input.size());
  // `out` as the caller's stream sees it, after the work enqueued so far.
  auto read_on_stream = [&]() -> std::string {
    EXPECT_TRUE(runtime_
                    .CopyAsync(0, *staged, *out, input.size(), *stream,
                               "reading the output")
                    .ok());
    EXPECT_TRUE(runtime_.Record(0, *event, *stream).ok());
    EXPECT_TRUE(runtime_.Wait(0, *event, "the caller's stream").ok());
    return std::string(*staged, input.size());
  };

  // The caller's stream is still busy writing the input when the buffer is
  // made: the buffer reads it afterwards, and the host does not wait.
  ReleaseWhenReturned writer(runtime_.Hold(*stream));
  ASSERT_TRUE(runtime_
                  .CopyAsync(0, *in, *staged, input.size(), *stream,
                             "writing the input")
                  .ok());
  auto buffer = buffers.FromDevice(0, spec, *in, input.size(), *stream);
  EXPECT_TRUE(writer.Returned()) << "FromDevice waited for the stream";
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  ASSERT_TRUE((*buffer)->Combine(Range{0, input.size()}, addend, false).ok());

  // The result's copy into `out` is held: CopyToDevice returns anyway, and
  // the caller's stream, not the host, waits for it.
  ReleaseWhenReturned result_copy(runtime_.HoldCopiesTo(*out));
  ASSERT_TRUE((*buffer)->CopyToDevice(*out, *stream).ok());
  EXPECT_TRUE(result_copy.Returned()) << "CopyToDevice waited for its copy";
  buffer->reset();
  EXPECT_EQ(runtime_.WaitsOn(*stream), 1);
  std::string expected = input;
  HostReduceBuffer host(spec, &expected);
  ASSERT_TRUE(host.Combine(Range{0, input.size()}, addend, false).ok());
  EXPECT_TRUE(read_on_stream() == expected);

  // Host bytes to the device, handed to the stream in the same way.
  const std::string again = Ints(-7, count);
  ReleaseWhenReturned host_copy(runtime_.HoldCopiesTo(*out));
  ASSERT_TRUE(buffers.CopyToDevice(0, again, *out, *stream).ok());
  EXPECT_TRUE(host_copy.Returned()) << "CopyToDevice waited for its copy";
  EXPECT_TRUE(read_on_stream() == again);

  runtime_.DeleteEvent(0, *event);
  runtime_.DeleteStream(0, *stream);
  runtime_.FreePinned(0, *staged);
  runtime_.FreeDevice(0, *in);
  runtime_.FreeDevice(0, *out);
}

TEST_F(EmulatedDeviceBuffersTest, PointerNotWhollyOnDevice_RefusedUnread) {
  DeviceBuffers buffers(&runtime_);
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
  // Memory of the device, but shorter than the call says, or another
  // device's.
  absl::StatusOr<void*> small = runtime_.AllocDevice(0, 64);
  ASSERT_TRUE(small.ok());
  const char* middle = static_cast<const char*>(*small) + 32;
  auto overlong = buffers.FromDevice(0, spec, middle, 48);
  EXPECT_EQ(overlong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(overlong.status().message()),
              HasSubstr("has 32 bytes of this GPU's memory behind it, not 48"));
  std::string out;
  EXPECT_EQ(buffers.CopyFromDevice(1, *small, 16, &out).code(),
            absl::StatusCode::kInvalidArgument);
  std::string into(64, 'x');
  EXPECT_EQ(buffers.CopyToDevice(0, into, const_cast<char*>(middle)).code(),
            absl::StatusCode::kInvalidArgument);
  // Nothing was spoiled: a whole range works.
  auto fresh = buffers.FromDevice(0, spec, middle, 16);
  EXPECT_TRUE(fresh.ok()) << fresh.status();
  fresh->reset();
  runtime_.FreeDevice(0, *small);
}

TEST_F(EmulatedDeviceBuffersTest, KernelFault_CallFailsDeviceStaysFaulted) {
  DeviceBuffers buffers(&runtime_);
  const uint64_t count = 4096;
  const CollectiveSpec spec = AllReduceSpec(DType::kI32, ReduceOp::kSum, count);
  auto buffer = buffers.FromHost(0, spec, Ints(1, count));
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  runtime_.FaultAtKernel(0, 2, "illegal address");
  const Range all{0, count * 4};
  // The kernels are enqueued; the fault shows when the host next waits.
  absl::Status status = (*buffer)->Combine(all, Ints(2, count), false);
  if (status.ok()) status = (*buffer)->Combine(all, Ints(3, count), false);
  if (status.ok()) status = (*buffer)->Read(all).status();
  ASSERT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_THAT(std::string(status.message()), StartsWith("Cuda(0): "));
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("device fault (emulated): illegal address"));
  // The buffer refuses further use; its staging set is not pooled.
  std::string result;
  EXPECT_EQ((*buffer)->CopyToHost(&result).code(),
            absl::StatusCode::kFailedPrecondition);
  buffer->reset();
  EXPECT_EQ(buffers.idle_sets(), 0);
  // The device is withdrawn: later calls get the device refusal quoting
  // the fault; the other device works.
  EXPECT_EQ(buffers.Withdrawn(0).code(), absl::StatusCode::kUnimplemented);
  const absl::Status refused =
      buffers.FromHost(0, spec, Ints(1, count)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(refused.message()),
              StartsWith("Distributed operations are not supported for device "
                         "Cuda(0): it faulted (Cuda(0): "));
  EXPECT_TRUE(buffers.Withdrawn(1).ok());
  auto other = buffers.FromHost(1, spec, Ints(1, count));
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_TRUE((*other)->CopyToHost(&result).ok());
  EXPECT_TRUE(result == Ints(1, count));
}

TEST_F(EmulatedDeviceBuffersTest, OutOfDeviceMemory_ResourceExhausted) {
  EmulatedDeviceRuntime small(1, uint64_t{1} << 20);
  DeviceBuffers buffers(&small);
  const uint64_t count = uint64_t{1} << 19;  // 2 MiB of i32
  auto buffer = buffers.FromHost(
      0, AllReduceSpec(DType::kI32, ReduceOp::kSum, count), Ints(0, count));
  ASSERT_FALSE(buffer.ok());
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(buffer.status().message()), StartsWith("Cuda(0): "));
  // A call that fits still runs.
  auto fits = buffers.FromHost(0, AllReduceSpec(DType::kI32, ReduceOp::kSum, 4),
                               Ints(0, 4));
  EXPECT_TRUE(fits.ok()) << fits.status();
}

TEST_F(EmulatedDeviceBuffersTest, MissingDevice_InvalidArgumentNamingIt) {
  DeviceBuffers buffers(&runtime_);
  auto buffer = buffers.FromHost(
      7, AllReduceSpec(DType::kF32, ReduceOp::kSum, 4), std::string(16, '\0'));
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(buffer.status().message()), StartsWith("Cuda(7): "));
}

TEST(EmulatedDeviceRuntimeTest, Stream_RunsInOrderAndEventsWaitForIt) {
  EmulatedDeviceRuntime runtime(1);
  absl::StatusOr<DeviceRuntime::Stream> stream = runtime.NewStream(0);
  absl::StatusOr<DeviceRuntime::Event> event = runtime.NewEvent(0);
  ASSERT_TRUE(stream.ok() && event.ok());
  // An event never recorded is complete.
  EXPECT_TRUE(runtime.Wait(0, *event, "nothing").ok());
  std::string a(1 << 20, 'a'), b(1 << 20, 'b'), c(1 << 20, 'c');
  // c <- b <- a, in order: c ends as a.
  ASSERT_TRUE(
      runtime.CopyAsync(0, b.data(), a.data(), b.size(), *stream, "1").ok());
  ASSERT_TRUE(
      runtime.CopyAsync(0, c.data(), b.data(), c.size(), *stream, "2").ok());
  ASSERT_TRUE(runtime.Record(0, *event, *stream).ok());
  ASSERT_TRUE(runtime.Wait(0, *event, "the copies").ok());
  EXPECT_TRUE(c == a);
  runtime.DeleteEvent(0, *event);
  runtime.DeleteStream(0, *stream);
}

}  // namespace
}  // namespace chorus
