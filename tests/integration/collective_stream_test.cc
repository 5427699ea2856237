// Collective calls carried on Coordinator.CollectiveStream: many calls
// multiplexed on one stream, a deadline that ends only its own call, the
// coordinator's death ending the calls in flight with UNAVAILABLE, and a
// malformed request failing only itself. A real chorus-coordinator process;
// the ranks are WorkerRuntime instances and CollectiveStreamClient in this
// process.

#include <grpcpp/client_context.h>
#include <signal.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/common/grpc_status.h"
#include "server/common/net.h"
#include "server/worker/collective_stream_client.h"
#include "server/worker/worker_runtime.h"
#include "tests/testing/daemons.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

// Generous: a loaded two-core machine runs several test processes at once.
constexpr absl::Duration kLong = absl::Seconds(120);

// The verdicts of calls started with CollectiveStreamClient::Start.
class Verdicts {
 public:
  explicit Verdicts(int calls) : verdicts_(calls) {}
  CollectiveStreamClient::Callback For(int i) {
    return [this, i](absl::StatusOr<v1::CollectiveResponse> verdict) {
      absl::MutexLock lock(&mu_);
      verdicts_[i] = std::move(verdict);
      ++done_;
    };
  }
  // Waits until every call ended (each ends by its deadline).
  std::vector<absl::StatusOr<v1::CollectiveResponse>> Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](Verdicts* v) ABSL_EXCLUSIVE_LOCKS_REQUIRED(v->mu_) {
          return v->done_ == static_cast<int>(v->verdicts_.size());
        },
        this));
    return verdicts_;
  }

 private:
  absl::Mutex mu_;
  std::vector<absl::StatusOr<v1::CollectiveResponse>> verdicts_
      ABSL_GUARDED_BY(mu_);
  int done_ ABSL_GUARDED_BY(mu_) = 0;
};

class CollectiveStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<test::Daemon> coordinator = test::StartCoordinator();
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    for (int i = 0; i < 2; ++i) {
      RuntimeOptions options;
      options.coordinator = coordinator_.address;
      options.name = absl::StrCat("stream-worker-", i);
      absl::StatusOr<std::unique_ptr<WorkerRuntime>> runtime =
          WorkerRuntime::Start(options);
      ASSERT_TRUE(runtime.ok()) << runtime.status();
      runtimes_.push_back(*std::move(runtime));
    }
    stub_ = v1::Coordinator::NewStub(MakeChannel(coordinator_.address));
  }

  // Joins `group` with rank r on runtime r; returns the memberships.
  std::vector<Membership> Join(const std::string& group, int world) {
    std::vector<Membership> members(world);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        absl::StatusOr<Membership> m = runtimes_[r]->Join(
            group, world, r, runtimes_[r]->devices().front(), kLong);
        ASSERT_TRUE(m.ok()) << m.status();
        members[r] = *std::move(m);
      });
    }
    for (std::thread& t : threads) t.join();
    return members;
  }

  // An inline all_reduce (sum) of one int64 `value`, call `sequence`.
  static v1::CollectiveRequest AllReduce(const Membership& m, uint64_t sequence,
                                         int64_t value) {
    v1::CollectiveRequest request;
    request.set_group(m.group);
    request.set_epoch(m.epoch);
    request.set_rank(m.rank);
    request.set_sequence(sequence);
    request.set_kind(v1::COLLECTIVE_KIND_ALL_REDUCE);
    request.set_dtype(v1::DTYPE_I64);
    request.set_count(1);
    request.set_op(v1::REDUCE_OP_SUM);
    request.set_algorithm(v1::ALGORITHM_INLINE);
    request.set_has_inline_data(true);
    request.set_inline_data(&value, sizeof(value));
    return request;
  }

  static int64_t Result(const v1::CollectiveResponse& response) {
    int64_t value = 0;
    if (response.inline_result().size() == sizeof(value)) {
      std::memcpy(&value, response.inline_result().data(), sizeof(value));
    }
    return value;
  }

  test::Daemon coordinator_;
  std::vector<std::unique_ptr<WorkerRuntime>> runtimes_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

TEST_F(CollectiveStreamTest, Start_ManyConcurrentCalls_EachGetsItsOwnReply) {
  constexpr int kGroups = 24;
  std::vector<std::vector<Membership>> groups;
  for (int g = 0; g < kGroups; ++g) {
    groups.push_back(Join(absl::StrCat("multiplexed-", g), 2));
  }
  CollectiveStreamClient rank0(stub_.get());
  CollectiveStreamClient rank1(stub_.get());
  Verdicts verdicts0(kGroups);
  Verdicts verdicts1(kGroups);
  const absl::Time deadline = absl::Now() + kLong;
  // Rank 0 calls in one order, rank 1 in the other, so the verdicts come in
  // an order other than rank 0's requests.
  for (int g = 0; g < kGroups; ++g) {
    rank0.Start(AllReduce(groups[g][0], 1, g), deadline, verdicts0.For(g));
  }
  for (int g = kGroups - 1; g >= 0; --g) {
    rank1.Start(AllReduce(groups[g][1], 1, 1000 * g), deadline,
                verdicts1.For(g));
  }
  const auto got0 = verdicts0.Wait();
  const auto got1 = verdicts1.Wait();
  for (int g = 0; g < kGroups; ++g) {
    ASSERT_TRUE(got0[g].ok()) << got0[g].status();
    ASSERT_TRUE(got1[g].ok()) << got1[g].status();
    EXPECT_EQ(Result(*got0[g]), 1001 * g) << "group " << g;
    EXPECT_EQ(Result(*got1[g]), 1001 * g) << "group " << g;
  }
}

