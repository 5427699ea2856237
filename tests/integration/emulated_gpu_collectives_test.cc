// Collectives of ranks on Cuda(n) GPUs emulated in host memory
// (EmulatedDeviceRuntime): the worker's whole device path (staging through
// pinned memory, streams and events, the pool, pointer checks, faults) runs
// on every machine, with a real coordinator process and embedded worker
// runtimes whose GPUs are the emulation's. The same cases run on a real GPU
// in tests/gpu/gpu_collectives_test.cc.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/worker/gpu/emulated_device_runtime.h"
#include "tests/testing/collective_harness.h"
#include "tests/testing/wait.h"

namespace chorus::test {
namespace {

using ::testing::HasSubstr;

class EmulatedGpuCollectivesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Every runtime registers the CPU and both GPUs, as a worker daemon on
    // a two-GPU machine does by default; they share the emulated GPUs as
    // processes share a machine's.
    auto cluster = EmbeddedCluster::Start(
        4, {}, EmbeddedCluster::CallRoute::kCallPort,
        {JoinOptions::CpuDevice(), Gpu(0), Gpu(1)}, &gpus_);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
  }

  std::vector<std::unique_ptr<Communicator>> Join(const std::string& name,
                                                  int world) {
    auto group = cluster_->JoinGroup(name, world);
    EXPECT_TRUE(group.ok()) << group.status();
    if (!group.ok()) return {};
    return *std::move(group);
  }

  // Runs one rank's call through RunOnDevice on memory of `device`: the
  // input copied there, the output copied back for the harness to check.
  absl::StatusOr<CallResult> RunInGpuMemory(const Device& device,
                                            Communicator& comm,
                                            const CollectiveSpec& spec,
                                            const std::string& input,
                                            std::string* output,
                                            const CallOptions& options) {
    const uint64_t element = DTypeSize(spec.dtype);
    const uint64_t out_bytes =
        OutputBytes(spec, comm.world_size(), comm.rank());
    absl::StatusOr<void*> in = gpus_.AllocDevice(device.index, input.size());
    absl::StatusOr<void*> out = gpus_.AllocDevice(device.index, out_bytes);
    if (!in.ok() || !out.ok()) return absl::InternalError("no device memory");
    std::memcpy(*in, input.data(), input.size());
    DeviceTensor in_tensor;
    in_tensor.device = device;
    in_tensor.data = *in;
    in_tensor.count = input.size() / element;
    in_tensor.dtype = spec.dtype;
    DeviceTensor out_tensor = in_tensor;
    out_tensor.data = *out;
    out_tensor.count = out_bytes / element;
    CallOptions on_gpu = options;
    on_gpu.device.reset();
    absl::StatusOr<CallResult> result =
        comm.RunOnDevice(spec, in_tensor, out_tensor, on_gpu);
    output->assign(static_cast<const char*>(*out), out_bytes);
    gpus_.FreeDevice(device.index, *in);
    gpus_.FreeDevice(device.index, *out);
    return result;
  }

  // Returns `bytes` bytes at `ptr` on `device` as `stream` sees them: read
  // by a copy enqueued there, after what the stream ran before.
  std::string ReadOnStream(int device, const void* ptr, uint64_t bytes,
                           DeviceRuntime::Stream stream) {
    absl::StatusOr<char*> host = gpus_.AllocPinned(device, bytes);
    absl::StatusOr<DeviceRuntime::Event> read = gpus_.NewEvent(device);
    EXPECT_TRUE(host.ok() && read.ok());
    if (!host.ok() || !read.ok()) return "";
    absl::Status done =
        gpus_.CopyAsync(device, *host, ptr, bytes, stream, "the output");
    if (done.ok()) done = gpus_.Record(device, *read, stream);
    if (done.ok()) done = gpus_.Wait(device, *read, "the output");
    EXPECT_TRUE(done.ok()) << done;
    std::string seen(*host, bytes);
    gpus_.DeleteEvent(device, *read);
    gpus_.FreePinned(device, *host);
    return seen;
  }

  EmulatedDeviceRuntime gpus_{2};
  std::unique_ptr<EmbeddedCluster> cluster_;
};

