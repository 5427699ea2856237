#include "common/wakeup_loop.h"

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

TEST(WakeupLoop, StartStop_StepWantsNothing_StopsPromptly) {
  int steps = 0;
  WakeupLoop loop([&steps] {
    ++steps;
    return absl::InfiniteFuture();
  });
  loop.Start();
  loop.Stop();  // must not wait for a wake time that never comes
  loop.Stop();  // idempotent
  EXPECT_GE(steps, 1);
}

TEST(WakeupLoop, Poke_RunsStepAgain) {
  absl::Mutex mu;
  int steps = 0;
  WakeupLoop loop([&] {
    absl::MutexLock lock(&mu);
    ++steps;
    return absl::InfiniteFuture();
  });
  loop.Start();
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](int* s) { return *s >= 1; }, &steps));
  }
  loop.Poke();
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](int* s) { return *s >= 2; }, &steps));
  }
  loop.Stop();
}

}  // namespace
}  // namespace chorus
