// What every rank gets when a collective cannot run: ranks that disagree on
// kind, dtype, count, op, root or a forced plan (INVALID_ARGUMENT with the
// per-rank account, on every rank); a rank whose call names a device without
// distributed support (UNIMPLEMENTED there, FAILED_PRECONDITION naming it
// everywhere else); a rank that never calls (DEADLINE_EXCEEDED naming it);
// a plan the kind cannot use; an input of the wrong size; a join refused for
// one rank's device (FAILED_PRECONDITION naming it on the other ranks). After
// each, the group still runs the next collective. A real coordinator process,
// worker runtimes embedded in the test, one thread per rank.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "common/collective_spec_proto.h"
#include "common/device_proto.h"
#include "common/grpc_status.h"
#include "common/net.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/collective_harness.h"

namespace chorus::test {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// One rank's part of a collective in these tests.
struct RankCall {
  CollectiveSpec spec;
  CallOptions options;
  // False: this rank does not call at all.
  bool calls = true;
};

struct Outcome {
  absl::StatusOr<CallResult> result = absl::UnknownError("not called");
  absl::Duration elapsed;
};

// Runs calls[r] on rank r, every rank on its own thread, and returns what
// each got. Inputs come from MakeInput for each rank's own spec.
std::vector<Outcome> RunCalls(const std::vector<Communicator*>& ranks,
                              const std::vector<RankCall>& calls) {
  const int world = static_cast<int>(ranks.size());
  std::vector<Outcome> outcomes(world);
  RunOnRanks(world, [&](int r) {
    if (!calls[r].calls) return;
    CollectiveCase c;
    c.spec = calls[r].spec;
    const std::string input = MakeInput(c, world, r);
    std::string output;
    const absl::Time start = absl::Now();
    outcomes[r].result =
        ranks[r]->Run(calls[r].spec, input, &output, calls[r].options);
    outcomes[r].elapsed = absl::Now() - start;
  });
  return outcomes;
}

RankCall Call(CollectiveSpec spec, Algorithm plan = Algorithm::kUnspecified) {
  RankCall call;
  call.spec = spec;
  call.options.algorithm = plan;
  call.options.timeout = kCallTimeout;
  return call;
}

// Every rank runs a correct all_reduce (and checks it): the group survived.
void ExpectGroupStillWorks(const std::vector<Communicator*>& ranks,
                           Algorithm plan = Algorithm::kUnspecified) {
  CollectiveCase c;
  c.spec = Spec(CollectiveKind::kAllReduce, DType::kI32, 33, ReduceOp::kSum);
  c.algorithm = plan;
  c.seed = 77;
  EXPECT_TRUE(RunAndCheck(ranks, c));
}

std::unique_ptr<EmbeddedCluster> StartCluster(int world) {
  absl::StatusOr<std::unique_ptr<EmbeddedCluster>> cluster =
      EmbeddedCluster::Start(world);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? *std::move(cluster) : nullptr;
}

const CollectiveSpec kF32Sum1024 =
    Spec(CollectiveKind::kAllReduce, DType::kF32, 1024, ReduceOp::kSum);

// ---------------------------------------------------------------------------
// Mismatches.

struct MismatchCase {
  std::string name;
  // What each rank calls; the group's world size is calls.size().
  std::vector<RankCall> calls;
  // The per-rank account the message must contain.
  std::string account;
};

class MismatchTest : public ::testing::TestWithParam<MismatchCase> {};

TEST_P(MismatchTest, Run_RanksDisagree_InvalidArgumentWithAccountOnEveryRank) {
  const MismatchCase& mismatch = GetParam();
  const int world = static_cast<int>(mismatch.calls.size());
  std::unique_ptr<EmbeddedCluster> cluster = StartCluster(world);
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("mm", world);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<Communicator*> ranks = Pointers(*group);

  const std::vector<Outcome> outcomes = RunCalls(ranks, mismatch.calls);
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    ASSERT_FALSE(outcomes[r].result.ok());
    const absl::Status& status = outcomes[r].result.status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("collective #1 of group mm does not match"));
    EXPECT_THAT(std::string(status.message()), HasSubstr(mismatch.account));
    // One verdict: every rank reads the same message.
    EXPECT_EQ(status, outcomes[0].result.status());
  }
  ExpectGroupStillWorks(ranks);
}

