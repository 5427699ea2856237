#include "server/worker/local/call_ledger.h"

#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

// Long enough never to pass in a test; waits end by event, not by it.
absl::Time Later() { return absl::Now() + absl::Minutes(5); }
// Already passed: a wait for a lower number gives up at once.
absl::Time Passed() { return absl::Now() - absl::Seconds(1); }

// A call of the given kind on four f32: every call of these tests is an
// all_reduce unless it says another.
CallIdentity CallOf(CollectiveKind kind = CollectiveKind::kAllReduce) {
  CallIdentity call;
  call.spec.kind = kind;
  call.spec.dtype = DType::kF32;
  call.spec.count = 4;
  if (kind == CollectiveKind::kAllReduce) call.spec.op = ReduceOp::kSum;
  call.input_bytes = 16;
  return call;
}
const CallIdentity kCall = CallOf();

// Use() of a first attempt: fails the test when it came back as a retry.
absl::Status Take(CallLedger& ledger, const std::string& group, int rank,
                  uint64_t epoch, uint64_t sequence, absl::Time deadline,
                  const CallIdentity& call = kCall) {
  std::optional<CallOutcome> retried;
  absl::Status status =
      ledger.Use(group, rank, epoch, sequence, call, deadline, &retried);
  EXPECT_FALSE(retried.has_value()) << "#" << sequence << " was a retry";
  return status;
}

CallOutcome Output(const std::string& bytes) {
  CallOutcome outcome;
  outcome.algorithm = Algorithm::kRing;
  outcome.chunk_bytes = 64;
  outcome.output = bytes;
  return outcome;
}

TEST(CallLedgerTest, Use_NumbersInOrder_AllOk) {
  CallLedger ledger;
  for (uint64_t n = 1; n <= 5; ++n) {
    EXPECT_TRUE(Take(ledger, "g", 0, 7, n, Later()).ok()) << n;
  }
}

TEST(CallLedgerTest, Use_OldNumberAgain_FailedPreconditionAndNextStillFree) {
  CallLedger ledger;
  ASSERT_TRUE(Take(ledger, "g", 0, 7, 1, Later()).ok());
  ledger.Keep("g", 0, 7, 1, Output("one"));
  ASSERT_TRUE(Take(ledger, "g", 0, 7, 2, Later()).ok());
  ledger.Keep("g", 0, 7, 2, Output("two"));
  const absl::Status again = Take(ledger, "g", 0, 7, 1, Later());
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.message(), HasSubstr("already called #1"));
  EXPECT_TRUE(Take(ledger, "g", 0, 7, 3, Later()).ok());
}