TEST_F(EmulatedGpuCollectivesTest, AllReduce_TwoRanksOnGpus_MatchReference) {
  auto group = Join("gpu2", 2);
  ASSERT_EQ(group.size(), 2u);
  CheckOptions check;
  check.devices = {Gpu(0), Gpu(1)};
  // One host, but a rank on a GPU never uses shared memory.
  check.host_memory = false;
  uint64_t seed = 1;
  for (Algorithm plan : {Algorithm::kUnspecified, Algorithm::kRing,
                         Algorithm::kRecursiveDoubling}) {
    for (DType dtype : AllDTypes()) {
      for (ReduceOp op : AllReduceOps()) {
        for (uint64_t count : {uint64_t{1}, uint64_t{17}, uint64_t{1} << 16}) {
          CollectiveCase c;
          c.spec = Spec(CollectiveKind::kAllReduce, dtype, count, op);
          c.algorithm = plan;
          c.seed = seed++;
          ASSERT_TRUE(RunAndCheck(Pointers(group), c, check));
        }
      }
    }
  }
}

TEST_F(EmulatedGpuCollectivesTest,
       EveryReducingKind_MixedCpuAndGpus_MatchReference) {
  auto group = Join("mixed", 4);
  ASSERT_EQ(group.size(), 4u);
  CheckOptions check;
  check.devices = {std::nullopt, Gpu(0), Gpu(1), Gpu(0)};
  check.host_memory = false;
  uint64_t seed = 500;
  for (CollectiveKind kind :
       {CollectiveKind::kAllReduce, CollectiveKind::kReduce,
        CollectiveKind::kReduceScatter}) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kI64}) {
      for (uint64_t count : {uint64_t{17}, uint64_t{1} << 17}) {
        CollectiveCase c;
        c.spec = Spec(kind, dtype, count, ReduceOp::kSum, /*root=*/2);
        c.algorithm = Algorithm::kRing;
        c.seed = seed++;
        ASSERT_TRUE(RunAndCheck(Pointers(group), c, check));
      }
    }
  }
}

TEST_F(EmulatedGpuCollectivesTest, RunOnDevice_GpuMemory_MatchReference) {
  auto group = Join("pointers", 4);
  ASSERT_EQ(group.size(), 4u);
  CheckOptions check;
  check.run = [this](int rank, Communicator& comm, const CollectiveSpec& spec,
                     const std::string& input, std::string* output,
                     const CallOptions& options) {
    return RunInGpuMemory(Gpu(rank % 2), comm, spec, input, output, options);
  };
  check.host_memory = false;
  uint64_t seed = 900;
  for (CollectiveKind kind :
       {CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter,
        CollectiveKind::kAllGather, CollectiveKind::kBroadcast}) {
    for (uint64_t count : {uint64_t{5}, uint64_t{1} << 17}) {
      CollectiveCase c;
      c.spec = Spec(kind, DType::kF32, count,
                    KindReduces(kind) ? ReduceOp::kSum : ReduceOp::kUnspecified,
                    /*root=*/1);
      c.seed = seed++;
      ASSERT_TRUE(RunAndCheck(Pointers(group), c, check));
    }
  }
}

TEST_F(EmulatedGpuCollectivesTest,
       RunOnDevice_RangeNotWhollyOnGpu_RefusedBeforeSequence) {
  auto group = Join("bad-range", 1);
  ASSERT_EQ(group.size(), 1u);
  const uint64_t count = 1 << 10;
  // Device memory for half the elements the call names.
  absl::StatusOr<void*> half = gpus_.AllocDevice(0, count * sizeof(float) / 2);
  ASSERT_TRUE(half.ok());
  std::vector<float> host(count, 1.0f);
  CallOptions options;
  options.algorithm = Algorithm::kRing;
  options.timeout = kCallTimeout;
  const CollectiveSpec spec =
      Spec(CollectiveKind::kAllReduce, DType::kF32, count, ReduceOp::kSum);
  for (void* bad : {static_cast<void*>(host.data()), *half}) {
    DeviceTensor tensor;
    tensor.device = Gpu(0);
    tensor.data = bad;
    tensor.count = count;
    tensor.dtype = DType::kF32;
    absl::StatusOr<CallResult> r =
        group[0]->RunOnDevice(spec, tensor, tensor, options);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()),
                HasSubstr("Cuda(0): the input pointer 0x"));
  }
  gpus_.FreeDevice(0, *half);
  // Refused before it took a sequence number: the next call is #1.
  std::string out;
  absl::StatusOr<CallResult> next = group[0]->Run(
      spec, std::string(count * sizeof(float), '\0'), &out, options);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->sequence, 1u);
}