TEST_F(CollectiveStreamTest, Start_OneCallsDeadlinePasses_OnlyThatCallEnds) {
  const std::vector<Membership> lonely = Join("lonely", 2);
  const std::vector<Membership> paired = Join("paired", 2);
  CollectiveStreamClient rank0(stub_.get());
  Verdicts short_call(1);
  Verdicts long_call(1);
  // Rank 1 of "lonely" never calls; both calls share rank 0's stream.
  rank0.Start(AllReduce(lonely[0], 1, 1), absl::Now() + absl::Seconds(1),
              short_call.For(0));
  rank0.Start(AllReduce(paired[0], 1, 2), absl::Now() + kLong,
              long_call.For(0));
  const absl::StatusOr<v1::CollectiveResponse> expired =
      short_call.Wait().front();
  EXPECT_EQ(expired.status().code(), absl::StatusCode::kDeadlineExceeded)
      << expired.status();
  // The coordinator's verdict, which names the missing rank.
  EXPECT_THAT(std::string(expired.status().message()), HasSubstr("rank 1"));
  // The other call still waits on the same stream and completes.
  CollectiveStreamClient rank1(stub_.get());
  absl::StatusOr<v1::CollectiveResponse> other =
      rank1.Call(AllReduce(paired[1], 1, 3), absl::Now() + kLong);
  const absl::StatusOr<v1::CollectiveResponse> completed =
      long_call.Wait().front();
  ASSERT_TRUE(completed.ok()) << completed.status();
  EXPECT_EQ(Result(*completed), 5);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(Result(*other), 5);
}

TEST_F(CollectiveStreamTest, Start_CoordinatorKilled_CallsInFlightUnavailable) {
  const std::vector<Membership> group = Join("orphaned", 2);
  CollectiveStreamClient rank0(stub_.get());
  Verdicts verdicts(2);
  // Rank 1 never calls: both wait at the coordinator.
  rank0.Start(AllReduce(group[0], 1, 1), absl::Now() + kLong, verdicts.For(0));
  rank0.Start(AllReduce(group[0], 2, 1), absl::Now() + kLong, verdicts.For(1));
  ASSERT_TRUE(coordinator_.process->Kill().ok());
  // Each ends once the connection is seen broken, long before its deadline
  // (a call still waiting for its deadline would keep Wait() blocked).
  for (const auto& verdict : verdicts.Wait()) {
    EXPECT_EQ(verdict.status().code(), absl::StatusCode::kUnavailable)
        << verdict.status();
    EXPECT_THAT(std::string(verdict.status().message()),
                ::testing::Not(HasSubstr("Deadline")));
  }
  // The next call opens a new stream, which fails the same way.
  absl::StatusOr<v1::CollectiveResponse> next =
      rank0.Call(AllReduce(group[0], 3, 1), absl::Now() + absl::Seconds(30));
  EXPECT_EQ(next.status().code(), absl::StatusCode::kUnavailable)
      << next.status();
}

TEST_F(CollectiveStreamTest, Stream_MalformedRequest_InvalidArgumentForItOnly) {
  const std::vector<Membership> group = Join("alone", 1);
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(kLong));
  auto stream = stub_->CollectiveStream(&context);
  v1::CollectiveStreamRequest no_call;
  no_call.set_call_id(1);
  v1::CollectiveStreamRequest negative_timeout;
  negative_timeout.set_call_id(2);
  negative_timeout.set_timeout_us(-5);
  *negative_timeout.mutable_call() = AllReduce(group[0], 1, 7);
  v1::CollectiveStreamRequest bad_kind;
  bad_kind.set_call_id(3);
  bad_kind.set_timeout_us(absl::ToInt64Microseconds(kLong));
  *bad_kind.mutable_call() = AllReduce(group[0], 1, 7);
  bad_kind.mutable_call()->set_kind(static_cast<v1::CollectiveKind>(99));
  v1::CollectiveStreamRequest good;
  good.set_call_id(4);
  good.set_timeout_us(absl::ToInt64Microseconds(kLong));
  *good.mutable_call() = AllReduce(group[0], 1, 7);
  for (const auto* request : {&no_call, &negative_timeout, &bad_kind, &good}) {
    ASSERT_TRUE(stream->Write(*request));
  }
  ASSERT_TRUE(stream->WritesDone());
  std::vector<v1::CollectiveStreamReply> replies(5);
  v1::CollectiveStreamReply reply;
  int read = 0;
  while (stream->Read(&reply)) {
    ASSERT_GE(reply.call_id(), 1u);
    ASSERT_LE(reply.call_id(), 4u);
    replies[reply.call_id()] = reply;
    ++read;
  }
  EXPECT_EQ(read, 4);
  EXPECT_TRUE(stream->Finish().ok());
  for (int id = 1; id <= 3; ++id) {
    EXPECT_EQ(replies[id].code(),
              static_cast<int>(absl::StatusCode::kInvalidArgument))
        << "call " << id << ": " << replies[id].message();
  }
  EXPECT_THAT(replies[1].message(), HasSubstr("carries no CollectiveRequest"));
  EXPECT_THAT(replies[2].message(), HasSubstr("negative timeout"));
  EXPECT_EQ(replies[4].code(), 0) << replies[4].message();
  EXPECT_EQ(Result(replies[4].response()), 7);
}

}  // namespace
}  // namespace chorus
