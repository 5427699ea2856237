// Collectives of a caller in the worker's own process on its own memory
// (the in-process door's RunInPlace and StartInPlace with CallerMemory, what
// a rank that embeds the runtime uses): a LocalWorker in this test process,
// registered with a real chorus-coordinator, joined through the local API's
// Unix socket. The output lands in the caller's buffer, the reply carries no
// data, a retry of the number is refused, a call started without waiting ends
// once, and a request with data, an output too small or a tensor over
// --max_tensor_bytes is refused without using the number.
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "chorus/v1/worker.grpc.pb.h"
#include "common/net.h"
#include "gtest/gtest.h"
#include "server/worker/local/call_frames.h"
#include "server/worker/local/local_worker.h"
#include "tests/testing/daemons.h"

namespace chorus::test {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(60);

class LocalApiInPlaceTest : public ::testing::Test {
 protected:
  // Starts the coordinator and, in this process, a runtime whose local API
  // takes tensors of at most `max_tensor_bytes`; joins `group_` (world 1).
  void Start(uint64_t max_tensor_bytes = kDefaultMaxTensorBytes) {
    absl::StatusOr<Daemon> coordinator = StartCoordinator();
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    LocalWorkerOptions options;
    options.max_tensor_bytes = max_tensor_bytes;
    options.runtime.coordinator = coordinator_.address;
    options.runtime.name = "in-place-w";
    options.runtime.unix_socket_path = NewScratchPath("local", ".sock");
    absl::StatusOr<std::unique_ptr<LocalWorker>> worker =
        LocalWorker::Start(options);
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = *std::move(worker);
    auto stub = v1::WorkerLocal::NewStub(
        grpc::CreateChannel("unix:" + options.runtime.unix_socket_path,
                            grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(DeadlineAfter(kTimeout));
    v1::LocalJoinRequest join;
    join.set_group(group_);
    join.set_world_size(1);
    join.set_rank(0);
    v1::LocalJoinResponse joined;
    const grpc::Status status = stub->JoinGroup(&context, join, &joined);
    ASSERT_TRUE(status.ok()) << status.error_message();
    epoch_ = joined.epoch();
  }

  void TearDown() override {
    if (worker_ != nullptr) worker_->Shutdown();
  }

  // Call #sequence: all_reduce, u32[count], sum, with no data.
  v1::LocalCollectiveRequest SumOfU32(uint64_t sequence, uint64_t count) const {
    v1::LocalCollectiveRequest call;
    call.set_group(group_);
    call.set_rank(0);
    call.set_epoch(epoch_);
    call.set_sequence(sequence);
    v1::CollectiveSpec& spec = *call.mutable_spec();
    spec.set_kind(v1::COLLECTIVE_KIND_ALL_REDUCE);
    spec.set_dtype(v1::DTYPE_U32);
    spec.set_count(count);
    spec.set_op(v1::REDUCE_OP_SUM);
    return call;
  }

  // Runs `call` on `memory` on this thread (RunInPlace), or with none as a
  // frame whose data travels in the messages; returns its reply once it
  // came.
  v1::LocalCallReply Run(v1::LocalCollectiveRequest call,
                         const CallerMemory* memory) {
    if (memory != nullptr) {
      absl::StatusOr<RunResult> ran =
          worker_->door()->RunInPlace(call, absl::Now() + kTimeout, *memory);
      v1::LocalCallReply reply = LocalCallReplyFor(++call_id_, ran.status());
      if (ran.ok()) reply.mutable_response()->set_sequence(ran->sequence);
      return reply;
    }
    v1::LocalCallFrame frame;
    frame.set_call_id(++call_id_);
    frame.set_timeout_us(absl::ToInt64Microseconds(kTimeout));
    *frame.mutable_call() = std::move(call);
    absl::Mutex mu;
    std::optional<v1::LocalCallReply> reply;
    worker_->door()->RunFrame(std::move(frame),
                              [&](v1::LocalCallReply& answer) {
                                absl::MutexLock lock(&mu);
                                reply = answer;
                              });
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](std::optional<v1::LocalCallReply>* r) { return r->has_value(); },
        &reply));
    return *reply;
  }

  const std::string group_ = "in-place";
  Daemon coordinator_;
  std::unique_ptr<LocalWorker> worker_;
  uint64_t epoch_ = 0;
  uint64_t call_id_ = 0;
};

absl::string_view BytesOf(const std::vector<uint32_t>& values) {
  return absl::string_view(reinterpret_cast<const char*>(values.data()),
                           values.size() * sizeof(uint32_t));
}

absl::Span<char> PlaceOf(std::vector<uint32_t>& values) {
  return absl::Span<char>(reinterpret_cast<char*>(values.data()),
                          values.size() * sizeof(uint32_t));
}

