// Sequence numbers on a worker daemon's local API, against real daemons: an
// old number used again is refused, a skipped one is found (and the call
// that skipped takes no number), calls that arrive out of order both run, a
// ring call retried after its reply was lost gets its result, and a failed
// call that used its number says so in its ErrorDetail.
#include <grpcpp/client_context.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "chorus/v1/worker.grpc.pb.h"
#include "common/grpc_status.h"
#include "common/net.h"
#include "common/status_detail.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemons.h"
#include "tests/testing/local_calls.h"
#include "tests/testing/wait.h"

namespace chorus::test {
namespace {

using ::testing::HasSubstr;

// Far longer than any call here takes when its peers are there.
constexpr absl::Duration kCallTimeout = absl::Seconds(60);
// The deadline of a call that is meant to wait out its deadline.
constexpr absl::Duration kShortTimeout = absl::Seconds(2);
// Elements of the ring calls: enough for a ring of two ranks.
constexpr uint64_t kRingCount = 64;

class LocalApiSequenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<Daemon> coordinator = StartCoordinator();
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    absl::StatusOr<Daemon> worker =
        StartWorker(coordinator_.address, {"--name=seq-w"});
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = *std::move(worker);
    stub_ =
        v1::WorkerLocal::NewStub(MakeChannel(worker_.address, Role::kWorker));
  }

  // Joins ranks 0 .. world-1 of `group` through the worker; returns the
  // epoch (0 after a failed join).
  uint64_t Join(const std::string& group, int world) {
    std::vector<grpc::Status> joined(world);
    std::vector<uint64_t> epochs(world);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        grpc::ClientContext context;
        context.set_deadline(DeadlineAfter(kCallTimeout));
        v1::LocalJoinRequest request;
        request.set_group(group);
        request.set_world_size(world);
        request.set_rank(r);
        v1::LocalJoinResponse response;
        joined[r] = stub_->JoinGroup(&context, request, &response);
        epochs[r] = response.epoch();
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(joined[r].ok()) << r << ": " << joined[r].error_message();
      if (!joined[r].ok()) return 0;
    }
    return epochs[0];
  }

  // Rank `rank`'s all_reduce of one u32 as its call #`sequence`.
  absl::Status AllReduce(const std::string& group, uint64_t epoch, int rank,
                         uint64_t sequence,
                         absl::Duration timeout = kCallTimeout) {
    const v1::LocalCollectiveRequest call =
        OneU32AllReduce(group, epoch, rank, sequence);
    grpc::ClientContext context;
    context.set_deadline(DeadlineAfter(timeout));
    v1::LocalCollectiveResponse response;
    return FromGrpcStatus(stub_->Collective(&context, call, &response));
  }

  // Rank `rank`'s ring all_reduce (sum) of kRingCount u32 of value rank + 1
  // as its call #`sequence`.
  static v1::LocalCollectiveRequest RingCall(const std::string& group,
                                             uint64_t epoch, int rank,
                                             uint64_t sequence) {
    v1::LocalCollectiveRequest call =
        OneU32AllReduce(group, epoch, rank, sequence);
    call.mutable_spec()->set_count(kRingCount);
    call.set_algorithm(v1::ALGORITHM_RING);
    const std::vector<uint32_t> values(kRingCount, rank + 1);
    call.set_data(std::string(reinterpret_cast<const char*>(values.data()),
                              values.size() * sizeof(uint32_t)));
    return call;
  }

  // The output of RingCall on two ranks.
  static std::string Sums() {
    const std::vector<uint32_t> sums(kRingCount, 3);
    return std::string(reinterpret_cast<const char*>(sums.data()),
                       sums.size() * sizeof(uint32_t));
  }

  absl::Status Ring(const v1::LocalCollectiveRequest& call,
                    v1::LocalCollectiveResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(DeadlineAfter(kCallTimeout));
    return FromGrpcStatus(stub_->Collective(&context, call, response));
  }

  Daemon coordinator_;
  Daemon worker_;
  std::unique_ptr<v1::WorkerLocal::Stub> stub_;
};

TEST_F(LocalApiSequenceTest,
       Collective_SkippedNumber_InvalidArgumentAndNumberStaysFree) {
  const uint64_t epoch = Join("skip", 1);
  ASSERT_NE(epoch, 0u);
  ASSERT_TRUE(AllReduce("skip", epoch, 0, 1).ok());
  const absl::Status skipped = AllReduce("skip", epoch, 0, 3, kShortTimeout);
  EXPECT_EQ(skipped.code(), absl::StatusCode::kInvalidArgument) << skipped;
  EXPECT_THAT(skipped.message(), HasSubstr("called #3 but not #2"));
  EXPECT_FALSE(ErrorDetailOf(skipped).has_value()) << skipped;
  // The skipping call took no number: #2 and then #3 run.
  EXPECT_TRUE(AllReduce("skip", epoch, 0, 2).ok());
  EXPECT_TRUE(AllReduce("skip", epoch, 0, 3).ok());
}

