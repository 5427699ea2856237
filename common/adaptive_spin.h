// AdaptiveSpin: how long a thread that is about to block until a peer's
// message arrives first polls for it, giving its core to any other runnable
// thread between polls (sched_yield), so it never holds a core another
// thread is waiting for. A thread woken from a blocking wait takes tens of
// microseconds to run again on the virtual machines Chorus is measured on; a
// polling one sees the message within a microsecond or two.
//
// Adaptive: a spin that sees its event restores the full budget; one that
// ends without it shrinks the budget by an eighth of the maximum, down to a
// sixteenth, so places whose waits are long (large transfers, a straggling
// peer) soon spend almost nothing polling, and one short wait brings the
// budget back. A spin also ends once other threads have run on its core for
// kGivenEnough of it: they need the core more than this wait does.
//
// Exists because: with a 50 us budget in the coordinator's call port and the
// worker's call port client, call socket and data-plane inbox, an 8-byte
// all_reduce took 0.19x of its time at 2 ranks and 0.59x at 4 on one 2-core
// host, and a 1 MiB same_host one 0.83x and 0.90x (bench/README.md,
// "Polling before blocking").
//
// Lifecycle: one per place that waits (an inbox, a serving loop, a client
// connection), shared by its waits. Thread safety: thread-safe.
#ifndef CHORUS_COMMON_ADAPTIVE_SPIN_H_
#define CHORUS_COMMON_ADAPTIVE_SPIN_H_

#include <atomic>
#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace chorus {

// The budget daemons and embedded runtimes use unless told otherwise
// (--spin).
inline constexpr absl::Duration kDefaultSpin = absl::Microseconds(50);

class AdaptiveSpin {
 public:
  // Spins at most `max` per wait; zero or less: never spins.
  explicit AdaptiveSpin(absl::Duration max = kDefaultSpin);

  AdaptiveSpin(const AdaptiveSpin&) = delete;
  AdaptiveSpin& operator=(const AdaptiveSpin&) = delete;

  // Calls `ready` until it returns true or the current budget has passed,
  // yielding the core between calls. Returns whether `ready` returned true
  // (false at once when spinning is off). `ready` must not block.
  template <typename Ready>
  bool Spin(Ready&& ready) {
    const int64_t budget = budget_ns_.load(std::memory_order_relaxed);
    if (budget <= 0) return false;
    const absl::Time until = absl::Now() + absl::Nanoseconds(budget);
    absl::Duration given = absl::ZeroDuration();
    while (true) {
      if (ready()) {
        Caught();
        return true;
      }
      const absl::Time now = absl::Now();
      // Yields that ran other threads on this core for long: they need it,
      // so this one blocks instead.
      if (now >= until || given > kGivenEnough) {
        Missed(budget);
        return false;
      }
      given += Yield(now);
    }
  }

  // The budget the next wait spins for.
  absl::Duration budget() const {
    return absl::Nanoseconds(budget_ns_.load(std::memory_order_relaxed));
  }

  // Spins at most `max` per wait from now on (zero: never), the budget
  // restored to it.
  void set_max(absl::Duration max);

 private:
  void Caught();
  void Missed(int64_t budget);
  // Other threads ran on this core for this long during one spin: they
  // need the core, and the spin ends.
  static constexpr absl::Duration kGivenEnough = absl::Microseconds(10);
  // Yields the core; returns how long other threads ran meanwhile (the time
  // since `now`, less what a yield with nothing else to run takes).
  static absl::Duration Yield(absl::Time now);

  std::atomic<int64_t> max_ns_;
  std::atomic<int64_t> budget_ns_;
};

}  // namespace chorus

#endif  // CHORUS_COMMON_ADAPTIVE_SPIN_H_
