// LocalCalls, the worker's local-call core, on a fake runtime: joins, the
// checks before a call takes its number, the ledger's numbering and
// retries, calls on a caller's memory, holds and shared regions. No sockets
// and no coordinator.
#include "server/worker/local/local_calls.h"

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_detail.h"
#include "gtest/gtest.h"
#include "server/worker/local/call_runtime.h"

namespace chorus {
namespace {

constexpr absl::Duration kWait = absl::Seconds(30);

// A runtime whose groups form at once and whose collectives are those of a
// world of one (all_reduce gives back its input), or fail as told.
class FakeRuntime final : public CallRuntime {
 public:
  const std::string& name() const override { return name_; }

  void JoinAsync(
      const JoinArgs& args, absl::Duration,
      std::function<void(absl::StatusOr<Membership>)> done) override {
    Membership m;
    m.group = args.group;
    m.world_size = args.world_size;
    m.rank = args.rank;
    m.device = args.device;
    m.devices.assign(args.world_size, args.device);
    m.min_world_size = args.min_world_size;
    m.max_world_size = args.max_world_size;
    absl::MutexLock lock(&mu_);
    m.epoch = ++epochs_;
    done(m);
  }

  absl::Status ReportRankGone(const Membership& membership,
                              const absl::Status& why, bool leaving) override {
    absl::MutexLock lock(&mu_);
    gone_.push_back(absl::StrCat(leaving ? "leaving: " : "", why.message()));
    return absl::AbortedError("group aborted");
  }

  absl::StatusOr<RunResult> Run(const Membership& membership, uint64_t sequence,
                                const CollectiveSpec& spec,
                                absl::string_view input, std::string* output,
                                const RunOptions& options) override {
    {
      absl::MutexLock lock(&mu_);
      ++runs_;
      if (!fail_.ok()) return fail_;
    }
    if (!options.output_place.empty()) {
      std::memcpy(options.output_place.data(), input.data(), input.size());
      output->clear();
    } else {
      output->assign(input.data(), input.size());
    }
    RunResult result;
    result.sequence = sequence;
    result.algorithm = Algorithm::kInline;
    return result;
  }

  void RunAsync(const Membership& membership, uint64_t sequence,
                const CollectiveSpec& spec, absl::string_view input,
                std::string* output, const RunOptions& options,
                std::function<void(absl::StatusOr<RunResult>)> done) override {
    done(Run(membership, sequence, spec, input, output, options));
  }

  bool SendsWithoutWaiting() override { return true; }

  absl::Status CheckDeviceMemory(const Membership&, const CollectiveSpec&,
                                 const Device&, const void* input,
                                 const void*) const override {
    return input == nullptr ? absl::InvalidArgumentError("null input")
                            : absl::OkStatus();
  }

  absl::StatusOr<RunResult> RunOnDevice(const Membership&, uint64_t sequence,
                                        const CollectiveSpec&, const void*,
                                        void*, const RunOptions&) override {
    absl::MutexLock lock(&mu_);
    ++device_runs_;
    // A device call that waits for its GPU, until released.
    mu_.AwaitWithTimeout(absl::Condition(&device_runs_free_), kWait);
    RunResult result;
    result.sequence = sequence;
    return result;
  }

  // Device runs wait until Release() from now.
  void HoldDeviceRuns() {
    absl::MutexLock lock(&mu_);
    device_runs_free_ = false;
  }
  void ReleaseDeviceRuns() {
    absl::MutexLock lock(&mu_);
    device_runs_free_ = true;
  }

  void Fail(absl::Status status) {
    absl::MutexLock lock(&mu_);
    fail_ = std::move(status);
  }
  int runs() {
    absl::MutexLock lock(&mu_);
    return runs_;
  }
  int device_runs() {
    absl::MutexLock lock(&mu_);
    return device_runs_;
  }
  // Waits until `count` ranks were reported gone; returns their reasons.
  std::vector<std::string> AwaitGone(size_t count) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return gone_.size() >= count;
    };
    mu_.AwaitWithTimeout(absl::Condition(&enough), kWait);
    return gone_;
  }

 private:
  const std::string name_ = "fake-worker";
  absl::Mutex mu_;
  uint64_t epochs_ ABSL_GUARDED_BY(mu_) = 0;
  bool device_runs_free_ ABSL_GUARDED_BY(mu_) = true;
  int runs_ ABSL_GUARDED_BY(mu_) = 0;
  int device_runs_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status fail_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> gone_ ABSL_GUARDED_BY(mu_);
};