TEST_F(EmulatedGpuCollectivesTest,
       RunOnDevice_InputStillBeingWritten_ReadAfterTheCallersStream) {
  auto group = Join("stream", 2);
  ASSERT_EQ(group.size(), 2u);
  const uint64_t count = 1 << 12;
  const uint64_t bytes = count * sizeof(float);
  std::vector<std::string> outputs(2);
  RunOnRanks(2, [&](int rank) {
    // The rank's input is written on its own stream, which is still busy
    // (held) when the call starts.
    absl::StatusOr<void*> in = gpus_.AllocDevice(rank, bytes);
    absl::StatusOr<void*> out = gpus_.AllocDevice(rank, bytes);
    absl::StatusOr<char*> written = gpus_.AllocPinned(rank, bytes);
    absl::StatusOr<DeviceRuntime::Stream> stream = gpus_.NewStream(rank);
    ASSERT_TRUE(in.ok() && out.ok() && written.ok() && stream.ok());
    std::vector<float> values(count, static_cast<float>(rank + 1));
    std::memcpy(*written, values.data(), bytes);
    std::function<void()> release = gpus_.Hold(*stream);
    ASSERT_TRUE(
        gpus_.CopyAsync(rank, *in, *written, bytes, *stream, "the input").ok());
    std::thread releaser([&] {
      // Once the call waits on the stream, the writer finishes.
      EXPECT_TRUE(WaitUntil([&] { return gpus_.RecordedOn(*stream) > 0; },
                            kCallTimeout));
      release();
    });
    DeviceTensor input;
    input.device = Gpu(rank);
    input.data = *in;
    input.count = count;
    input.dtype = DType::kF32;
    DeviceTensor output = input;
    output.data = *out;
    CallOptions options;
    options.algorithm = Algorithm::kRing;
    options.timeout = kCallTimeout;
    options.stream = *stream;
    absl::StatusOr<CallResult> result = group[rank]->RunOnDevice(
        Spec(CollectiveKind::kAllReduce, DType::kF32, count, ReduceOp::kSum),
        input, output, options);
    releaser.join();
    EXPECT_TRUE(result.ok()) << result.status();
    // The output is complete in the stream's order.
    outputs[rank] = ReadOnStream(rank, *out, bytes, *stream);
    gpus_.DeleteStream(rank, *stream);
    gpus_.FreePinned(rank, *written);
    gpus_.FreeDevice(rank, *in);
    gpus_.FreeDevice(rank, *out);
  });
  // Each rank's input as its stream wrote it: 1 + 2 everywhere.
  const std::vector<float> want(count, 3.0f);
  for (const std::string& out : outputs) {
    ASSERT_EQ(out.size(), count * sizeof(float));
    EXPECT_EQ(std::memcmp(out.data(), want.data(), out.size()), 0);
  }
}

TEST_F(EmulatedGpuCollectivesTest,
       RunOnDeviceAsync_CallersStreamsBusy_IssuedAtOnceResultInStreamOrder) {
  auto group = Join("async", 2);
  ASSERT_EQ(group.size(), 2u);
  const uint64_t count = 1 << 14;
  const uint64_t bytes = count * sizeof(float);
  struct RankMemory {
    void* in = nullptr;
    void* out = nullptr;
    char* written = nullptr;
    DeviceRuntime::Stream stream = nullptr;
  };
  std::vector<RankMemory> memory(2);
  std::vector<std::function<void()>> releases;
  std::vector<CollectiveHandle> handles;
  for (int rank = 0; rank < 2; ++rank) {
    RankMemory& m = memory[rank];
    absl::StatusOr<void*> in = gpus_.AllocDevice(rank, bytes);
    absl::StatusOr<void*> out = gpus_.AllocDevice(rank, bytes);
    absl::StatusOr<char*> written = gpus_.AllocPinned(rank, bytes);
    absl::StatusOr<DeviceRuntime::Stream> stream = gpus_.NewStream(rank);
    ASSERT_TRUE(in.ok() && out.ok() && written.ok() && stream.ok());
    m = {*in, *out, *written, *stream};
    std::vector<float> values(count, static_cast<float>(rank + 1));
    std::memcpy(m.written, values.data(), bytes);
    // Each rank's stream is still writing its input (held) when the call is
    // issued; both are issued from this one thread, so a call that waited
    // for its stream on the host would never let the second be issued.
    releases.push_back(gpus_.Hold(m.stream));
    ASSERT_TRUE(
        gpus_.CopyAsync(rank, m.in, m.written, bytes, m.stream, "the input")
            .ok());
    DeviceTensor input;
    input.device = Gpu(rank);
    input.data = m.in;
    input.count = count;
    input.dtype = DType::kF32;
    DeviceTensor output = input;
    output.data = m.out;
    CallOptions options;
    options.algorithm = Algorithm::kRing;
    options.timeout = kCallTimeout;
    options.stream = m.stream;
    handles.push_back(group[rank]->RunOnDeviceAsync(
        Spec(CollectiveKind::kAllReduce, DType::kF32, count, ReduceOp::kSum),
        input, output, options));
  }
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_FALSE(handles[rank].Ready()) << "rank " << rank;
    releases[rank]();
  }
  const std::vector<float> want(count, 3.0f);
  for (int rank = 0; rank < 2; ++rank) {
    absl::StatusOr<CallResult> result = handles[rank].Wait();
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->sequence, 1u);
    const std::string out =
        ReadOnStream(rank, memory[rank].out, bytes, memory[rank].stream);
    ASSERT_EQ(out.size(), bytes);
    EXPECT_EQ(std::memcmp(out.data(), want.data(), bytes), 0)
        << "rank " << rank;
    // The stream waited for the output on the GPU.
    EXPECT_EQ(gpus_.WaitsOn(memory[rank].stream), 1);
  }
  // A refusal is the handle's result, and takes no sequence number.
  DeviceTensor wrong;
  wrong.device = Gpu(0);
  wrong.data = memory[0].in;
  wrong.count = count - 1;
  wrong.dtype = DType::kF32;
  DeviceTensor output = wrong;
  output.count = count;
  absl::StatusOr<CallResult> refused =
      group[0]
          ->RunOnDeviceAsync(Spec(CollectiveKind::kAllReduce, DType::kF32,
                                  count, ReduceOp::kSum),
                             wrong, output)
          .Wait();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  for (int rank = 0; rank < 2; ++rank) {
    gpus_.DeleteStream(rank, memory[rank].stream);
    gpus_.FreePinned(rank, memory[rank].written);
    gpus_.FreeDevice(rank, memory[rank].in);
    gpus_.FreeDevice(rank, memory[rank].out);
  }
}

