#include "common/adaptive_spin.h"

#include <atomic>
#include <thread>

#include "gtest/gtest.h"

namespace chorus {
namespace {

TEST(AdaptiveSpinTest, Spin_ZeroMax_FalseWithoutAsking) {
  AdaptiveSpin spin(absl::ZeroDuration());
  int asked = 0;
  EXPECT_FALSE(spin.Spin([&] {
    ++asked;
    return true;
  }));
  EXPECT_EQ(asked, 0);
  EXPECT_EQ(spin.budget(), absl::ZeroDuration());
}

TEST(AdaptiveSpinTest, Spin_ReadyAtOnce_TrueAndBudgetKept) {
  AdaptiveSpin spin(absl::Microseconds(80));
  EXPECT_TRUE(spin.Spin([] { return true; }));
  EXPECT_EQ(spin.budget(), absl::Microseconds(80));
}

TEST(AdaptiveSpinTest, Spin_NeverReady_BudgetShrinksToSixteenth) {
  AdaptiveSpin spin(absl::Microseconds(80));
  EXPECT_FALSE(spin.Spin([] { return false; }));
  EXPECT_EQ(spin.budget(), absl::Microseconds(70));
  for (int i = 0; i < 20; ++i) spin.Spin([] { return false; });
  EXPECT_EQ(spin.budget(), absl::Microseconds(5));
}

TEST(AdaptiveSpinTest, Spin_ReadyAfterMisses_FullBudgetBack) {
  AdaptiveSpin spin(absl::Microseconds(80));
  for (int i = 0; i < 20; ++i) spin.Spin([] { return false; });
  ASSERT_EQ(spin.budget(), absl::Microseconds(5));
  EXPECT_TRUE(spin.Spin([] { return true; }));
  EXPECT_EQ(spin.budget(), absl::Microseconds(80));
}

TEST(AdaptiveSpinTest, Spin_EventFromAnotherThread_Seen) {
  AdaptiveSpin spin(absl::Milliseconds(10));
  std::atomic<bool> set{false};
  std::thread setter([&] { set.store(true); });
  // A spin may end early when the setter needs this core; a later one sees
  // the flag.
  bool seen = false;
  while (!seen) seen = spin.Spin([&] { return set.load(); });
  setter.join();
  EXPECT_EQ(spin.budget(), absl::Milliseconds(10));
}

TEST(AdaptiveSpinTest, SetMax_Zero_StopsSpinning) {
  AdaptiveSpin spin(absl::Microseconds(80));
  spin.set_max(absl::ZeroDuration());
  EXPECT_FALSE(spin.Spin([] { return true; }));
  spin.set_max(absl::Microseconds(40));
  EXPECT_EQ(spin.budget(), absl::Microseconds(40));
}

}  // namespace
}  // namespace chorus
