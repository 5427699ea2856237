#include "server/worker/task_runner.h"

#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

TEST(TaskRunnerTest, Spawn_AfterATaskEnded_ReusesItsParkedThread) {
  TaskRunner runner;
  std::thread::id first;
  std::thread::id second;
  runner.Spawn([&first] { first = std::this_thread::get_id(); });
  runner.WaitIdle();
  runner.Spawn([&second] { second = std::this_thread::get_id(); });
  runner.WaitIdle();
  EXPECT_EQ(first, second);
  EXPECT_EQ(runner.ThreadsForTesting(), 1);
}

TEST(TaskRunnerTest, Spawn_WhileTasksBlock_EachGetsAThreadOfItsOwn) {
  TaskRunner runner;
  constexpr int kTasks = 8;
  absl::Mutex mu;
  int started = 0;
  absl::Notification release;
  for (int i = 0; i < kTasks; ++i) {
    runner.Spawn([&] {
      {
        absl::MutexLock lock(&mu);
        ++started;
      }
      release.WaitForNotification();
    });
  }
  {
    // Every task starts although none has ended: none queued behind another.
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](int* n) { return *n == kTasks; }, &started));
  }
  EXPECT_EQ(runner.ThreadsForTesting(), kTasks);
  release.Notify();
  runner.WaitIdle();
  // The parked threads take the next burst.
  absl::Notification second_done;
  int second_ran = 0;
  for (int i = 0; i < kTasks; ++i) {
    runner.Spawn([&] {
      absl::MutexLock lock(&mu);
      if (++second_ran == kTasks) second_done.Notify();
    });
  }
  second_done.WaitForNotification();
  runner.WaitIdle();
  EXPECT_EQ(runner.ThreadsForTesting(), kTasks);
}

TEST(TaskRunnerTest, Destructor_WithParkedThreads_WaitsForThemToLeave) {
  std::vector<int> results(4, 0);
  {
    TaskRunner runner;
    for (int i = 0; i < 4; ++i) {
      runner.Spawn([&results, i] { results[i] = i + 1; });
    }
  }  // must not hang for kParkTime, nor leave a thread touching the runner
  EXPECT_EQ(results, (std::vector<int>{1, 2, 3, 4}));
}

}  // namespace
}  // namespace chorus