TEST_F(EmulatedGpuCollectivesTest,
       KernelFault_EveryRankAnsweredOtherGpuGoesOn) {
  auto group = Join("fault", 2);
  ASSERT_EQ(group.size(), 2u);
  gpus_.FaultAtKernel(1, 1, "an illegal memory access was encountered");
  const uint64_t count = 1 << 16;
  CallOptions options;
  options.algorithm = Algorithm::kRing;
  options.timeout = kCallTimeout;
  const CollectiveSpec spec =
      Spec(CollectiveKind::kAllReduce, DType::kF32, count, ReduceOp::kSum);
  std::vector<absl::Status> status(2);
  RunOnRanks(2, [&](int rank) {
    CallOptions on = options;
    on.device = Gpu(rank);
    std::string out;
    status[rank] =
        group[rank]->Run(spec, std::string(count * 4, '\1'), &out, on).status();
  });
  // Every rank gets the group's verdict: aborted, naming the rank whose GPU
  // faulted and quoting the fault.
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(status[rank].code(), absl::StatusCode::kAborted) << status[rank];
    EXPECT_THAT(std::string(status[rank].message()),
                HasSubstr("rank 1 failed collective #1"));
    EXPECT_THAT(std::string(status[rank].message()), HasSubstr("Cuda(1): "));
    EXPECT_THAT(std::string(status[rank].message()),
                HasSubstr("device fault (emulated)"));
  }
  // The worker whose rank ran on the faulted GPU withdrew it: a join on it
  // is refused with the device refusal quoting the fault.
  absl::StatusOr<Membership> again =
      cluster_->runtime(1)->Join("again", 1, 0, Gpu(1), kCallTimeout);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(again.status().message()),
              HasSubstr("Distributed operations are not supported for device "
                        "Cuda(1): it faulted ("));
  // The coordinator learns it with the worker's next heartbeat and no
  // longer lists the GPU for that worker.
  std::unique_ptr<v1::Coordinator::Stub> coordinator =
      NewCoordinatorStub(cluster_->coordinator_address());
  EXPECT_TRUE(WaitUntil(
      [&] {
        absl::StatusOr<std::vector<v1::WorkerInfo>> workers =
            ListWorkers(*coordinator);
        if (!workers.ok()) return false;
        for (const v1::WorkerInfo& worker : *workers) {
          if (worker.name() != "embedded-1") continue;
          return std::none_of(worker.devices().begin(), worker.devices().end(),
                              [](const v1::Device& d) {
                                return d.kind() == v1::DEVICE_KIND_CUDA &&
                                       d.index() == 1;
                              });
        }
        return false;
      },
      kCallTimeout));
  // Ranks on the healthy GPU go on in a group of their own.
  auto healthy = Join("healthy", 2);
  ASSERT_EQ(healthy.size(), 2u);
  CheckOptions check;
  check.devices = {Gpu(0), Gpu(0)};
  check.host_memory = false;
  CollectiveCase c;
  c.spec = spec;
  c.algorithm = Algorithm::kRing;
  ASSERT_TRUE(RunAndCheck(Pointers(healthy), c, check));
}

}  // namespace
}  // namespace chorus::test
