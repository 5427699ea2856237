// Collectives of ranks on Cuda(0), on a machine with a GPU (skipped
// elsewhere): a real coordinator process with embedded worker runtimes that
// all share GPU 0, checked against the harness's reference exactly as the
// CPU path is (exact values: bit for bit where the math is exact).
//   - 2 and 4 ranks whose calls name Cuda(0): the ranks reduce on the GPU
//     under the ring and recursive doubling, every dtype and op;
//   - mixed groups: ranks 0 and 1 on the CPU, the others on Cuda(0);
//   - GPU memory by pointer through RunOnDevice (embedded), for a reducing
//     kind and for kinds that only move bytes;
//   - through real chorus-worker daemons, the ranks joined on Cuda(0);
//   - a pointer that is not memory of the GPU is refused, naming the
//     device, before the call takes a sequence number.

#include <cuda_runtime_api.h>

#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/worker/cuda_probe.h"
#include "server/worker/gpu/nccl_runtime.h"
#include "tests/testing/collective_harness.h"

namespace chorus::test {
namespace {

using ::testing::HasSubstr;

Device Gpu0() {
  Device d;
  d.kind = DeviceKind::kCuda;
  d.index = 0;
  return d;
}

#define SKIP_WITHOUT_GPU()                                         \
  do {                                                             \
    const CudaProbeResult probe = ProbeCuda();                     \
    if (probe.gpus.empty()) {                                      \
      GTEST_SKIP() << "no CUDA GPU: " << probe.unavailable_reason; \
    }                                                              \
  } while (0)

// Counts around the kernels' vector width and a large one.
const std::vector<uint64_t>& Counts() {
  static const auto* counts =
      new std::vector<uint64_t>{1, 15, 16, 17, 4095, uint64_t{1} << 20};
  return *counts;
}

// Runs every dtype x op x count in `counts` for all_reduce under the ring
// and recursive doubling (and the automatic plan), with `devices` per rank.
void RunAllReduceMatrix(const std::vector<Communicator*>& ranks,
                        const std::vector<std::optional<Device>>& devices,
                        const std::vector<uint64_t>& counts) {
  CheckOptions check;
  check.devices = devices;
  check.same_host = false;  // a rank on a GPU never uses shared memory
  uint64_t seed = 1;
  // Time per count (calls and their checks), printed for the GPU check's
  // log: a record, not an assertion.
  std::map<uint64_t, std::pair<int, absl::Duration>> spent;
  for (Algorithm plan : {Algorithm::kUnspecified, Algorithm::kRing,
                         Algorithm::kRecursiveDoubling}) {
    for (DType dtype : AllDTypes()) {
      for (ReduceOp op : AllReduceOps()) {
        for (uint64_t count : counts) {
          CollectiveCase c;
          c.spec = Spec(CollectiveKind::kAllReduce, dtype, count, op);
          c.algorithm = plan;
          c.seed = seed++;
          const absl::Time start = absl::Now();
          ASSERT_TRUE(RunAndCheck(ranks, c, check));
          spent[count].first++;
          spent[count].second += absl::Now() - start;
        }
      }
    }
  }
  for (const auto& [count, calls] : spent) {
    std::cout << "world " << ranks.size() << " count " << count << ": "
              << calls.first << " calls, "
              << absl::FormatDuration(calls.second / calls.first)
              << " per call with its check\n";
  }
}

class GpuCollectivesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    // Each runtime registers the CPU and GPU 0, as a worker daemon on a GPU
    // machine does by default.
    auto cluster =
        EmbeddedCluster::Start(4, {}, EmbeddedCluster::CallRoute::kCallPort,
                               {JoinOptions::CpuDevice(), Gpu0()});
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

