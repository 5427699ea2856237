// BurstMemory: gives the memory a burst of calls freed back to the system
// once the burst is over. glibc keeps freed memory in the arenas of the
// threads that freed it, so a daemon that served thousands of calls pending
// at once stays at its peak size, and the next burst, served by other
// threads, grows it further. Counting the calls alive, it trims the heap
// (malloc_trim) on the thread of the call that ends when at most an eighth of
// a burst of at least `burst_calls` is left (so that steady traffic, which
// never lets every call end, still gets trims), and once more when the last
// call of that burst ends, giving back what its tail freed. gRPC releases
// some of a call's memory after the call ended (its stream, on gRPC's own
// threads, later when the machine is busy), so a burst that ended with no
// call alive is trimmed a third time `settle` later, on a thread of its own,
// unless a new call came meanwhile (its burst's trims then do it).
//
// Lifecycle: lives as long as the calls it counts; the destructor stops the
// settling thread.
// Thread safety: Began() and Ended() may be called from any thread.
#ifndef CHORUS_COMMON_BURST_MEMORY_H_
#define CHORUS_COMMON_BURST_MEMORY_H_

#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics.h"

namespace chorus {

// How long after a burst's last call the heap is trimmed once more.
inline constexpr absl::Duration kBurstSettle = absl::Seconds(1);

class BurstMemory {
 public:
  // `alive`, `trims` and `settled_trims` (any may be null) follow the calls
  // alive, count the trims as a burst ends and the trims `settle` after it.
  BurstMemory(int burst_calls, Level* alive, Counter* trims,
              Counter* settled_trims, absl::Duration settle = kBurstSettle);
  ~BurstMemory();

  BurstMemory(const BurstMemory&) = delete;
  BurstMemory& operator=(const BurstMemory&) = delete;

  // One more call alive.
  void Began();
  // One call fewer; trims the heap when it left at most an eighth of a
  // burst alive, and again when it was the last call of a trimmed burst.
  void Ended();

  // Times the heap was trimmed, of either kind (counted once done).
  int trims() const;
  // Waits until the heap was trimmed `count` times; returns false when
  // `timeout` passed first.
  bool AwaitTrims(int count, absl::Duration timeout) const;

 private:
  // The settling thread: trims `settle_` after a burst's last call.
  void Settle();
  // Trims the heap and counts it in `metric` (may be null); called without
  // the lock.
  static void Trim(Counter* metric);

  const int burst_calls_;
  Level* const alive_metric_;
  Counter* const trims_metric_;
  Counter* const settled_metric_;
  const absl::Duration settle_;
  mutable absl::Mutex mu_;
  int alive_ ABSL_GUARDED_BY(mu_) = 0;
  // The most calls alive at once since the last trim.
  int peak_ ABSL_GUARDED_BY(mu_) = 0;
  // Whether the last trim left calls alive: when the last of them ends, the
  // heap is trimmed again.
  bool tail_ ABSL_GUARDED_BY(mu_) = false;
  // When the settling trim is due; InfiniteFuture() when none is.
  absl::Time settle_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  int trims_ ABSL_GUARDED_BY(mu_) = 0;
  // The settling thread waits on its own lock, so that Began() and Ended()
  // never wake it or run its wait's checks: only a burst's end signals it.
  // Acquired before mu_ where both are held.
  absl::Mutex settle_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::CondVar settle_cv_;
  bool stopping_ ABSL_GUARDED_BY(settle_mu_) = false;
  std::thread settler_;
};

}  // namespace chorus

#endif  // CHORUS_COMMON_BURST_MEMORY_H_
