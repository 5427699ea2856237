// TaskRunner: runs each task on a thread of its own and lets the owner wait
// until all have finished. The worker uses it for calls that wait on peers
// (a collective's data plane), so gRPC's callback threads never block.
//
// Starting a thread costs more than a small collective, so a thread whose
// task ended parks for a while (blocked on a condition, not spinning) and
// takes the next task, and only a task that finds no parked thread starts
// a new one. Every task still gets a thread of its own at once: tasks never
// queue behind each other.
//
// Lifecycle: WaitIdle() waits for every task started so far; the destructor
// also waits for the parked threads to leave. Thread safety: all methods
// are thread-safe.
#ifndef CHORUS_SERVER_WORKER_TASK_RUNNER_H_
#define CHORUS_SERVER_WORKER_TASK_RUNNER_H_

#include <deque>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace chorus {

class TaskRunner {
 public:
  // How long a thread whose task ended waits for another before it exits.
  static constexpr absl::Duration kParkTime = absl::Seconds(10);

  TaskRunner() = default;
  ~TaskRunner();

  TaskRunner(const TaskRunner&) = delete;
  TaskRunner& operator=(const TaskRunner&) = delete;

  // Runs `task` on a parked thread, or on a new one when none is parked.
  void Spawn(std::function<void()> task);

  // Blocks until no task runs.
  void WaitIdle();

  // The threads that exist now: running a task or parked.
  int ThreadsForTesting();

 private:
  // A thread's life: its first task, then those it finds while parked.
  void Work(std::function<void()> task);
  bool HandedOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  int threads_ ABSL_GUARDED_BY(mu_) = 0;
  // Parked threads not yet given a task from `handed_`.
  int parked_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<std::function<void()>> handed_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_TASK_RUNNER_H_