std::vector<MismatchCase> MismatchCases() {
  const CollectiveSpec all_gather =
      Spec(CollectiveKind::kAllGather, DType::kF32, 1024);
  const CollectiveSpec i32_sum =
      Spec(CollectiveKind::kAllReduce, DType::kI32, 1024, ReduceOp::kSum);
  const CollectiveSpec f32_sum_2048 =
      Spec(CollectiveKind::kAllReduce, DType::kF32, 2048, ReduceOp::kSum);
  const CollectiveSpec f32_max =
      Spec(CollectiveKind::kAllReduce, DType::kF32, 1024, ReduceOp::kMax);
  const CollectiveSpec broadcast_root0 = Spec(
      CollectiveKind::kBroadcast, DType::kI32, 7, ReduceOp::kUnspecified, 0);
  const CollectiveSpec broadcast_root1 = Spec(
      CollectiveKind::kBroadcast, DType::kI32, 7, ReduceOp::kUnspecified, 1);
  return {
      {"Kind",
       {Call(kF32Sum1024), Call(all_gather)},
       "rank 0: all_reduce f32[1024] sum; rank 1: all_gather f32[1024]"},
      {"Dtype",
       {Call(kF32Sum1024), Call(i32_sum)},
       "rank 0: all_reduce f32[1024] sum; rank 1: all_reduce i32[1024] sum"},
      {"Count",
       {Call(kF32Sum1024), Call(f32_sum_2048)},
       "rank 0: all_reduce f32[1024] sum; rank 1: all_reduce f32[2048] sum"},
      {"Op",
       {Call(kF32Sum1024), Call(f32_max)},
       "rank 0: all_reduce f32[1024] sum; rank 1: all_reduce f32[1024] max"},
      {"Root",
       {Call(broadcast_root0), Call(broadcast_root1)},
       "rank 0: broadcast i32[7] root 0; rank 1: broadcast i32[7] root 1"},
      // Forced plans: the data never moves, the match alone decides.
      {"CountUnderRing",
       {Call(kF32Sum1024, Algorithm::kRing),
        Call(f32_sum_2048, Algorithm::kRing)},
       "rank 0: all_reduce f32[1024] sum algorithm ring; "
       "rank 1: all_reduce f32[2048] sum algorithm ring"},
      {"Plan",
       {Call(kF32Sum1024, Algorithm::kRing), Call(kF32Sum1024)},
       "rank 0: all_reduce f32[1024] sum algorithm ring; "
       "rank 1: all_reduce f32[1024] sum"},
      // Identical entries fold into rank ranges.
      {"OneOfFour",
       {Call(kF32Sum1024), Call(kF32Sum1024), Call(kF32Sum1024),
        Call(f32_sum_2048)},
       "ranks 0-2: all_reduce f32[1024] sum; rank 3: all_reduce f32[2048] sum"},
      {"TwoOfFive",
       {Call(kF32Sum1024), Call(f32_max), Call(kF32Sum1024), Call(f32_max),
        Call(kF32Sum1024)},
       "ranks 0, 2, 4: all_reduce f32[1024] sum; "
       "ranks 1, 3: all_reduce f32[1024] max"},
  };
}

INSTANTIATE_TEST_SUITE_P(
    Fields, MismatchTest, ::testing::ValuesIn(MismatchCases()),
    [](const ::testing::TestParamInfo<MismatchCase>& info) {
      return info.param.name;
    });

// ---------------------------------------------------------------------------
// Devices without distributed support.

Device MakeDevice(DeviceKind kind, int index) {
  Device device;
  device.kind = kind;
  device.index = index;
  return device;
}

class RefusalTest : public ::testing::TestWithParam<Algorithm> {};

TEST_P(RefusalTest, Run_OneRankOnVulkan_UnimplementedThereOthersNameIt) {
  constexpr int kWorld = 3;
  std::unique_ptr<EmbeddedCluster> cluster = StartCluster(kWorld);
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("g", kWorld);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<Communicator*> ranks = Pointers(*group);

  std::vector<RankCall> calls(kWorld, Call(kF32Sum1024, GetParam()));
  calls[1].options.device = MakeDevice(DeviceKind::kVulkan, 0);
  // A rank that names its own (supported) device explicitly is fine.
  calls[2].options.device = JoinOptions::CpuDevice();
  const std::vector<Outcome> outcomes = RunCalls(ranks, calls);

  const absl::Status& refused = outcomes[1].result.status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnimplemented) << refused;
  EXPECT_THAT(
      std::string(refused.message()),
      StartsWith(
          "Distributed operations are not supported for device Vulkan(0)"));
  for (int r : {0, 2}) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const absl::Status& other = outcomes[r].result.status();
    EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition) << other;
    EXPECT_THAT(std::string(other.message()),
                HasSubstr("rank 1: Distributed operations are not supported "
                          "for device Vulkan(0)"));
    EXPECT_THAT(std::string(other.message()), HasSubstr("all_reduce #1"));
  }
  ExpectGroupStillWorks(ranks, GetParam());
}

