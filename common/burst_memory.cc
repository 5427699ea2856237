#include "common/burst_memory.h"

#include <malloc.h>

#include <algorithm>

namespace chorus {

BurstMemory::BurstMemory(int burst_calls, Level* alive, Counter* trims,
                         Counter* settled_trims, absl::Duration settle)
    : burst_calls_(burst_calls),
      alive_metric_(alive),
      trims_metric_(trims),
      settled_metric_(settled_trims),
      settle_(settle),
      settler_([this] { Settle(); }) {}

BurstMemory::~BurstMemory() {
  {
    absl::MutexLock lock(&settle_mu_);
    stopping_ = true;
    settle_cv_.Signal();
  }
  settler_.join();
}

void BurstMemory::Began() {
  if (alive_metric_ != nullptr) alive_metric_->Add();
  absl::MutexLock lock(&mu_);
  peak_ = std::max(peak_, ++alive_);
  // The new calls' own trims come instead.
  settle_at_ = absl::InfiniteFuture();
}

void BurstMemory::Ended() {
  if (alive_metric_ != nullptr) alive_metric_->Sub();
  bool settle = false;
  {
    absl::MutexLock lock(&mu_);
    --alive_;
    const bool burst_over =
        peak_ >= burst_calls_ && (alive_ == 0 || alive_ * 8 <= peak_);
    const bool tail_over = tail_ && alive_ == 0;
    if (!burst_over && !tail_over) return;
    // What is still alive may make the next trim's burst, and is its tail.
    peak_ = alive_;
    tail_ = alive_ > 0;
    if (alive_ == 0) {
      settle_at_ = absl::Now() + settle_;
      settle = true;
    }
  }
  if (settle) {
    absl::MutexLock lock(&settle_mu_);
    settle_cv_.Signal();
  }
  Trim(trims_metric_);
  absl::MutexLock lock(&mu_);
  ++trims_;
}

void BurstMemory::Trim(Counter* metric) {
  // Outside the lock: trimming a large heap takes milliseconds.
  malloc_trim(0);
  // Counted once done: a reader of the metric sees the trimmed heap.
  if (metric != nullptr) metric->Add();
}

void BurstMemory::Settle() {
  settle_mu_.Lock();
  while (!stopping_) {
    absl::Time due;
    bool taken = false;
    {
      absl::MutexLock calls_lock(&mu_);
      due = settle_at_;
      // Due, and not moved by a call or a burst since: taken now.
      if (due <= absl::Now()) {
        settle_at_ = absl::InfiniteFuture();
        taken = true;
      }
    }
    if (!taken) {
      // Until it is due, or a burst's end or the destructor signals.
      settle_cv_.WaitWithDeadline(&settle_mu_, due);
      continue;
    }
    settle_mu_.Unlock();
    Trim(settled_metric_);
    {
      absl::MutexLock calls_lock(&mu_);
      ++trims_;
    }
    settle_mu_.Lock();
  }
  settle_mu_.Unlock();
}

int BurstMemory::trims() const {
  absl::MutexLock lock(&mu_);
  return trims_;
}

bool BurstMemory::AwaitTrims(int count, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto reached = [this, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return trims_ >= count;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

}  // namespace chorus
