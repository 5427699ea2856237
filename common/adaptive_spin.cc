#include "common/adaptive_spin.h"

#include <sched.h>

#include <algorithm>

namespace chorus {

AdaptiveSpin::AdaptiveSpin(absl::Duration max) : max_ns_(0), budget_ns_(0) {
  set_max(max);
}

void AdaptiveSpin::set_max(absl::Duration max) {
  const int64_t ns = std::max<int64_t>(0, absl::ToInt64Nanoseconds(max));
  max_ns_.store(ns, std::memory_order_relaxed);
  budget_ns_.store(ns, std::memory_order_relaxed);
}

void AdaptiveSpin::Caught() {
  budget_ns_.store(max_ns_.load(std::memory_order_relaxed),
                   std::memory_order_relaxed);
}

void AdaptiveSpin::Missed(int64_t budget) {
  const int64_t max = max_ns_.load(std::memory_order_relaxed);
  budget_ns_.store(std::max(max / 16, budget - max / 8),
                   std::memory_order_relaxed);
}

absl::Duration AdaptiveSpin::Yield(absl::Time now) {
  // A yield with nothing else to run returns within a microsecond or two.
  constexpr absl::Duration kAlone = absl::Microseconds(2);
  sched_yield();
  const absl::Duration took = absl::Now() - now;
  return took > kAlone ? took : absl::ZeroDuration();
}

}  // namespace chorus
