// Collectives planned nccl between ranks on GPUs emulated in host memory
// (EmulatedDeviceRuntime and its EmulatedNcclRuntime): a real coordinator
// process with --nccl_plan plans them, and embedded worker runtimes relay
// the communicator's id over the data plane, connect, run and abort as they
// would on GPUs with NCCL.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "chorus/admin_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/worker/gpu/emulated_device_runtime.h"
#include "server/worker/gpu/emulated_nccl_runtime.h"
#include "tests/testing/collective_harness.h"
#include "tests/testing/wait.h"

namespace chorus::test {
namespace {

constexpr int kWorld = 4;

class EmulatedNcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<Device> devices = {JoinOptions::CpuDevice()};
    for (int i = 0; i < kWorld; ++i) devices.push_back(Gpu(i));
    auto cluster = EmbeddedCluster::Start(kWorld, {"--nccl_plan"},
                                          EmbeddedCluster::CallRoute::kCallPort,
                                          devices, &gpus_);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
  }

  // A group of kWorld ranks, rank r on runtime r and GPU r.
  std::vector<std::unique_ptr<Communicator>> JoinOnGpus(
      const std::string& name) {
    std::vector<int> workers;
    std::vector<Device> gpus;
    for (int r = 0; r < kWorld; ++r) {
      workers.push_back(r);
      gpus.push_back(Gpu(r));
    }
    auto group = cluster_->JoinGroup(name, workers, gpus);
    EXPECT_TRUE(group.ok()) << group.status();
    return group.ok() ? *std::move(group)
                      : std::vector<std::unique_ptr<Communicator>>();
  }

  EmulatedNcclRuntime& nccl() {
    return *static_cast<EmulatedNcclRuntime*>(gpus_.Nccl());
  }

  EmulatedDeviceRuntime gpus_{kWorld};
  std::unique_ptr<EmbeddedCluster> cluster_;
};

CheckOptions OnOwnGpus() {
  CheckOptions check;
  check.host_memory = false;
  check.nccl = true;
  return check;
}

TEST_F(EmulatedNcclTest, EveryNcclKind_RanksOnOwnGpus_NcclPlannedAndCorrect) {
  auto group = JoinOnGpus("nccl-kinds");
  ASSERT_EQ(group.size(), static_cast<size_t>(kWorld));
  uint64_t seed = 1;
  for (CollectiveKind kind :
       {CollectiveKind::kAllReduce, CollectiveKind::kReduce,
        CollectiveKind::kBroadcast, CollectiveKind::kAllGather,
        CollectiveKind::kReduceScatter}) {
    for (DType dtype : {DType::kF32, DType::kI64, DType::kF16}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAvg}) {
        if (!KindReduces(kind) && op != ReduceOp::kSum) continue;
        for (uint64_t count : {uint64_t{3}, uint64_t{1} << 16}) {
          CollectiveCase c;
          c.spec = Spec(kind, dtype, count,
                        KindReduces(kind) ? op : ReduceOp::kUnspecified,
                        /*root=*/2);
          c.seed = seed++;
          ASSERT_TRUE(RunAndCheck(Pointers(group), c, OnOwnGpus()));
        }
      }
    }
  }
  // One communicator per rank for the group's epoch, used by every call.
  EXPECT_EQ(nccl().starts(), kWorld);
  EXPECT_EQ(nccl().aborts(), 0);
}

TEST_F(EmulatedNcclTest, ListWorkers_WorkersWithNcclOnGpus_VersionListed) {
  std::unique_ptr<AdminClient> admin =
      AdminClient::Connect(cluster_->coordinator_address(), absl::Seconds(30));
  absl::StatusOr<std::vector<WorkerInfo>> workers = admin->ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), static_cast<size_t>(kWorld));
  for (const WorkerInfo& worker : *workers) {
    EXPECT_EQ(worker.nccl_version,
              static_cast<uint32_t>(EmulatedNcclRuntime::kVersion))
        << worker.name;
  }
}

TEST_F(EmulatedNcclTest, ForcedNccl_SmallCall_RunsOnNccl) {
  auto group = JoinOnGpus("nccl-forced");
  ASSERT_EQ(group.size(), static_cast<size_t>(kWorld));
  CollectiveCase c;
  c.spec = Spec(CollectiveKind::kAllReduce, DType::kF32, 5, ReduceOp::kSum);
  c.algorithm = Algorithm::kNccl;
  ASSERT_TRUE(RunAndCheck(Pointers(group), c, OnOwnGpus()));
  EXPECT_EQ(nccl().starts(), kWorld);
}