TEST_F(LocalApiSequenceTest, Collective_OlderNumberAgain_FailedPrecondition) {
  const uint64_t epoch = Join("twice", 1);
  ASSERT_NE(epoch, 0u);
  ASSERT_TRUE(AllReduce("twice", epoch, 0, 1).ok());
  ASSERT_TRUE(AllReduce("twice", epoch, 0, 2).ok());
  // Only the newest finished call is kept for a retry.
  const absl::Status again = AllReduce("twice", epoch, 0, 1);
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  EXPECT_THAT(again.message(), HasSubstr("already called #1"));
  EXPECT_TRUE(AllReduce("twice", epoch, 0, 3).ok());
}

TEST_F(LocalApiSequenceTest,
       Collective_RingCallRetriedAfterLostReply_GetsItsResult) {
  const uint64_t epoch = Join("lost", 2);
  ASSERT_NE(epoch, 0u);
  std::unique_ptr<v1::Coordinator::Stub> coordinator =
      NewCoordinatorStub(coordinator_.address);
  // Rank 0's first attempt reaches the coordinator, then its client gives
  // up on it (the reply is lost); the call goes on at the daemon.
  grpc::ClientContext first;
  first.set_deadline(DeadlineAfter(kCallTimeout));
  v1::LocalCollectiveResponse first_response;
  grpc::Status first_status;
  absl::Notification first_done;
  const v1::LocalCollectiveRequest first_call = RingCall("lost", epoch, 0, 1);
  stub_->async()->Collective(&first, &first_call, &first_response,
                             [&](grpc::Status status) {
                               first_status = status;
                               first_done.Notify();
                             });
  ASSERT_TRUE(
      WaitUntil([&] { return PendingSequence(*coordinator, "lost") == 1; },
                kCallTimeout));
  first.TryCancel();
  first_done.WaitForNotification();
  EXPECT_EQ(first_status.error_code(), grpc::StatusCode::CANCELLED);
  // Rank 1 comes: the ring runs once, on both ranks.
  v1::LocalCollectiveResponse peer;
  EXPECT_TRUE(Ring(RingCall("lost", epoch, 1, 1), &peer).ok());
  EXPECT_EQ(peer.data(), Sums());
  // The retry gets the first attempt's result; nothing runs again.
  v1::LocalCollectiveResponse retried;
  const absl::Status retry = Ring(RingCall("lost", epoch, 0, 1), &retried);
  ASSERT_TRUE(retry.ok()) << retry;
  EXPECT_EQ(retried.data(), Sums());
  EXPECT_EQ(retried.sequence(), 1u);
  EXPECT_EQ(retried.plan().algorithm(), v1::ALGORITHM_RING);
  // The group goes on with #2.
  absl::Status second[2];
  std::thread other([&] {
    v1::LocalCollectiveResponse unused;
    second[1] = Ring(RingCall("lost", epoch, 1, 2), &unused);
  });
  v1::LocalCollectiveResponse unused;
  second[0] = Ring(RingCall("lost", epoch, 0, 2), &unused);
  other.join();
  EXPECT_TRUE(second[0].ok()) << second[0];
  EXPECT_TRUE(second[1].ok()) << second[1];
}

TEST_F(LocalApiSequenceTest, Collective_HigherNumberFirst_BothComplete) {
  const uint64_t epoch = Join("order", 1);
  ASSERT_NE(epoch, 0u);
  absl::Status second;
  std::thread early([&] { second = AllReduce("order", epoch, 0, 2); });
  const absl::Status first = AllReduce("order", epoch, 0, 1);
  early.join();
  EXPECT_TRUE(first.ok()) << first;
  EXPECT_TRUE(second.ok()) << second;
}

TEST_F(LocalApiSequenceTest, Collective_FarAhead_InvalidArgumentAtOnce) {
  const uint64_t epoch = Join("far", 1);
  ASSERT_NE(epoch, 0u);
  const absl::Status far = AllReduce("far", epoch, 0, 5000);
  EXPECT_EQ(far.code(), absl::StatusCode::kInvalidArgument) << far;
  EXPECT_THAT(far.message(), HasSubstr("from the future"));
  EXPECT_TRUE(AllReduce("far", epoch, 0, 1).ok());
}

TEST_F(LocalApiSequenceTest,
       Collective_FailedAfterTakingNumber_DetailSaysNumberUsed) {
  const uint64_t epoch = Join("used", 2);
  ASSERT_NE(epoch, 0u);
  // Rank 1 never calls: rank 0's #1 ends at its deadline, number used.
  const absl::Status alone = AllReduce("used", epoch, 0, 1, kShortTimeout);
  EXPECT_EQ(alone.code(), absl::StatusCode::kDeadlineExceeded) << alone;
  const std::optional<v1::ErrorDetail> detail = ErrorDetailOf(alone);
  ASSERT_TRUE(detail.has_value()) << alone;
  EXPECT_TRUE(detail->number_used());
  EXPECT_EQ(detail->sequence(), 1u);
  // A refusal before the number says nothing of it.
  const absl::Status stale = AllReduce("used", epoch + 1, 0, 2);
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition) << stale;
  const std::optional<v1::ErrorDetail> none = ErrorDetailOf(stale);
  EXPECT_TRUE(!none.has_value() || !none->number_used()) << stale;
}

}  // namespace
}  // namespace chorus::test
