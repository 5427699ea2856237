// TaskRunner: runs each task on a thread of its own and lets the owner wait
// until all have finished. The worker uses it for calls that wait on peers
// (a collective's data plane), so gRPC's callback threads never block.
//
// Lifecycle: WaitIdle() (also run by the destructor) waits for every task
// started so far. Thread safety: all methods are thread-safe.
#ifndef CHORUS_SERVER_WORKER_TASK_RUNNER_H_
#define CHORUS_SERVER_WORKER_TASK_RUNNER_H_

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace chorus {

class TaskRunner {
 public:
  TaskRunner() = default;
  ~TaskRunner() { WaitIdle(); }

  TaskRunner(const TaskRunner&) = delete;
  TaskRunner& operator=(const TaskRunner&) = delete;

  // Starts `task` on a new detached thread.
  void Spawn(std::function<void()> task) {
    {
      absl::MutexLock lock(&mu_);
      ++running_;
    }
    std::thread([this, task = std::move(task)] {
      task();
      absl::MutexLock lock(&mu_);
      --running_;
    }).detach();
  }

  // Blocks until no task runs.
  void WaitIdle() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* running) { return *running == 0; }, &running_));
  }

 private:
  absl::Mutex mu_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_TASK_RUNNER_H_
