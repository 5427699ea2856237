// FakeClock: a Clock that only moves when a test advances it, so lease and
// deadline logic is tested without sleeping.
//
// Thread-safe.
#ifndef CHORUS_TESTS_TESTING_FAKE_CLOCK_H_
#define CHORUS_TESTS_TESTING_FAKE_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"

namespace chorus {

class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1700000000))
      : now_(start) {}

  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }

  // Moves the clock forward by `d`.
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace chorus

#endif  // CHORUS_TESTS_TESTING_FAKE_CLOCK_H_