// What a call's done got.
struct Ended {
  absl::Notification notification;
  std::optional<absl::StatusOr<RunResult>> result;
  KeepOutput keep;

  CallDone Done() {
    return [this](absl::StatusOr<RunResult> ran, KeepOutput k) {
      result = std::move(ran);
      keep = std::move(k);
      notification.Notify();
    };
  }
  absl::StatusOr<RunResult> Wait() {
    EXPECT_TRUE(notification.WaitForNotificationWithTimeout(kWait));
    return result.value_or(absl::UnknownError("never ended"));
  }
};

class LocalCallsTest : public ::testing::Test {
 protected:
  LocalCallsTest() : calls_(/*max_tensor_bytes=*/1 << 20) {}
  ~LocalCallsTest() override {
    calls_.BeginShutdown();
    calls_.Drain();
  }

  // Binds the fake and joins "g" as rank 0 of 1 (elastic with a minimum).
  void Join(int min_world_size = 0) {
    calls_.Bind(&runtime_);
    calls_.SetCallSocket("/run/calls");
    absl::Notification joined;
    JoinArgs args;
    args.group = "g";
    args.world_size = 1;
    args.min_world_size = min_world_size;
    calls_.Join(args, kWait, [&](absl::StatusOr<JoinedRank> rank) {
      ASSERT_TRUE(rank.ok()) << rank.status();
      EXPECT_EQ(rank->call_socket, "/run/calls");
      membership_ = rank->membership;
      joined.Notify();
    });
    joined.WaitForNotification();
  }

  // Call #sequence: all_reduce of `values` (u32, sum) in the message.
  v1::LocalCollectiveRequest SumOf(uint64_t sequence,
                                   const std::vector<uint32_t>& values) const {
    v1::LocalCollectiveRequest request = Bare(sequence, values.size());
    request.set_data(std::string(reinterpret_cast<const char*>(values.data()),
                                 values.size() * 4));
    return request;
  }
  v1::LocalCollectiveRequest Bare(uint64_t sequence, uint64_t count) const {
    v1::LocalCollectiveRequest request;
    request.set_group("g");
    request.set_rank(0);
    request.set_epoch(membership_.epoch);
    request.set_sequence(sequence);
    request.mutable_spec()->set_kind(v1::COLLECTIVE_KIND_ALL_REDUCE);
    request.mutable_spec()->set_dtype(v1::DTYPE_U32);
    request.mutable_spec()->set_count(count);
    request.mutable_spec()->set_op(v1::REDUCE_OP_SUM);
    return request;
  }

  // Runs `request` as WorkerLocal.Collective does, keeps its output for
  // retries as the door would, and returns its result and response.
  absl::StatusOr<RunResult> Run(const v1::LocalCollectiveRequest& request,
                                v1::LocalCollectiveResponse* response,
                                absl::Duration timeout = kWait) {
    Ended ended;
    calls_.Run(request, absl::Now() + timeout, response, ended.Done());
    absl::StatusOr<RunResult> result = ended.Wait();
    if (ended.keep) ended.keep(std::string(response->data()));
    return result;
  }

  FakeRuntime runtime_;
  LocalCalls calls_;
  Membership membership_;
};

