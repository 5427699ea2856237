#include "common/wakeup_loop.h"

#include <utility>

namespace chorus {

WakeupLoop::WakeupLoop(std::function<absl::Time()> step)
    : step_(std::move(step)) {}

WakeupLoop::~WakeupLoop() { Stop(); }

void WakeupLoop::Start() {
  thread_ = std::thread([this] { Run(); });
}

void WakeupLoop::Poke() {
  absl::MutexLock lock(&mu_);
  poked_ = true;
}

void WakeupLoop::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void WakeupLoop::Run() {
  while (true) {
    const absl::Time wake = step_();
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || poked_;
    };
    mu_.AwaitWithDeadline(absl::Condition(&ready), wake);
    if (stopping_) return;
    poked_ = false;
  }
}

}  // namespace chorus
