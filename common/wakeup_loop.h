// WakeupLoop: a background thread that runs a step whenever its chosen wake
// time arrives (lease eviction, call deadlines). The step returns the next
// time it wants to run; Poke() makes it run again at once, e.g. after a new,
// earlier deadline was added.
//
// Lifecycle: Start() once; Stop() or the destructor stops and joins the
// thread. Between steps the thread waits on a condition with a deadline; it
// never spins. Thread safety: Poke() from any thread; Start/Stop from the
// owner.
#ifndef CHORUS_COMMON_WAKEUP_LOOP_H_
#define CHORUS_COMMON_WAKEUP_LOOP_H_

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace chorus {

class WakeupLoop {
 public:
  // `step` runs on the loop's thread without the loop's lock held and
  // returns the next wall-clock time it wants to run (InfiniteFuture() to
  // wait for a Poke()).
  explicit WakeupLoop(std::function<absl::Time()> step);
  ~WakeupLoop();

  WakeupLoop(const WakeupLoop&) = delete;
  WakeupLoop& operator=(const WakeupLoop&) = delete;

  void Start();
  // Makes the step run again as soon as possible.
  void Poke();
  // Stops and joins the thread; idempotent.
  void Stop();

 private:
  void Run();

  const std::function<absl::Time()> step_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool poked_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace chorus

#endif  // CHORUS_COMMON_WAKEUP_LOOP_H_
