#include "server/common/burst_memory.h"

#include <malloc.h>

#include <algorithm>

namespace chorus {

void BurstMemory::Began() {
  if (alive_metric_ != nullptr) alive_metric_->Add();
  absl::MutexLock lock(&mu_);
  peak_ = std::max(peak_, ++alive_);
}

void BurstMemory::Ended() {
  if (alive_metric_ != nullptr) alive_metric_->Sub();
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
    ++trims_;
  }
  // Outside the lock: trimming a large heap takes milliseconds.
  malloc_trim(0);
  // Counted once done: a reader of the metric sees the trimmed heap.
  if (trims_metric_ != nullptr) trims_metric_->Add();
}

int BurstMemory::trims() const {
  absl::MutexLock lock(&mu_);
  return trims_;
}

}  // namespace chorus
