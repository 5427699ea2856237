#include "server/worker/task_runner.h"

#include <thread>
#include <utility>

namespace chorus {

TaskRunner::~TaskRunner() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  mu_.Await(absl::Condition(
      +[](int* threads) { return *threads == 0; }, &threads_));
}

void TaskRunner::Spawn(std::function<void()> task) {
  {
    absl::MutexLock lock(&mu_);
    ++running_;
    if (parked_ > 0) {
      --parked_;
      handed_.push_back(std::move(task));
      return;
    }
    ++threads_;
  }
  std::thread([this, task = std::move(task)]() mutable {
    Work(std::move(task));
  }).detach();
}

void TaskRunner::Work(std::function<void()> task) {
  while (true) {
    task();
    task = nullptr;  // its captures go before the thread parks
    absl::MutexLock lock(&mu_);
    --running_;
    ++parked_;
    mu_.AwaitWithTimeout(absl::Condition(this, &TaskRunner::HandedOrStopping),
                         kParkTime);
    if (handed_.empty()) {
      // Nothing came (or the runner is going): leave. No Spawn() counted
      // on this thread, since it found handed_ empty.
      --parked_;
      --threads_;
      return;
    }
    task = std::move(handed_.front());
    handed_.pop_front();
  }
}

bool TaskRunner::HandedOrStopping() const {
  return !handed_.empty() || stopping_;
}

void TaskRunner::WaitIdle() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* running) { return *running == 0; }, &running_));
}

int TaskRunner::ThreadsForTesting() {
  absl::MutexLock lock(&mu_);
  return threads_;
}

}  // namespace chorus
