#include "server/worker/call_ledger.h"

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

TEST(CallLedgerTest, Use_NumbersInOrder_AllOk) {
  CallLedger ledger;
  for (uint64_t n = 1; n <= 5; ++n) {
    EXPECT_TRUE(ledger.Use("g", 0, 7, n, Later()).ok()) << n;
  }
}

TEST(CallLedgerTest, Use_NumberTwice_FailedPreconditionAndNextStillFree) {
  CallLedger ledger;
  ASSERT_TRUE(ledger.Use("g", 0, 7, 1, Later()).ok());
  EXPECT_THAT(
      ledger.Use("g", 0, 7, 1, Later()),
      testing::AllOf(testing::Property(&absl::Status::code,
                                       absl::StatusCode::kFailedPrecondition),
                     testing::Property(&absl::Status::message,
                                       HasSubstr("already called #1"))));
  EXPECT_TRUE(ledger.Use("g", 0, 7, 2, Later()).ok());
}

TEST(CallLedgerTest, Use_SkippedNumber_InvalidArgumentAtDeadlineTakesNone) {
  CallLedger ledger;
  ASSERT_TRUE(ledger.Use("g", 0, 7, 1, Later()).ok());
  const absl::Status skipped = ledger.Use("g", 0, 7, 3, Passed());
  EXPECT_EQ(skipped.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(skipped.message(), HasSubstr("called #3 but not #2"));
  // #3 took no number: both are still free, in order.
  EXPECT_TRUE(ledger.Use("g", 0, 7, 2, Later()).ok());
  EXPECT_TRUE(ledger.Use("g", 0, 7, 3, Later()).ok());
}

TEST(CallLedgerTest, Use_HigherNumberFirst_WaitsForTheLowerOne) {
  CallLedger ledger;
  absl::Status second;
  std::thread early([&] { second = ledger.Use("g", 0, 7, 2, Later()); });
  EXPECT_TRUE(ledger.Use("g", 0, 7, 1, Later()).ok());
  early.join();
  EXPECT_TRUE(second.ok()) << second;
  EXPECT_TRUE(ledger.Use("g", 0, 7, 3, Later()).ok());
}

TEST(CallLedgerTest, Use_FarFuture_InvalidArgumentAtOnce) {
  CallLedger ledger;
  const absl::Status far = ledger.Use("g", 0, 7, 1 + kMaxNumbersAhead, Later());
  EXPECT_EQ(far.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(far.message(), HasSubstr("from the future"));
}

TEST(CallLedgerTest, Use_SequenceZero_InvalidArgument) {
  CallLedger ledger;
  EXPECT_EQ(ledger.Use("g", 0, 7, 0, Later()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CallLedgerTest, Use_NewEpoch_StartsFromOneAndOldEpochIsStale) {
  CallLedger ledger;
  ASSERT_TRUE(ledger.Use("g", 0, 7, 1, Later()).ok());
  ASSERT_TRUE(ledger.Use("g", 0, 7, 2, Later()).ok());
  EXPECT_TRUE(ledger.Use("g", 0, 8, 1, Later()).ok());
  EXPECT_EQ(ledger.Use("g", 0, 7, 3, Later()).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(CallLedgerTest, Use_RanksAndGroupsApart_NumberedSeparately) {
  CallLedger ledger;
  EXPECT_TRUE(ledger.Use("g", 0, 7, 1, Later()).ok());
  EXPECT_TRUE(ledger.Use("g", 1, 7, 1, Later()).ok());
  EXPECT_TRUE(ledger.Use("h", 0, 3, 1, Later()).ok());
}

TEST(CallLedgerTest, Close_WaitingCall_Unavailable) {
  CallLedger ledger;
  absl::Status waiting;
  std::thread early([&] { waiting = ledger.Use("g", 0, 7, 2, Later()); });
  ledger.Close();
  early.join();
  EXPECT_EQ(waiting.code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace chorus