// What rank `rank` of kWorld expects of `kind` when rank r's input is
// element i = (r + 1) * (i % 7 + 1) (exact in f32), `count` per block.
std::vector<float> InPlaceExpected(CollectiveKind kind, int rank,
                                   uint64_t count) {
  auto value = [](int r, uint64_t i) { return (r + 1) * float(i % 7 + 1); };
  std::vector<float> out;
  const uint64_t n =
      kind == CollectiveKind::kAllGather ? kWorld * count : count;
  for (uint64_t i = 0; i < n; ++i) {
    float sum = 0;
    for (int r = 0; r < kWorld; ++r) sum += value(r, i);
    switch (kind) {
      case CollectiveKind::kAllReduce:
        out.push_back(sum);
        break;
      case CollectiveKind::kBroadcast:
        out.push_back(value(0, i));
        break;
      case CollectiveKind::kAllGather:
        out.push_back(value(static_cast<int>(i / count), i % count));
        break;
      default: {  // reduce_scatter: block `rank` of the sum
        const uint64_t at = rank * count + i;
        float block = 0;
        for (int r = 0; r < kWorld; ++r) block += value(r, at);
        out.push_back(block);
      }
    }
  }
  return out;
}

TEST_F(EmulatedNcclTest, RunOnDevice_InputIsOutput_EveryKindInPlace) {
  auto group = JoinOnGpus("nccl-in-place");
  ASSERT_EQ(group.size(), static_cast<size_t>(kWorld));
  const uint64_t count = 1 << 16;  // over what rides with the call
  for (CollectiveKind kind :
       {CollectiveKind::kAllReduce, CollectiveKind::kBroadcast,
        CollectiveKind::kAllGather, CollectiveKind::kReduceScatter}) {
    const CollectiveSpec spec =
        Spec(kind, DType::kF32, count,
             KindReduces(kind) ? ReduceOp::kSum : ReduceOp::kUnspecified, 0);
    RunOnRanks(kWorld, [&](int rank) {
      const uint64_t in = InputBytes(spec, kWorld, rank) / sizeof(float);
      const uint64_t out = OutputBytes(spec, kWorld, rank) / sizeof(float);
      absl::StatusOr<void*> buffer =
          gpus_.AllocDevice(rank, std::max(in, out) * sizeof(float));
      ASSERT_TRUE(buffer.ok()) << buffer.status();
      auto* data = static_cast<float*>(*buffer);
      for (uint64_t i = 0; i < in; ++i) data[i] = (rank + 1) * float(i % 7 + 1);
      CallOptions options;
      options.timeout = kCallTimeout;
      absl::StatusOr<CallResult> result = group[rank]->RunOnDevice(
          spec, DeviceTensor{Gpu(rank), data, in, DType::kF32},
          DeviceTensor{Gpu(rank), data, out, DType::kF32}, options);
      ASSERT_TRUE(result.ok()) << CollectiveKindName(kind) << " rank " << rank
                               << ": " << result.status();
      EXPECT_EQ(result->algorithm, Algorithm::kNccl);
      EXPECT_EQ(std::vector<float>(data, data + out),
                InPlaceExpected(kind, rank, count))
          << CollectiveKindName(kind) << " rank " << rank;
      gpus_.FreeDevice(rank, data);
    });
  }
}

TEST_F(EmulatedNcclTest, Run_CallsOnAnotherGpuThanJoined_NotNccl) {
  auto group = JoinOnGpus("nccl-moved");
  ASSERT_EQ(group.size(), static_cast<size_t>(kWorld));
  // Every call on Cuda(0): NCCL would get one GPU four times.
  CheckOptions check = OnOwnGpus();
  check.nccl = false;
  check.devices.assign(kWorld, Gpu(0));
  CollectiveCase c;
  c.spec =
      Spec(CollectiveKind::kAllReduce, DType::kF32, 1 << 18, ReduceOp::kSum);
  ASSERT_TRUE(RunAndCheck(Pointers(group), c, check));
  EXPECT_EQ(nccl().starts(), 0);
}