TEST_P(RefusalTest, Run_TwoRanksRefused_EachOwnRefusalOthersNameBoth) {
  constexpr int kWorld = 4;
  std::unique_ptr<EmbeddedCluster> cluster = StartCluster(kWorld);
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("g", kWorld);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<Communicator*> ranks = Pointers(*group);

  std::vector<RankCall> calls(kWorld, Call(kF32Sum1024, GetParam()));
  calls[0].options.device = MakeDevice(DeviceKind::kWgpu, 0);
  calls[3].options.device = MakeDevice(DeviceKind::kMetal, 1);
  const std::vector<Outcome> outcomes = RunCalls(ranks, calls);

  EXPECT_EQ(outcomes[0].result.status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_THAT(
      std::string(outcomes[0].result.status().message()),
      StartsWith(
          "Distributed operations are not supported for device Wgpu(0)"));
  EXPECT_EQ(outcomes[3].result.status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_THAT(
      std::string(outcomes[3].result.status().message()),
      StartsWith(
          "Distributed operations are not supported for device Metal(1)"));
  for (int r : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const absl::Status& other = outcomes[r].result.status();
    EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition) << other;
    EXPECT_THAT(std::string(other.message()),
                HasSubstr("rank 0: Distributed operations are not supported "
                          "for device Wgpu(0)"));
    EXPECT_THAT(std::string(other.message()),
                HasSubstr("rank 3: Distributed operations are not supported "
                          "for device Metal(1)"));
  }
  ExpectGroupStillWorks(ranks, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Plans, RefusalTest,
                         ::testing::Values(Algorithm::kUnspecified,
                                           Algorithm::kRing),
                         [](const ::testing::TestParamInfo<Algorithm>& info) {
                           return info.param == Algorithm::kUnspecified
                                      ? std::string("auto")
                                      : std::string(AlgorithmName(info.param));
                         });

// ---------------------------------------------------------------------------
// Deadlines.

constexpr absl::Duration kShortTimeout = absl::Seconds(2);
// How much later than its timeout a call may answer (the coordinator answers
// a little before the deadline; a loaded machine may add some).
constexpr absl::Duration kLateMargin = absl::Seconds(2);

class DeadlineTest : public ::testing::TestWithParam<Algorithm> {};

TEST_P(DeadlineTest, Run_OneRankNeverCalls_OthersDeadlineExceededNamingIt) {
  constexpr int kWorld = 3;
  std::unique_ptr<EmbeddedCluster> cluster = StartCluster(kWorld);
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("g", kWorld);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<Communicator*> ranks = Pointers(*group);

  std::vector<RankCall> calls(kWorld, Call(kF32Sum1024, GetParam()));
  for (RankCall& call : calls) call.options.timeout = kShortTimeout;
  calls[2].calls = false;
  const std::vector<Outcome> outcomes = RunCalls(ranks, calls);

  for (int r : {0, 1}) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const absl::Status& status = outcomes[r].result.status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("rank 2 of group g did not reach all_reduce #1"));
    EXPECT_LE(outcomes[r].elapsed, kShortTimeout + kLateMargin);
    EXPECT_GE(outcomes[r].elapsed, kShortTimeout / 2);
  }

  // The late rank's #1 ended without it: it gets the same verdict at once
  // rather than waiting for ranks that moved on.
  CollectiveCase late;
  late.spec = kF32Sum1024;
  std::string output;
  CallOptions options;
  options.algorithm = GetParam();
  options.timeout = kShortTimeout;
  absl::StatusOr<CallResult> late_result =
      ranks[2]->Run(kF32Sum1024, MakeInput(late, kWorld, 2), &output, options);
  EXPECT_EQ(late_result.status().code(), absl::StatusCode::kDeadlineExceeded)
      << late_result.status();

  ExpectGroupStillWorks(ranks, GetParam());
}

