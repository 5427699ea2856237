// Communicator::RunOnDevice on machines with or without a GPU: Cpu tensors
// on both paths, and every refusal (devices that differ, wrong dtype or
// count, GPU memory through a daemon, a GPU the worker does not have) comes
// before the call takes a sequence number, so the next call still matches.
// The GPU side of RunOnDevice is in tests/gpu/gpu_collectives_test.cc.

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/collective_harness.h"

namespace chorus::test {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

Device Cuda(int index) {
  Device d;
  d.kind = DeviceKind::kCuda;
  d.index = index;
  return d;
}

std::string Message(const absl::StatusOr<CallResult>& r) {
  return std::string(r.status().message());
}

DeviceTensor Host(std::vector<float>& values) {
  DeviceTensor t;
  t.data = values.data();
  t.count = values.size();
  t.dtype = DType::kF32;
  return t;
}

CollectiveSpec SumOf(uint64_t count) {
  return Spec(CollectiveKind::kAllReduce, DType::kF32, count, ReduceOp::kSum);
}

// Every rank runs an all_reduce sum of 5 floats through RunOnDevice on
// Cpu tensors; rank r contributes r + i at element i.
void ExpectCpuTensorSum(const std::vector<Communicator*>& ranks) {
  const int world = static_cast<int>(ranks.size());
  std::vector<std::vector<float>> in(world), out(world);
  std::vector<absl::StatusOr<CallResult>> results(
      world, absl::UnknownError("not run"));
  RunOnRanks(world, [&](int r) {
    in[r] = {0, 1, 2, 3, 4};
    for (float& v : in[r]) v += r;
    out[r].assign(5, -1);
    CallOptions options;
    options.timeout = kCallTimeout;
    results[r] =
        ranks[r]->RunOnDevice(SumOf(5), Host(in[r]), Host(out[r]), options);
  });
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(out[r][i], world * i + world * (world - 1) / 2.0f)
          << "rank " << r << " element " << i;
    }
  }
}

// Runs a plain all_reduce on every rank and checks that all ran the same
// sequence number: nothing refused earlier took one.
void ExpectSequencesAligned(const std::vector<Communicator*>& ranks) {
  CollectiveCase c;
  c.spec = SumOf(3);
  ASSERT_TRUE(RunAndCheck(ranks, c));
}

TEST(DeviceTensorTest, RunOnDevice_CpuTensorsEmbedded_Reduces) {
  auto cluster = EmbeddedCluster::Start(2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto group = (*cluster)->JoinGroup("cpu-tensors", 2);
  ASSERT_TRUE(group.ok()) << group.status();
  ExpectCpuTensorSum(Pointers(*group));
}

TEST(DeviceTensorTest, RunOnDevice_BadTensors_RefusedWithoutTakingSequence) {
  auto cluster = EmbeddedCluster::Start(2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto group = (*cluster)->JoinGroup("bad-tensors", 2);
  ASSERT_TRUE(group.ok()) << group.status();
  Communicator& rank0 = *(*group)[0];
  std::vector<float> four(4), five(5);

  DeviceTensor on_gpu = Host(four);
  on_gpu.device = Cuda(0);
  absl::StatusOr<CallResult> r =
      rank0.RunOnDevice(SumOf(4), Host(four), on_gpu);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(r), HasSubstr("the output on Cuda(0)"));

  DeviceTensor ints = Host(four);
  ints.dtype = DType::kI32;
  r = rank0.RunOnDevice(SumOf(4), ints, ints);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(r), HasSubstr("i32"));

  r = rank0.RunOnDevice(SumOf(4), Host(five), Host(four));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(r), HasSubstr("tensors of 5 and 4 elements"));

  CallOptions other_device;
  other_device.device = Cuda(0);
  r = rank0.RunOnDevice(SumOf(4), Host(four), Host(four), other_device);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(r), HasSubstr("the call names Cuda(0)"));

  // No worker here has a 100th GPU.
  DeviceTensor missing = Host(four);
  missing.device = Cuda(99);
  r = rank0.RunOnDevice(SumOf(4), missing, missing);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(Message(r),
              StartsWith("Distributed operations are not supported for "
                         "device Cuda(99): this worker did not register it"));

  ExpectSequencesAligned(Pointers(*group));
}

