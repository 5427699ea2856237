// CancelSignal: the reaction runs once, at once when set after the
// cancellation, and not at all once cleared.
#include "server/worker/cancel_signal.h"

#include "gtest/gtest.h"

namespace chorus {
namespace {

TEST(CancelSignalTest, Cancel_ReactionSet_RunsItOnce) {
  CancelSignal signal;
  int runs = 0;
  signal.OnCancel([&] { ++runs; });
  EXPECT_FALSE(signal.cancelled());
  signal.Cancel();
  signal.Cancel();
  EXPECT_TRUE(signal.cancelled());
  EXPECT_EQ(runs, 1);
}

TEST(CancelSignalTest, OnCancel_AlreadyCancelled_RunsAtOnce) {
  CancelSignal signal;
  signal.Cancel();
  int runs = 0;
  signal.OnCancel([&] { ++runs; });
  EXPECT_EQ(runs, 1);
}

TEST(CancelSignalTest, OnCancel_Replaced_OnlyTheLastRuns) {
  CancelSignal signal;
  int first = 0;
  int second = 0;
  signal.OnCancel([&] { ++first; });
  signal.OnCancel([&] { ++second; });
  signal.Cancel();
  EXPECT_EQ(first, 0);
  EXPECT_EQ(second, 1);
}

TEST(CancelSignalTest, Clear_ThenCancel_NothingRuns) {
  CancelSignal signal;
  int runs = 0;
  signal.OnCancel([&] { ++runs; });
  signal.Clear();
  signal.Cancel();
  EXPECT_EQ(runs, 0);
  EXPECT_TRUE(signal.cancelled());
}

}  // namespace
}  // namespace chorus