TEST(DeadlineManyRanksTest,
     Run_TwoRanksNeverCall_OthersDeadlineExceededNamingBoth) {
  constexpr int kWorld = 4;
  std::unique_ptr<EmbeddedCluster> cluster = StartCluster(kWorld);
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("g", kWorld);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<Communicator*> ranks = Pointers(*group);

  const CollectiveSpec broadcast = Spec(CollectiveKind::kBroadcast, DType::kU8,
                                        5, ReduceOp::kUnspecified, 1);
  std::vector<RankCall> calls(kWorld, Call(broadcast));
  for (RankCall& call : calls) call.options.timeout = kShortTimeout;
  calls[1].calls = false;
  calls[3].calls = false;
  const std::vector<Outcome> outcomes = RunCalls(ranks, calls);
  for (int r : {0, 2}) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const absl::Status& status = outcomes[r].result.status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("ranks 1, 3 of group g did not reach broadcast #1"));
    EXPECT_LE(outcomes[r].elapsed, kShortTimeout + kLateMargin);
  }
}

INSTANTIATE_TEST_SUITE_P(Plans, DeadlineTest,
                         ::testing::Values(Algorithm::kUnspecified,
                                           Algorithm::kRing),
                         [](const ::testing::TestParamInfo<Algorithm>& info) {
                           return info.param == Algorithm::kUnspecified
                                      ? std::string("auto")
                                      : std::string(AlgorithmName(info.param));
                         });

// ---------------------------------------------------------------------------
// Calls refused before they are matched.

// More calls than the coordinator lets a rank run ahead of its oldest
// uncalled sequence (GroupTableOptions::sequence_window, 1024).
constexpr int kManyCalls = 1100;

// Every rank runs `calls` small all-reduces in a row, checking each; stops
// at a rank's first failure.
void ExpectManyCallsStillWork(const std::vector<Communicator*>& ranks,
                              int calls) {
  const int world = static_cast<int>(ranks.size());
  RunOnRanks(world, [&](int r) {
    for (int i = 0; i < calls; ++i) {
      std::vector<int32_t> output;
      CallOptions options;
      options.timeout = kCallTimeout;
      absl::Status status = ranks[r]->AllReduce(
          std::vector<int32_t>{r, i}, &output, ReduceOp::kMax, options);
      if (!status.ok() || output != std::vector<int32_t>{world - 1, i}) {
        ADD_FAILURE() << "rank " << r << ", call " << i + 1
                      << " after the refused one: " << status;
        return;
      }
    }
  });
}

// Sends rank `rank`'s next call (sequence 1) straight to the coordinator as
// a unary Collective, past the client's own checks, and returns the
// coordinator's verdict.
absl::Status CallCoordinator(const EmbeddedCluster& cluster,
                             const Communicator& rank, CollectiveKind kind,
                             Algorithm algorithm,
                             std::optional<Device> device = std::nullopt) {
  v1::CollectiveRequest request;
  request.set_group(rank.group());
  request.set_epoch(rank.epoch());
  request.set_rank(rank.rank());
  request.set_sequence(1);
  CollectiveSpec spec;
  spec.kind = kind;
  spec.dtype = DType::kF32;
  spec.count = 8;
  spec.op = ReduceOp::kSum;
  *request.mutable_spec() = SpecToProto(spec);
  request.set_algorithm(static_cast<v1::Algorithm>(algorithm));
  if (device.has_value()) *request.mutable_device() = DeviceToProto(*device);
  std::unique_ptr<v1::Coordinator::Stub> stub = v1::Coordinator::NewStub(
      MakeChannel(cluster.coordinator_address(), Role::kCoordinator));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
  v1::CollectiveResponse response;
  return FromGrpcStatus(stub->Collective(&context, request, &response));
}

// A call the coordinator refuses before matching it (a plan the kind cannot
// use, a malformed device) changes nothing: the sequence number it carried
// is still free, and the group's calls go on. The calls go to the
// coordinator directly, since the client library refuses them itself.
TEST(RefusedCallTest,
     Collective_RecursiveDoublingForAllGather_InvalidArgumentThenGroupWorks) {
  constexpr int kWorld = 2;
  std::unique_ptr<EmbeddedCluster> cluster = StartCluster(kWorld);
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("g", kWorld);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<Communicator*> ranks = Pointers(*group);

  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const absl::Status status =
        CallCoordinator(*cluster, *ranks[r], CollectiveKind::kAllGather,
                        Algorithm::kRecursiveDoubling);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("recursive_doubling is available for all_reduce "
                          "only, not all_gather"));
  }
  // The communicators' first call uses sequence 1, which must be free.
  ExpectGroupStillWorks(ranks);
}

// The same for a device of malformed shape (Cpu(1)).
TEST(RefusedCallTest,
     Collective_MalformedDevice_InvalidArgumentThenGroupWorks) {
  constexpr int kWorld = 2;
  std::unique_ptr<EmbeddedCluster> cluster = StartCluster(kWorld);
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("g", kWorld);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<Communicator*> ranks = Pointers(*group);

  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const absl::Status status = CallCoordinator(
        *cluster, *ranks[r], CollectiveKind::kAllReduce,
        Algorithm::kUnspecified, MakeDevice(DeviceKind::kCpu, 1));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("the CPU device has index 0, got 1"));
  }
  ExpectGroupStillWorks(ranks);
}

