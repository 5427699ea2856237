// WaitUntil: polls a condition that another process will make true (a worker
// appears in the registry, a file is written), with a deadline. This is the
// only way the integration tests wait for something to happen; they never
// sleep for a fixed time and hope.
//
// Stateless; thread-safe as long as the predicate is.
#ifndef CHORUS_TESTS_TESTING_WAIT_H_
#define CHORUS_TESTS_TESTING_WAIT_H_

#include <algorithm>
#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace chorus::test {

// The pause between two evaluations of a WaitUntil predicate.
inline constexpr absl::Duration kDefaultPollPause = absl::Milliseconds(25);

// Evaluates `predicate` until it returns true or `timeout` has passed,
// pausing `pause` between evaluations. The predicate is evaluated at least
// once, and once more at the deadline. Returns true when the predicate
// returned true, false when the deadline passed first.
inline bool WaitUntil(const std::function<bool()>& predicate,
                      absl::Duration timeout,
                      absl::Duration pause = kDefaultPollPause) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (predicate()) return true;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    absl::SleepFor(std::min(left, pause));
  }
}

}  // namespace chorus::test

#endif  // CHORUS_TESTS_TESTING_WAIT_H_
