// BurstMemory: when it trims the heap, and what its metrics say.

#include "common/burst_memory.h"

#include <memory>

#include "absl/time/time.h"
#include "common/metrics.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

TEST(BurstMemoryTest, Ended_BurstDownToAnEighthThenNone_TrimsAtEach) {
  Level alive;
  Counter trims;
  BurstMemory burst(1000, &alive, &trims, nullptr, absl::InfiniteDuration());
  for (int i = 0; i < 1000; ++i) burst.Began();
  EXPECT_EQ(alive.value(), 1000);
  for (int i = 0; i < 874; ++i) burst.Ended();
  EXPECT_EQ(burst.trims(), 0);  // 126 alive: more than an eighth
  burst.Ended();
  EXPECT_EQ(burst.trims(), 1);
  EXPECT_EQ(trims.value(), 1u);
  // The 125 left are no burst of their own, but the last of them gives back
  // what they freed.
  for (int i = 0; i < 124; ++i) burst.Ended();
  EXPECT_EQ(burst.trims(), 1);
  burst.Ended();
  EXPECT_EQ(burst.trims(), 2);
  EXPECT_EQ(trims.value(), 2u);
  EXPECT_EQ(alive.value(), 0);
  // Nothing alive: no tail left to trim.
  burst.Began();
  burst.Ended();
  EXPECT_EQ(burst.trims(), 2);
}

TEST(BurstMemoryTest, Ended_NextBurstBeforeTheLastEnded_TrimsAgain) {
  BurstMemory burst(1000, nullptr, nullptr, nullptr, absl::InfiniteDuration());
  for (int i = 0; i < 1000; ++i) burst.Began();
  for (int i = 0; i < 900; ++i) burst.Ended();
  EXPECT_EQ(burst.trims(), 1);
  // 100 of the first burst are still alive when the next one comes.
  for (int i = 0; i < 2000; ++i) burst.Began();
  for (int i = 0; i < 1900; ++i) burst.Ended();
  EXPECT_EQ(burst.trims(), 2);
}

TEST(BurstMemoryTest, Ended_FewerThanABurst_NeverTrims) {
  BurstMemory burst(1000, nullptr, nullptr, nullptr, absl::InfiniteDuration());
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 999; ++i) burst.Began();
    for (int i = 0; i < 999; ++i) burst.Ended();
  }
  EXPECT_EQ(burst.trims(), 0);
}

TEST(BurstMemoryTest, Ended_LastOfABurstThatEndsAtOnce_Trims) {
  BurstMemory burst(4, nullptr, nullptr, nullptr, absl::InfiniteDuration());
  for (int i = 0; i < 8; ++i) burst.Began();
  for (int i = 0; i < 7; ++i) burst.Ended();
  EXPECT_EQ(burst.trims(), 1);  // one alive: an eighth of 8
  burst.Ended();
  EXPECT_EQ(burst.trims(), 2);  // the burst's last call
}

// How long the tests below wait for a trim that should come.
constexpr absl::Duration kGenerous = absl::Seconds(30);

TEST(BurstMemoryTest, Settle_BurstOverNoCallSince_TrimsOnceMore) {
  Counter trims;
  Counter settled;
  BurstMemory burst(4, nullptr, &trims, &settled, absl::Milliseconds(1));
  for (int i = 0; i < 8; ++i) burst.Began();
  for (int i = 0; i < 8; ++i) burst.Ended();
  ASSERT_TRUE(burst.AwaitTrims(3, kGenerous));
  EXPECT_EQ(trims.value(), 2u);
  EXPECT_EQ(settled.value(), 1u);
  // One settling trim per burst: nothing more comes by itself.
  EXPECT_FALSE(burst.AwaitTrims(4, absl::Milliseconds(50)));
}

TEST(BurstMemoryTest, Settle_CallCameBeforeItWasDue_NoSettlingTrim) {
  BurstMemory burst(4, nullptr, nullptr, nullptr, absl::Milliseconds(20));
  for (int i = 0; i < 8; ++i) burst.Began();
  for (int i = 0; i < 8; ++i) burst.Ended();
  burst.Began();  // a call of no burst, before the settling trim
  EXPECT_EQ(burst.trims(), 2);
  EXPECT_FALSE(burst.AwaitTrims(3, absl::Milliseconds(200)));
  burst.Ended();  // no burst: no trim owed
  EXPECT_FALSE(burst.AwaitTrims(3, absl::Milliseconds(100)));
}

TEST(BurstMemoryTest, Destructor_SettlingTrimPending_ReturnsAtOnce) {
  auto burst = std::make_unique<BurstMemory>(4, nullptr, nullptr, nullptr,
                                             absl::Hours(1));
  for (int i = 0; i < 8; ++i) burst->Began();
  for (int i = 0; i < 8; ++i) burst->Ended();
  burst.reset();  // would hang for an hour if it waited for the trim
}

}  // namespace
}  // namespace chorus
