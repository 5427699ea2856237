// BurstMemory: gives the memory a burst of calls freed back to the system
// once the burst is over. glibc keeps freed memory in the arenas of the
// threads that freed it, so a daemon that served thousands of calls pending
// at once stays at its peak size, and the next burst, served by other
// threads, grows it further. Counting the calls alive, it trims the heap
// (malloc_trim) on the thread of the call that ends when at most an eighth of
// a burst of at least `burst_calls` is left (so that steady traffic, which
// never lets every call end, still gets trims), and once more when the last
// call of that burst ends, giving back what its tail freed.
//
// Lifecycle: lives as long as the calls it counts.
// Thread safety: Began() and Ended() may be called from any thread.
#ifndef CHORUS_SERVER_COMMON_BURST_MEMORY_H_
#define CHORUS_SERVER_COMMON_BURST_MEMORY_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/common/metrics.h"

namespace chorus {

class BurstMemory {
 public:
  // `alive` and `trims` (either may be null) follow the calls alive and
  // count the trims done.
  BurstMemory(int burst_calls, Level* alive, Counter* trims)
      : burst_calls_(burst_calls), alive_metric_(alive), trims_metric_(trims) {}

  // One more call alive.
  void Began();
  // One call fewer; trims the heap when it left at most an eighth of a
  // burst alive, and again when it was the last call of a trimmed burst.
  void Ended();

  // Times the heap was trimmed.
  int trims() const;

 private:
  const int burst_calls_;
  Level* const alive_metric_;
  Counter* const trims_metric_;
  mutable absl::Mutex mu_;
  int alive_ ABSL_GUARDED_BY(mu_) = 0;
  // The most calls alive at once since the last trim.
  int peak_ ABSL_GUARDED_BY(mu_) = 0;
  // Whether the last trim left calls alive: when the last of them ends, the
  // heap is trimmed again.
  bool tail_ ABSL_GUARDED_BY(mu_) = false;
  int trims_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_COMMON_BURST_MEMORY_H_