TEST_F(LocalCallsTest, Run_BeforeBind_Unavailable) {
  v1::LocalCollectiveResponse response;
  EXPECT_EQ(Run(SumOf(1, {1}), &response).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(LocalCallsTest, Run_NotJoined_FailedPreconditionSaysJoinFirst) {
  calls_.Bind(&runtime_);
  v1::LocalCollectiveResponse response;
  const absl::Status status = Run(SumOf(1, {1}), &response).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("join first"), absl::string_view::npos);
}

TEST_F(LocalCallsTest, Run_StaleEpoch_FailedPreconditionNothingRuns) {
  Join();
  v1::LocalCollectiveRequest request = SumOf(1, {1});
  request.set_epoch(membership_.epoch + 1);
  v1::LocalCollectiveResponse response;
  EXPECT_EQ(Run(request, &response).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(runtime_.runs(), 0);
}

TEST_F(LocalCallsTest, Run_Sum_ResponseHasOutputSequenceAndPlan) {
  Join();
  v1::LocalCollectiveResponse response;
  absl::StatusOr<RunResult> ran = Run(SumOf(1, {7, 8}), &response);
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_EQ(response.sequence(), 1u);
  EXPECT_EQ(response.plan().algorithm(), v1::ALGORITHM_INLINE);
  EXPECT_EQ(response.data().size(), 8u);
}

TEST_F(LocalCallsTest, Run_RetryOfNumber_AnswersFirstOutcomeWithoutRunning) {
  Join();
  v1::LocalCollectiveResponse first;
  ASSERT_TRUE(Run(SumOf(1, {3}), &first).ok());
  v1::LocalCollectiveResponse again;
  ASSERT_TRUE(Run(SumOf(1, {3}), &again).ok());
  EXPECT_EQ(runtime_.runs(), 1);
  EXPECT_EQ(again.data(), first.data());
  // The same number for another call is refused.
  v1::LocalCollectiveResponse other;
  EXPECT_EQ(Run(SumOf(1, {3, 4}), &other).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(LocalCallsTest, Run_NumberSkipped_InvalidArgumentAtDeadline) {
  Join();
  v1::LocalCollectiveResponse response;
  const absl::Status status =
      Run(SumOf(2, {1}), &response, absl::Milliseconds(50)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runtime_.runs(), 0);
}

TEST_F(LocalCallsTest, Run_HigherNumberFirst_WaitsThenBothRun) {
  Join();
  // The request stays alive until the call ended, as Run() asks.
  const v1::LocalCollectiveRequest second_request = SumOf(2, {2});
  v1::LocalCollectiveResponse second_response;
  Ended second;
  calls_.Run(second_request, absl::Now() + kWait, &second_response,
             second.Done());
  v1::LocalCollectiveResponse first;
  ASSERT_TRUE(Run(SumOf(1, {1}), &first).ok());
  ASSERT_TRUE(second.Wait().ok());
  EXPECT_EQ(second_response.sequence(), 2u);
  EXPECT_EQ(runtime_.runs(), 2);
}

TEST_F(LocalCallsTest, Run_RuntimeFails_DetailSaysNumberUsed) {
  Join();
  runtime_.Fail(absl::AbortedError("peer lost"));
  v1::LocalCollectiveResponse response;
  const absl::Status status = Run(SumOf(1, {1}), &response).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  std::optional<v1::ErrorDetail> detail = ErrorDetailOf(status);
  ASSERT_TRUE(detail.has_value());
  EXPECT_TRUE(detail->number_used());
}

TEST_F(LocalCallsTest, Run_SharedHalfSet_InvalidArgumentNumberUnused) {
  Join();
  v1::LocalCollectiveRequest request = Bare(1, 1);
  request.mutable_shared_input()->set_region(1);
  v1::LocalCollectiveResponse response;
  EXPECT_EQ(Run(request, &response).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(Run(SumOf(1, {1}), &response).ok());
}

TEST_F(LocalCallsTest, RunInPlace_OutputTooSmall_InvalidArgumentNumberUnused) {
  Join();
  const std::vector<uint32_t> input = {1, 2, 3};
  std::vector<uint32_t> output(2);
  CallerMemory memory{
      absl::string_view(reinterpret_cast<const char*>(input.data()), 12),
      absl::Span<char>(reinterpret_cast<char*>(output.data()), 8)};
  EXPECT_EQ(calls_.RunInPlace(Bare(1, 3), absl::Now() + kWait, memory)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  output.resize(3);
  memory.output = absl::Span<char>(reinterpret_cast<char*>(output.data()), 12);
  ASSERT_TRUE(calls_.RunInPlace(Bare(1, 3), absl::Now() + kWait, memory).ok());
  EXPECT_EQ(output, input);
}

TEST_F(LocalCallsTest, RunHere_RetryOfNumber_RefusedNoCopyKept) {
  Join();
  const std::string input(4, '\x01');
  std::string output;
  ASSERT_TRUE(
      calls_.RunHere(Bare(1, 1), absl::Now() + kWait, input, &output).ok());
  EXPECT_EQ(output, input);
  const absl::Status retry =
      calls_.RunHere(Bare(1, 1), absl::Now() + kWait, input, &output).status();
  EXPECT_EQ(retry.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(retry.message().find("keeps no copy"), absl::string_view::npos);
  EXPECT_TRUE(output.empty());
}

TEST_F(LocalCallsTest, RunOnDevice_NullInput_RefusedBeforeItsNumber) {
  Join();
  int device_memory = 0;
  EXPECT_EQ(
      calls_
          .RunOnDevice(Bare(1, 1), absl::Now() + kWait, nullptr, &device_memory)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(calls_
                  .RunOnDevice(Bare(1, 1), absl::Now() + kWait, &device_memory,
                               &device_memory)
                  .ok());
  EXPECT_EQ(runtime_.device_runs(), 1);
}

TEST_F(LocalCallsTest, StartOnDevice_RunWaits_ReturnsAtOnceDoneAfter) {
  Join();
  int device_memory = 0;
  runtime_.HoldDeviceRuns();
  absl::Notification ended;
  absl::StatusOr<RunResult> result = absl::UnknownError("not ended");
  calls_.StartOnDevice(Bare(1, 1), absl::Now() + kWait, &device_memory,
                       &device_memory, /*stream=*/nullptr,
                       [&](absl::StatusOr<RunResult> r) {
                         result = std::move(r);
                         ended.Notify();
                       });
  // The caller's thread came back while the run waits for its GPU.
  EXPECT_FALSE(ended.HasBeenNotified());
  runtime_.ReleaseDeviceRuns();
  ASSERT_TRUE(ended.WaitForNotificationWithTimeout(kWait));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->sequence, 1u);
  EXPECT_EQ(runtime_.device_runs(), 1);
}

TEST_F(LocalCallsTest, StartOnDevice_NullInput_DoneAtOnceNumberKept) {
  Join();
  int device_memory = 0;
  absl::Status refused;
  calls_.StartOnDevice(
      Bare(1, 1), absl::Now() + kWait, nullptr, &device_memory, nullptr,
      [&](absl::StatusOr<RunResult> r) { refused = r.status(); });
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runtime_.device_runs(), 0);
  // Number 1 is still free.
  EXPECT_TRUE(calls_
                  .RunOnDevice(Bare(1, 1), absl::Now() + kWait, &device_memory,
                               &device_memory)
                  .ok());
}

TEST_F(LocalCallsTest, EndHold_ClientGone_ReportsRankAndForgetsIt) {
  Join();
  calls_.EndHold(membership_, /*released=*/false, "unix:client");
  std::vector<std::string> gone = runtime_.AwaitGone(1);
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_NE(gone[0].find("fake-worker from unix:client"), std::string::npos)
      << gone[0];
  EXPECT_EQ(calls_.FindMembership("g", membership_.epoch, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(LocalCallsTest, EndHold_ElasticReleased_ReportedLeaving) {
  Join(/*min_world_size=*/1);
  calls_.EndHold(membership_, /*released=*/true, "unix:client");
  std::vector<std::string> gone = runtime_.AwaitGone(1);
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0], "leaving: it left the group");
}

TEST_F(LocalCallsTest, EndHold_Released_ForgetsWithoutReport) {
  Join();
  calls_.EndHold(membership_, /*released=*/true, "unix:client");
  calls_.Drain();
  EXPECT_TRUE(runtime_.AwaitGone(0).empty());
  v1::LocalCollectiveResponse response;
  EXPECT_EQ(Run(SumOf(1, {1}), &response).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(LocalCallsTest, OpenRegion_SharedCall_ReadsAndWritesInPlace) {
  Join();
  EXPECT_EQ(calls_.OpenRegion("g", membership_.epoch, 1, 64).status().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<std::shared_ptr<SharedRegion>> region =
      calls_.OpenRegion("g", membership_.epoch, 0, 64);
  ASSERT_TRUE(region.ok()) << region.status();
  absl::Span<char> bytes = *(*region)->Range(0, 8, "test");
  const uint32_t value = 42;
  std::memcpy(bytes.data(), &value, 4);
  v1::LocalCollectiveRequest request = Bare(1, 1);
  request.mutable_shared_input()->set_region((*region)->id());
  request.mutable_shared_input()->set_bytes(4);
  request.mutable_shared_output()->set_region((*region)->id());
  request.mutable_shared_output()->set_offset(4);
  request.mutable_shared_output()->set_bytes(4);
  v1::LocalCollectiveResponse response;
  ASSERT_TRUE(Run(request, &response).ok());
  EXPECT_TRUE(response.data().empty());
  uint32_t out = 0;
  std::memcpy(&out, bytes.data() + 4, 4);
  EXPECT_EQ(out, 42u);
  EXPECT_TRUE(
      calls_.ReleaseRegion("g", membership_.epoch, 0, (*region)->id()).ok());
}

}  // namespace
}  // namespace chorus