// As with host buffers, an off-root rank of broadcast may pass no input or
// a full-size one, which the call ignores (the GPU test's matrix passes both).
TEST(DeviceTensorTest, RunOnDevice_OffRootFullSizeInput_Ignored) {
  auto cluster = EmbeddedCluster::Start(3);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto group = (*cluster)->JoinGroup("off-root", 3);
  ASSERT_TRUE(group.ok()) << group.status();
  const CollectiveSpec spec = Spec(CollectiveKind::kBroadcast, DType::kF32, 4,
                                   ReduceOp::kUnspecified, /*root=*/1);
  std::vector<std::vector<float>> in = {{}, {1, 2, 3, 4}, {9, 9, 9, 9}};
  std::vector<std::vector<float>> out(3, std::vector<float>(4, -1));
  std::vector<absl::StatusOr<CallResult>> results(
      3, absl::UnknownError("not run"));
  RunOnRanks(3, [&](int r) {
    CallOptions options;
    options.timeout = kCallTimeout;
    results[r] =
        (*group)[r]->RunOnDevice(spec, Host(in[r]), Host(out[r]), options);
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    EXPECT_EQ(out[r], (std::vector<float>{1, 2, 3, 4})) << "rank " << r;
  }
  // A size that is neither is refused, before it takes a number.
  std::vector<float> three(3);
  absl::StatusOr<CallResult> r =
      (*group)[2]->RunOnDevice(spec, Host(three), Host(out[2]));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(r),
              HasSubstr("takes 0 (or a full-size one) and gives 4"));
  ExpectSequencesAligned(Pointers(*group));
}

class DeviceTensorDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<Daemon> coordinator = StartCoordinator();
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    for (int i = 0; i < 2; ++i) {
      absl::StatusOr<Daemon> worker = StartWorker(
          coordinator_.address, {absl::StrCat("--name=tensor-", i)});
      ASSERT_TRUE(worker.ok()) << worker.status();
      workers_.push_back(*std::move(worker));
    }
    std::vector<absl::StatusOr<std::unique_ptr<Communicator>>> joined;
    for (int r = 0; r < 2; ++r) joined.emplace_back(absl::UnknownError(""));
    RunOnRanks(2, [&](int r) {
      JoinOptions options;
      options.timeout = kCallTimeout;
      joined[r] = Communicator::JoinThroughDaemon(workers_[r].address, "d", 2,
                                                  r, options);
    });
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(joined[r].ok()) << "rank " << r << ": " << joined[r].status();
      ranks_.push_back(*std::move(joined[r]));
    }
  }

  Daemon coordinator_;
  std::vector<Daemon> workers_;
  std::vector<std::unique_ptr<Communicator>> ranks_;
};

TEST_F(DeviceTensorDaemonTest, RunOnDevice_CpuTensors_Reduces) {
  ExpectCpuTensorSum(Pointers(ranks_));
}

TEST_F(DeviceTensorDaemonTest,
       RunOnDevice_CudaTensors_FailedPreconditionAndSequenceKept) {
  std::vector<float> values(4);
  DeviceTensor gpu = Host(values);
  gpu.device = Cuda(0);
  absl::StatusOr<CallResult> r = ranks_[0]->RunOnDevice(SumOf(4), gpu, gpu);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(r),
              HasSubstr("a worker daemon cannot reach this process's memory "
                        "on Cuda(0)"));
  ExpectSequencesAligned(Pointers(ranks_));
}

}  // namespace
}  // namespace chorus::test
