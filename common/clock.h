// Clock: where the core logic reads the time, so unit tests can drive it with
// a fake clock instead of sleeping.
//
// Implementations must be thread-safe. RealClock::Get() lives for the whole
// program.
#ifndef CHORUS_COMMON_CLOCK_H_
#define CHORUS_COMMON_CLOCK_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace chorus {

class Clock {
 public:
  virtual ~Clock() = default;
  // Returns the current time.
  virtual absl::Time Now() const = 0;
};

// The system clock.
class RealClock final : public Clock {
 public:
  // Returns the process-wide instance; never null, never destroyed.
  static Clock* Get() {
    static RealClock* clock = new RealClock();
    return clock;
  }
  absl::Time Now() const override { return absl::Now(); }
};

}  // namespace chorus

#endif  // CHORUS_COMMON_CLOCK_H_
