// CancelSignal: tells work started on a caller's behalf that the caller went
// away (its RPC was cancelled), so that the work can stop: a daemon's join
// for a client that died while it waited cancels its join at the
// coordinator, so that a newcomer killed while it waited is never admitted.
//
// Lifecycle: shared (std::shared_ptr) by the door that learns of the
// cancellation and the work that reacts to it; either may outlive the
// other. Thread safety: all methods are thread-safe; the reaction runs on
// the thread that calls Cancel() or OnCancel(), outside the signal's lock.
#ifndef CHORUS_SERVER_WORKER_CANCEL_SIGNAL_H_
#define CHORUS_SERVER_WORKER_CANCEL_SIGNAL_H_

#include <functional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace chorus {

class CancelSignal {
 public:
  // The caller went away: runs the reaction set, once; later calls do
  // nothing.
  void Cancel() {
    std::function<void()> react;
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) return;
      cancelled_ = true;
      react = std::move(react_);
      react_ = nullptr;
    }
    if (react) react();
  }

  // Sets what to do on Cancel() (replacing an earlier reaction), or runs it
  // now when the signal was cancelled already.
  void OnCancel(std::function<void()> react) {
    {
      absl::MutexLock lock(&mu_);
      if (!cancelled_) {
        react_ = std::move(react);
        return;
      }
    }
    react();
  }

  // Drops the reaction: the work it would stop has ended. A Cancel()
  // running at the same time may still run it.
  void Clear() {
    absl::MutexLock lock(&mu_);
    react_ = nullptr;
  }

  // Whether Cancel() was called.
  bool cancelled() const {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> react_ ABSL_GUARDED_BY(mu_);
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_CANCEL_SIGNAL_H_