  std::unique_ptr<EmbeddedCluster> cluster_;
};

TEST_F(GpuCollectivesTest, AllReduce_TwoRanksOnGpu0_MatchReference) {
  auto group = Join("gpu2", 2);
  ASSERT_EQ(group.size(), 2u);
  RunAllReduceMatrix(Pointers(group), {Gpu0(), Gpu0()}, Counts());
}

TEST_F(GpuCollectivesTest, AllReduce_FourRanksOnGpu0_MatchReference) {
  auto group = Join("gpu4", 4);
  ASSERT_EQ(group.size(), 4u);
  RunAllReduceMatrix(Pointers(group), {Gpu0(), Gpu0(), Gpu0(), Gpu0()},
                     Counts());
}

TEST_F(GpuCollectivesTest, AllReduce_MixedCpuAndGpu_MatchReference) {
  auto group = Join("mixed", 4);
  ASSERT_EQ(group.size(), 4u);
  RunAllReduceMatrix(Pointers(group),
                     {std::nullopt, std::nullopt, Gpu0(), Gpu0()},
                     {1, 17, 4095, uint64_t{1} << 20});
}

TEST_F(GpuCollectivesTest, ReduceAndReduceScatter_OnGpu0_MatchReference) {
  auto group = Join("rs", 4);
  ASSERT_EQ(group.size(), 4u);
  CheckOptions check;
  check.devices = {Gpu0(), std::nullopt, Gpu0(), Gpu0()};
  check.same_host = false;
  uint64_t seed = 500;
  for (CollectiveKind kind :
       {CollectiveKind::kReduce, CollectiveKind::kReduceScatter}) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kI64}) {
      for (uint64_t count : {uint64_t{17}, uint64_t{1} << 18}) {
        CollectiveCase c;
        c.spec = Spec(kind, dtype, count, ReduceOp::kSum, /*root=*/2);
        c.algorithm = Algorithm::kRing;
        c.seed = seed++;
        ASSERT_TRUE(RunAndCheck(Pointers(group), c, check));
      }
    }
  }
}

// Copies each rank's input to GPU memory, runs RunOnDevice on it and
// copies the output back for the harness to check.
absl::StatusOr<CallResult> RunInGpuMemory(int rank, Communicator& comm,
                                          const CollectiveSpec& spec,
                                          const std::string& input,
                                          std::string* output,
                                          const CallOptions& options) {
  const uint64_t element = DTypeSize(spec.dtype);
  const uint64_t out_bytes = OutputBytes(spec, comm.world_size(), comm.rank());
  void* in = nullptr;
  void* out = nullptr;
  if (!input.empty() && cudaMalloc(&in, input.size()) != cudaSuccess) {
    return absl::InternalError("cudaMalloc failed");
  }
  if (out_bytes > 0 && cudaMalloc(&out, out_bytes) != cudaSuccess) {
    return absl::InternalError("cudaMalloc failed");
  }
  // A copy from pageable memory may return before it reached the GPU: wait,
  // as RunOnDevice's contract asks.
  if (!input.empty() && (cudaMemcpy(in, input.data(), input.size(),
                                    cudaMemcpyHostToDevice) != cudaSuccess ||
                         cudaDeviceSynchronize() != cudaSuccess)) {
    return absl::InternalError("copying the input to the GPU failed");
  }
  DeviceTensor in_tensor;
  in_tensor.device = Gpu0();
  in_tensor.data = in;
  in_tensor.count = input.size() / element;
  in_tensor.dtype = spec.dtype;
  DeviceTensor out_tensor = in_tensor;
  out_tensor.data = out;
  out_tensor.count = out_bytes / element;
  CallOptions on_gpu = options;
  on_gpu.device.reset();
  absl::StatusOr<CallResult> result =
      comm.RunOnDevice(spec, in_tensor, out_tensor, on_gpu);
  output->assign(out_bytes, '\0');
  if (result.ok() && out_bytes > 0) {
    cudaMemcpy(output->data(), out, out_bytes, cudaMemcpyDeviceToHost);
  }
  cudaFree(in);
  cudaFree(out);
  (void)rank;
  return result;
}

TEST_F(GpuCollectivesTest, RunOnDevice_GpuMemory_MatchReference) {
  auto group = Join("pointers", 4);
  ASSERT_EQ(group.size(), 4u);
  CheckOptions check;
  check.run = RunInGpuMemory;
  check.same_host = false;
  uint64_t seed = 900;
  for (CollectiveKind kind :
       {CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter,
        CollectiveKind::kAllGather, CollectiveKind::kBroadcast}) {
    for (uint64_t count : {uint64_t{5}, uint64_t{1} << 19}) {
      CollectiveCase c;
      c.spec = Spec(kind, DType::kF32, count,
                    KindReduces(kind) ? ReduceOp::kSum : ReduceOp::kUnspecified,
                    /*root=*/1);
      c.seed = seed++;
      ASSERT_TRUE(RunAndCheck(Pointers(group), c, check));
    }
  }
}