TEST(CallLedgerTest, Use_SkippedNumber_InvalidArgumentAtDeadlineTakesNone) {
  CallLedger ledger;
  ASSERT_TRUE(Take(ledger, "g", 0, 7, 1, Later()).ok());
  const absl::Status skipped = Take(ledger, "g", 0, 7, 3, Passed());
  EXPECT_EQ(skipped.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(skipped.message(), HasSubstr("called #3 but not #2"));
  // #3 took no number: both are still free, in order.
  EXPECT_TRUE(Take(ledger, "g", 0, 7, 2, Later()).ok());
  EXPECT_TRUE(Take(ledger, "g", 0, 7, 3, Later()).ok());
}

TEST(CallLedgerTest, Use_HigherNumberFirst_WaitsForTheLowerOne) {
  CallLedger ledger;
  absl::Status second;
  std::thread early([&] { second = Take(ledger, "g", 0, 7, 2, Later()); });
  ledger.AwaitCallsForTesting("g", 0, 1);  // #2 waits before #1 comes
  EXPECT_TRUE(Take(ledger, "g", 0, 7, 1, Later()).ok());
  early.join();
  EXPECT_TRUE(second.ok()) << second;
  EXPECT_TRUE(Take(ledger, "g", 0, 7, 3, Later()).ok());
}

TEST(CallLedgerTest, Use_FarFuture_InvalidArgumentAtOnce) {
  CallLedger ledger;
  const absl::Status far =
      Take(ledger, "g", 0, 7, 1 + kMaxNumbersAhead, Later());
  EXPECT_EQ(far.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(far.message(), HasSubstr("from the future"));
}

TEST(CallLedgerTest, Use_SequenceZero_InvalidArgument) {
  CallLedger ledger;
  EXPECT_EQ(Take(ledger, "g", 0, 7, 0, Later()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CallLedgerTest, Use_NewEpoch_StartsFromOneAndOldEpochIsStale) {
  CallLedger ledger;
  ASSERT_TRUE(Take(ledger, "g", 0, 7, 1, Later()).ok());
  ASSERT_TRUE(Take(ledger, "g", 0, 7, 2, Later()).ok());
  EXPECT_TRUE(Take(ledger, "g", 0, 8, 1, Later()).ok());
  EXPECT_EQ(Take(ledger, "g", 0, 7, 3, Later()).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(CallLedgerTest, Use_RanksAndGroupsApart_NumberedSeparately) {
  CallLedger ledger;
  EXPECT_TRUE(Take(ledger, "g", 0, 7, 1, Later()).ok());
  EXPECT_TRUE(Take(ledger, "g", 1, 7, 1, Later()).ok());
  EXPECT_TRUE(Take(ledger, "h", 0, 3, 1, Later()).ok());
}

TEST(CallLedgerTest, Close_WaitingCall_Unavailable) {
  CallLedger ledger;
  absl::Status waiting;
  std::thread early([&] { waiting = Take(ledger, "g", 0, 7, 2, Later()); });
  ledger.AwaitCallsForTesting("g", 0, 1);
  ledger.Close();
  early.join();
  EXPECT_EQ(waiting.code(), absl::StatusCode::kUnavailable);
}

TEST(CallLedgerTest, Use_RetryOfFinishedCall_GetsItsOutcome) {
  CallLedger ledger;
  ASSERT_TRUE(Take(ledger, "g", 0, 7, 1, Later()).ok());
  ledger.Keep("g", 0, 7, 1, Output("result"));
  std::optional<CallOutcome> retried;
  ASSERT_TRUE(ledger.Use("g", 0, 7, 1, kCall, Later(), &retried).ok());
  ASSERT_TRUE(retried.has_value());
  EXPECT_EQ(retried->output, "result");
  EXPECT_EQ(retried->algorithm, Algorithm::kRing);
  EXPECT_EQ(retried->chunk_bytes, 64u);
  // A retry takes no number: the next call still gets #2.
  EXPECT_TRUE(Take(ledger, "g", 0, 7, 2, Later()).ok());
}

TEST(CallLedgerTest, Use_RetryWhileFirstAttemptRuns_WaitsForItsOutcome) {
  CallLedger ledger;
  ASSERT_TRUE(Take(ledger, "g", 0, 7, 1, Later()).ok());
  std::optional<CallOutcome> retried;
  absl::Status status;
  std::thread retry(
      [&] { status = ledger.Use("g", 0, 7, 1, kCall, Later(), &retried); });
  ledger.AwaitCallsForTesting("g", 0, 1);  // the retry waits first
  ledger.Keep("g", 0, 7, 1, Output("late"));
  retry.join();
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_TRUE(retried.has_value());
  EXPECT_EQ(retried->output, "late");
}

TEST(CallLedgerTest,
     Use_RetryWaitingWhenANewerNumberIsTaken_FailedPreconditionAlreadyCalled) {
  CallLedger ledger;
  ASSERT_TRUE(Take(ledger, "g", 0, 1, 1, Later()).ok());
  ASSERT_TRUE(Take(ledger, "g", 0, 1, 2, Later()).ok());
  // #1's outcome is still being recorded (its reply went out before) when
  // the rank, which has called #2 since, sends #1 again.
  absl::Status again;
  std::optional<CallOutcome> retried;
  std::thread retry(
      [&] { again = ledger.Use("g", 0, 1, 1, kCall, Later(), &retried); });
  ledger.AwaitCallsForTesting("g", 0, 1);
  ledger.Keep("g", 0, 1, 1, Output("first"));
  retry.join();
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  EXPECT_THAT(again.message(), HasSubstr("already called #1"));
  EXPECT_FALSE(retried.has_value());
}

TEST(CallLedgerTest, Use_RetryOfFailedCall_GetsTheSameFailure) {
  CallLedger ledger;
  ASSERT_TRUE(Take(ledger, "g", 0, 7, 1, Later()).ok());
  CallOutcome failed;
  failed.status = absl::DeadlineExceededError("rank 1 did not come");
  ledger.Keep("g", 0, 7, 1, failed);
  std::optional<CallOutcome> retried;
  ASSERT_TRUE(ledger.Use("g", 0, 7, 1, kCall, Later(), &retried).ok());
  ASSERT_TRUE(retried.has_value());
  EXPECT_EQ(retried->status, failed.status);
}

TEST(CallLedgerTest, Use_SameNumberOtherCall_FailedPrecondition) {
  CallLedger ledger;
  ASSERT_TRUE(Take(ledger, "g", 0, 7, 1, Later()).ok());
  ledger.Keep("g", 0, 7, 1, Output("result"));
  const absl::Status other =
      Take(ledger, "g", 0, 7, 1, Later(), CallOf(CollectiveKind::kBroadcast));
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.message(), HasSubstr("already called #1 as"));
}

TEST(CallLedgerTest, Keep_NewerCallFinished_OlderOutcomeForgotten) {
  CallLedger ledger;
  ASSERT_TRUE(Take(ledger, "g", 0, 7, 1, Later()).ok());
  ASSERT_TRUE(Take(ledger, "g", 0, 7, 2, Later()).ok());
  ledger.Keep("g", 0, 7, 1, Output("one"));
  ledger.Keep("g", 0, 7, 2, Output("two"));
  const absl::Status old = Take(ledger, "g", 0, 7, 1, Later());
  EXPECT_EQ(old.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(old.message(), HasSubstr("already called #1"));
  std::optional<CallOutcome> retried;
  ASSERT_TRUE(ledger.Use("g", 0, 7, 2, kCall, Later(), &retried).ok());
  ASSERT_TRUE(retried.has_value());
  EXPECT_EQ(retried->output, "two");
}

TEST(CallLedgerTest, Keep_OutputOverTheCap_RetryToldItIsNotKept) {
  CallLedger ledger;
  ASSERT_TRUE(Take(ledger, "g", 0, 7, 1, Later()).ok());
  ledger.Keep("g", 0, 7, 1, Output(std::string(kMaxKeptOutputBytes + 1, 'x')));
  std::optional<CallOutcome> retried;
  ASSERT_TRUE(ledger.Use("g", 0, 7, 1, kCall, Later(), &retried).ok());
  ASSERT_TRUE(retried.has_value());
  EXPECT_EQ(retried->status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(retried->status.message(), HasSubstr("keeps for a retry"));
  EXPECT_TRUE(retried->output.empty());
}

TEST(CallLedgerTest, Forget_CallWaiting_FailedPreconditionRankLeft) {
  CallLedger ledger;
  absl::Status waiting;
  std::thread early([&] { waiting = Take(ledger, "g", 0, 7, 2, Later()); });
  ledger.AwaitCallsForTesting("g", 0, 1);
  ledger.Forget("g", 0, 7);
  early.join();
  EXPECT_EQ(waiting.code(), absl::StatusCode::kFailedPrecondition) << waiting;
  EXPECT_THAT(waiting.message(), HasSubstr("left the group"));
  // The last call out erased the entry: the rank starts afresh.
  EXPECT_TRUE(Take(ledger, "g", 0, 7, 1, Later()).ok());
}

TEST(CallLedgerTest, Forget_OtherEpoch_NumbersKept) {
  CallLedger ledger;
  ASSERT_TRUE(Take(ledger, "g", 0, 7, 1, Later()).ok());
  ledger.Keep("g", 0, 7, 1, Output("one"));
  ledger.Forget("g", 0, 6);
  std::optional<CallOutcome> retried;
  ASSERT_TRUE(ledger.Use("g", 0, 7, 1, kCall, Later(), &retried).ok());
  ASSERT_TRUE(retried.has_value());
  EXPECT_EQ(retried->output, "one");
}

TEST(CallLedgerTest, Forget_NothingWaiting_KeptOutcomeDropped) {
  CallLedger ledger;
  ASSERT_TRUE(Take(ledger, "g", 0, 7, 1, Later()).ok());
  ledger.Keep("g", 0, 7, 1, Output("one"));
  ledger.Forget("g", 0, 7);
  // The rank's numbers are gone with it: #1 is a first call again.
  EXPECT_TRUE(Take(ledger, "g", 0, 7, 1, Later()).ok());
}

}  // namespace
}  // namespace chorus