TEST_F(LocalApiInPlaceTest, RunInPlace_Sum_WritesCallerOutputRefusesRetry) {
  ASSERT_NO_FATAL_FAILURE(Start());
  // 100,000 elements (400 KB).
  std::vector<uint32_t> values(100000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = i * 3;
  std::vector<uint32_t> result(values.size());
  const CallerMemory memory{BytesOf(values), PlaceOf(result)};
  v1::LocalCallReply reply = Run(SumOfU32(1, values.size()), &memory);
  ASSERT_EQ(reply.code(), 0) << reply.message();
  EXPECT_TRUE(reply.response().data().empty());
  EXPECT_EQ(reply.response().sequence(), 1u);
  EXPECT_EQ(result, values);  // world 1: the sum is the input

  // A small one into a separate output (an inline plan).
  const std::vector<uint32_t> input = {7, 8};
  std::vector<uint32_t> output = {0, 0, 99};
  const CallerMemory two{BytesOf(input), PlaceOf(output)};
  reply = Run(SumOfU32(2, 2), &two);
  ASSERT_EQ(reply.code(), 0) << reply.message();
  EXPECT_EQ(output, (std::vector<uint32_t>{7, 8, 99}));

  // Its retry: refused, as no copy of the output was kept.
  reply = Run(SumOfU32(2, 2), &two);
  EXPECT_EQ(reply.code(),
            static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_NE(reply.message().find("keeps no copy"), std::string::npos)
      << reply.message();

  // The next number through a message still runs.
  v1::LocalCollectiveRequest third = SumOfU32(3, 2);
  third.set_data(std::string(BytesOf(input)));
  reply = Run(third, nullptr);
  ASSERT_EQ(reply.code(), 0) << reply.message();
  EXPECT_EQ(reply.response().data(), std::string(BytesOf(input)));
}

TEST_F(LocalApiInPlaceTest, RunInPlace_BadRequest_RefusedNumberUnused) {
  ASSERT_NO_FATAL_FAILURE(Start(/*max_tensor_bytes=*/64));
  const std::vector<uint32_t> input = {1, 2, 3};
  std::vector<uint32_t> output = {5, 5, 5};
  const int invalid = static_cast<int>(absl::StatusCode::kInvalidArgument);

  // Data in the request as well.
  v1::LocalCollectiveRequest with_data = SumOfU32(1, 3);
  with_data.set_data(std::string(BytesOf(input)));
  const CallerMemory memory{BytesOf(input), PlaceOf(output)};
  v1::LocalCallReply reply = Run(with_data, &memory);
  EXPECT_EQ(reply.code(), invalid);
  EXPECT_NE(reply.message().find("no data"), std::string::npos)
      << reply.message();

  // An output too small for the call.
  const CallerMemory small{BytesOf(input),
                           absl::Span<char>(PlaceOf(output)).subspan(0, 8)};
  reply = Run(SumOfU32(1, 3), &small);
  EXPECT_EQ(reply.code(), invalid);
  EXPECT_NE(reply.message().find("room for 8"), std::string::npos)
      << reply.message();

  // An input that does not match the count.
  const CallerMemory short_input{BytesOf(input).substr(0, 8), PlaceOf(output)};
  reply = Run(SumOfU32(1, 3), &short_input);
  EXPECT_EQ(reply.code(), invalid) << reply.message();

  // Over --max_tensor_bytes (64 here).
  std::vector<uint32_t> large(17, 1);
  const CallerMemory too_large{BytesOf(large), PlaceOf(large)};
  reply = Run(SumOfU32(1, large.size()), &too_large);
  EXPECT_EQ(reply.code(),
            static_cast<int>(absl::StatusCode::kResourceExhausted))
      << reply.message();
  EXPECT_EQ(output, (std::vector<uint32_t>{5, 5, 5}));

  // None of them used #1.
  reply = Run(SumOfU32(1, 3), &memory);
  ASSERT_EQ(reply.code(), 0) << reply.message();
  EXPECT_EQ(output, input);
}

// What StartInPlace()'s done got, and how often it ran.
struct Ended {
  absl::Mutex mu;
  int runs ABSL_GUARDED_BY(mu) = 0;
  absl::StatusOr<RunResult> result ABSL_GUARDED_BY(mu) =
      absl::UnknownError("not ended");

  InPlaceDone Done() {
    return [this](absl::StatusOr<RunResult> ran) {
      absl::MutexLock lock(&mu);
      ++runs;
      result = std::move(ran);
    };
  }
  // Waits for the first run and returns its result.
  absl::StatusOr<RunResult> Wait() {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](int* runs) { return *runs > 0; }, &runs));
    return result;
  }
};

TEST_F(LocalApiInPlaceTest, StartInPlace_Sum_EndsOnceWithOutputInPlace) {
  ASSERT_NO_FATAL_FAILURE(Start());
  std::vector<uint32_t> values(100000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = i * 5;
  std::vector<uint32_t> result(values.size());
  const CallerMemory memory{BytesOf(values), PlaceOf(result)};

  // An output too small: refused at once, the number left unused.
  Ended refused;
  const CallerMemory small{BytesOf(values),
                           absl::Span<char>(PlaceOf(result)).subspan(0, 8)};
  worker_->door()->StartInPlace(SumOfU32(1, values.size()),
                                absl::Now() + kTimeout, small, refused.Done());
  EXPECT_EQ(refused.Wait().status().code(), absl::StatusCode::kInvalidArgument);

  Ended ended;
  worker_->door()->StartInPlace(SumOfU32(1, values.size()),
                                absl::Now() + kTimeout, memory, ended.Done());
  absl::StatusOr<RunResult> ran = ended.Wait();
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_EQ(ran->sequence, 1u);
  EXPECT_EQ(result, values);  // world 1: the sum is the input
  absl::MutexLock lock(&ended.mu);
  EXPECT_EQ(ended.runs, 1);
}

}  // namespace
}  // namespace chorus::test