TEST_F(GpuCollectivesTest, RunOnDevice_NotDeviceMemory_RefusedBeforeSequence) {
  auto group = Join("bad-pointer", 1);
  ASSERT_EQ(group.size(), 1u);
  std::vector<float> host(1 << 10, 1.0f);
  DeviceTensor bogus;
  bogus.device = Gpu0();
  bogus.data = host.data();  // host memory, not the GPU's
  bogus.count = host.size();
  bogus.dtype = DType::kF32;
  CallOptions options;
  options.algorithm = Algorithm::kRing;
  options.timeout = kCallTimeout;
  const CollectiveSpec spec = Spec(CollectiveKind::kAllReduce, DType::kF32,
                                   host.size(), ReduceOp::kSum);
  absl::StatusOr<CallResult> r =
      group[0]->RunOnDevice(spec, bogus, bogus, options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("Cuda(0): the input pointer 0x"));
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("is not memory of this GPU"));
  // Refused before it took a sequence number: the next call is #1.
  std::string out;
  absl::StatusOr<CallResult> next = group[0]->Run(
      spec, std::string(host.size() * sizeof(float), '\0'), &out, options);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->sequence, 1u);
}

TEST(GpuDaemonTest, AllReduce_ThroughDaemonsOnGpu0_MatchReference) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<Daemon> coordinator = StartCoordinator();
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  std::vector<Daemon> workers;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<Daemon> worker = StartWorker(
        coordinator->address, {absl::StrCat("--name=gpu-worker-", i)});
    ASSERT_TRUE(worker.ok()) << worker.status();
    workers.push_back(*std::move(worker));
  }
  std::vector<absl::StatusOr<std::unique_ptr<Communicator>>> joined;
  for (int r = 0; r < 2; ++r) joined.emplace_back(absl::UnknownError(""));
  RunOnRanks(2, [&](int r) {
    JoinOptions options;
    options.device = Gpu0();
    options.timeout = kCallTimeout;
    joined[r] = Communicator::JoinThroughDaemon(workers[r].address, "daemons",
                                                2, r, options);
  });
  std::vector<std::unique_ptr<Communicator>> ranks;
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(joined[r].ok()) << "rank " << r << ": " << joined[r].status();
    ranks.push_back(*std::move(joined[r]));
  }
  RunAllReduceMatrix(Pointers(ranks), {}, {17, uint64_t{1} << 20});
}

// One rank on GPU 0 with --nccl_plan: every kind NCCL runs goes through
// NCCL (the id made, a communicator connected and reused) and matches the
// reference. One GPU holds one rank of an NCCL communicator.
TEST(GpuNcclTest, EveryNcclKind_OneRankOnGpu0_MatchReference) {
  SKIP_WITHOUT_GPU();
  if (BuiltInNcclRuntime()->version() == 0) {
    GTEST_SKIP() << "built without NCCL";
  }
  auto cluster = EmbeddedCluster::Start(1, {"--nccl_plan"},
                                        EmbeddedCluster::CallRoute::kCallPort,
                                        {JoinOptions::CpuDevice(), Gpu0()});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto group = (*cluster)->JoinGroup("nccl", {0}, {Gpu0()});
  ASSERT_TRUE(group.ok()) << group.status();
  CheckOptions check;
  check.same_host = false;
  check.host_memory = false;
  check.nccl = true;
  uint64_t seed = 1;
  for (CollectiveKind kind :
       {CollectiveKind::kAllReduce, CollectiveKind::kReduce,
        CollectiveKind::kBroadcast, CollectiveKind::kAllGather,
        CollectiveKind::kReduceScatter}) {
    for (DType dtype : {DType::kF32, DType::kI64, DType::kBF16}) {
      for (uint64_t count : {uint64_t{17}, uint64_t{1} << 20}) {
        CollectiveCase c;
        c.spec =
            Spec(kind, dtype, count,
                 KindReduces(kind) ? ReduceOp::kMax : ReduceOp::kUnspecified);
        c.seed = seed++;
        ASSERT_TRUE(RunAndCheck(Pointers(*group), c, check));
      }
    }
  }
}

}  // namespace
}  // namespace chorus::test