// A call the rank itself can refuse (here a plan the kind cannot use) is
// refused before it takes a sequence number, so it leaves no gap: more than
// sequence_window (1024) later calls still match.
TEST(RefusedCallTest, Run_RefusedCallThenManyMore_AllMatched) {
  constexpr int kWorld = 2;
  std::unique_ptr<EmbeddedCluster> cluster = StartCluster(kWorld);
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("g", kWorld);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<Communicator*> ranks = Pointers(*group);

  const std::vector<Outcome> outcomes = RunCalls(
      ranks, std::vector<RankCall>(
                 kWorld, Call(Spec(CollectiveKind::kAllGather, DType::kF32, 8),
                              Algorithm::kRecursiveDoubling)));
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(outcomes[r].result.status().code(),
              absl::StatusCode::kInvalidArgument)
        << outcomes[r].result.status();
  }
  ExpectManyCallsStillWork(ranks, kManyCalls);
}

TEST(RefusedCallTest, Run_InputOfWrongSize_InvalidArgumentThenOk) {
  constexpr int kWorld = 2;
  std::unique_ptr<EmbeddedCluster> cluster = StartCluster(kWorld);
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("g", kWorld);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<Communicator*> ranks = Pointers(*group);

  std::string output;
  absl::StatusOr<CallResult> result = ranks[0]->Run(
      kF32Sum1024, std::string(1000, '\0'), &output, Call(kF32Sum1024).options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument)
      << result.status();
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("rank 0 passed 1000 bytes for all_reduce f32[1024] "
                        "sum in a group of 2; expected 4096"));
  // Refused before it took a sequence number.
  ExpectGroupStillWorks(ranks);
  ExpectManyCallsStillWork(ranks, kManyCalls);
}

// ---------------------------------------------------------------------------
// A join refused for its device.

// Rank 1 joins on Vulkan(0): it gets the refusal, and ranks 0 and 2, which
// wait with a long deadline, get FAILED_PRECONDITION naming rank 1 and its
// device at once, not at their deadline.
TEST(JoinRefusalTest, Join_OneRankOnVulkan_OthersFailedPreconditionAtOnce) {
  constexpr int kWorld = 3;
  std::unique_ptr<EmbeddedCluster> cluster = StartCluster(kWorld);
  ASSERT_NE(cluster, nullptr);
  std::vector<absl::Status> statuses(kWorld);
  std::vector<absl::Duration> elapsed(kWorld);
  RunOnRanks(kWorld,
             [&](int r) {
               JoinOptions options;
               options.timeout = kCallTimeout;
               if (r == 1) {
                 // Usually after the others, so that they wait already; in
                 // either order every rank gets the same answer at once.
                 absl::SleepFor(absl::Milliseconds(300));
                 options.device = MakeDevice(DeviceKind::kVulkan, 0);
               }
               const absl::Time start = absl::Now();
               statuses[r] = Communicator::JoinEmbedded(cluster->worker(r), "g",
                                                        kWorld, r, options)
                                 .status();
               elapsed[r] = absl::Now() - start;
             },
             {0, 2, 1});
  EXPECT_EQ(statuses[1].code(), absl::StatusCode::kUnimplemented)
      << statuses[1];
  EXPECT_EQ(statuses[1].message(),
            "Distributed operations are not supported for device Vulkan(0)");
  for (int r : {0, 2}) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_EQ(statuses[r].code(), absl::StatusCode::kFailedPrecondition)
        << statuses[r];
    EXPECT_THAT(std::string(statuses[r].message()),
                StartsWith("rank 1 of group g was refused: Distributed "
                           "operations are not supported for device "
                           "Vulkan(0)"));
    // Answered with the refusal, far from the deadline.
    EXPECT_LT(elapsed[r], kCallTimeout / 4);
  }
  // The refusal changed nothing else: the same workers form another group.
  // (That rank 1 on its CPU clears the refusal of g is a unit test:
  // GroupTableTest.Join_UnsupportedDevice_UnimplementedExactMessage.)
  auto group = cluster->JoinGroup("g2", kWorld);
  ASSERT_TRUE(group.ok()) << group.status();
  ExpectGroupStillWorks(Pointers(*group));
}

}  // namespace
}  // namespace chorus::test