TEST_F(EmulatedNcclTest, AllReduce_OneGpuFaultsInNccl_EveryRankFailsAndAborts) {
  auto group = JoinOnGpus("nccl-fault");
  ASSERT_EQ(group.size(), static_cast<size_t>(kWorld));
  CollectiveCase warm;
  warm.spec =
      Spec(CollectiveKind::kAllReduce, DType::kF32, 1 << 16, ReduceOp::kSum);
  ASSERT_TRUE(RunAndCheck(Pointers(group), warm, OnOwnGpus()));
  // Rank 3's GPU faults at its next kernel: NCCL's all_reduce there never
  // joins the others, whose kernels wait for it until the group's abort.
  gpus_.FaultAtKernel(3, 1, "illegal memory access");
  std::vector<absl::Status> statuses(kWorld);
  RunOnRanks(kWorld, [&](int rank) {
    std::vector<float> data(1 << 16, 1.0f);
    std::vector<float> out;
    CallOptions options;
    options.timeout = absl::Seconds(60);
    statuses[rank] =
        group[rank]->AllReduce(data, &out, ReduceOp::kSum, options);
  });
  for (int rank = 0; rank < kWorld; ++rank) {
    EXPECT_FALSE(statuses[rank].ok()) << "rank " << rank;
    EXPECT_NE(statuses[rank].code(), absl::StatusCode::kDeadlineExceeded)
        << "rank " << rank << ": " << statuses[rank];
    EXPECT_THAT(std::string(statuses[rank].message()),
                ::testing::HasSubstr("illegal memory access"))
        << "rank " << rank;
  }
  // Every rank's communicator was aborted, so no kernel waits on.
  EXPECT_EQ(nccl().aborts(), kWorld);
}

TEST_F(EmulatedNcclTest,
       AllReduce_GpuFaultedBeforeConnecting_OthersStopConnectingAtVerdict) {
  auto group = JoinOnGpus("nccl-connect");
  ASSERT_EQ(group.size(), static_cast<size_t>(kWorld));
  // Rank 3's GPU is gone before the epoch's first nccl call: it cannot
  // start its communicator, and the others, waiting for it to connect,
  // stop at the group's verdict rather than at their deadline.
  gpus_.Fault(3, "device lost");
  const absl::Duration timeout = absl::Seconds(120);
  std::vector<absl::Status> statuses(kWorld);
  std::vector<absl::Duration> took(kWorld);
  RunOnRanks(kWorld, [&](int rank) {
    std::vector<float> data(1 << 16, 1.0f);
    std::vector<float> out;
    CallOptions options;
    options.timeout = timeout;
    const absl::Time start = absl::Now();
    statuses[rank] =
        group[rank]->AllReduce(data, &out, ReduceOp::kSum, options);
    took[rank] = absl::Now() - start;
  });
  for (int rank = 0; rank < kWorld; ++rank) {
    EXPECT_NE(statuses[rank].code(), absl::StatusCode::kOk) << rank;
    EXPECT_THAT(std::string(statuses[rank].message()),
                ::testing::HasSubstr("device lost"))
        << "rank " << rank;
    // Ended by the verdict: a wait for the deadline would take about the
    // whole timeout.
    EXPECT_LT(took[rank], timeout / 2) << "rank " << rank;
  }
  // Ranks 0-2 started communicators that never connected; each was aborted.
  EXPECT_EQ(nccl().starts(), kWorld - 1);
  EXPECT_EQ(nccl().aborts(), kWorld - 1);
}

TEST_F(EmulatedNcclTest, Leave_RanksLeaveAfterNcclCalls_TheirCommsFreed) {
  auto group = JoinOnGpus("nccl-leave");
  ASSERT_EQ(group.size(), static_cast<size_t>(kWorld));
  CollectiveCase c;
  c.spec =
      Spec(CollectiveKind::kAllReduce, DType::kF32, 1 << 16, ReduceOp::kSum);
  ASSERT_TRUE(RunAndCheck(Pointers(group), c, OnOwnGpus()));
  ASSERT_EQ(nccl().aborts(), 0);
  // A rank that leaves frees its communicator (and its GPU memory on a
  // GPU); the others keep theirs until they leave too.
  group[3].reset();
  EXPECT_TRUE(
      WaitUntil([&] { return nccl().aborts() == 1; }, absl::Seconds(30)))
      << nccl().aborts() << " aborted";
  for (int rank = 0; rank < 3; ++rank) group[rank].reset();
  EXPECT_TRUE(
      WaitUntil([&] { return nccl().aborts() == kWorld; }, absl::Seconds(30)))
      << nccl().aborts() << " of " << kWorld << " aborted";
}

}  // namespace
}  // namespace chorus::test
