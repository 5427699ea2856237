// EventHub: the coordinator's event stream inside the process. The core
// publishes plain Events (chorus/event.h) as things happen; every subscriber
// (a WatchEvents stream) has its own bounded queue and takes events from it
// at its own pace. A subscriber that falls behind loses its oldest events,
// and the next event it takes is a kEventsDropped saying how many.
//
// Publishing is split in two so that it can happen under the group table's
// lock, in the order things happened there, without calling out: Publish()
// only appends to the queues under the hub's own lock (held for a few queue
// operations, never while calling anything), and returns whether some
// subscriber waits to be woken; Wake() then runs those subscribers' wake
// callbacks, and must be called after the caller released its locks.
//
// A subscriber is woken once each time an event arrives after Next() told
// it that its queue was empty (kEmpty), so it takes events until Next()
// says kEmpty again and then waits for its wake.
//
// Lifecycle: owned by the coordinator core. Close() (at shutdown) ends every
// subscription: subscribers take what is queued, then Next() says kClosed.
// Thread safety: every method is thread-safe.
#ifndef CHORUS_SERVER_COORDINATOR_EVENT_HUB_H_
#define CHORUS_SERVER_COORDINATOR_EVENT_HUB_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/event.h"

namespace chorus {

class EventHub {
 public:
  // Runs on the thread that calls Wake() or Close(), with no hub lock held.
  using WakeCallback = std::function<void()>;
  enum class Poll { kEvent, kEmpty, kClosed };

  // How many events a subscriber's queue holds by default.
  static constexpr size_t kDefaultQueueLimit = 1024;

  // Each subscriber's queue holds at most `queue_limit` (at least 1) events.
  explicit EventHub(size_t queue_limit = kDefaultQueueLimit);

  EventHub(const EventHub&) = delete;
  EventHub& operator=(const EventHub&) = delete;

  // Adds a subscriber that sees every event published from now on, and
  // returns its id (never 0). `wake` runs when an event arrives for it
  // after Next() returned kEmpty (and once at the start, if an event comes
  // before its first Next()), and when the hub closes. After Close(), the
  // new subscriber's Next() says kClosed.
  uint64_t Subscribe(WakeCallback wake);

  // Removes subscriber `id` and drops its queue; an unknown id is ignored.
  // When it returns, the subscriber's wake callback is not running (on
  // another thread) and never runs again, so the subscriber may be
  // destroyed. Must not be called from that wake callback.
  void Unsubscribe(uint64_t id);

  // Takes subscriber `id`'s next event into `event` (kEvent): first a
  // kEventsDropped if it lost events, then its queued events in the order
  // they were published. kEmpty when none is queued (the subscriber is then
  // woken by the next one); kClosed after Close() once its queue is empty,
  // or for an unknown id.
  Poll Next(uint64_t id, Event* event);

  // Queues `event` for every subscriber, dropping a full queue's oldest
  // event. Never calls anything, so it may be called under any lock.
  // Returns true when a subscriber is to be woken: call Wake() once the
  // caller's locks are released.
  bool Publish(const Event& event);

  // Runs the wake callbacks that Publish() made due. Call without holding
  // locks the callbacks may need.
  void Wake();

  // Ends every subscription and wakes every subscriber waiting for events
  // (see Next). Later publications are ignored. Call without holding locks
  // the wake callbacks may need.
  void Close();

  size_t queue_limit() const { return queue_limit_; }

 private:
  struct Subscriber {
    WakeCallback wake;
    std::deque<Event> queue;
    // Events dropped since the last kEventsDropped, and when the last of
    // them happened.
    uint64_t dropped = 0;
    absl::Time dropped_at;
    // The subscriber waits for its wake (Next said kEmpty), and the wake
    // is due (not yet run by Wake).
    bool waiting = true;
    bool wake_due = false;
    // Wake callbacks of this subscriber running now, outside the lock.
    int waking = 0;
    // Unsubscribe() is waiting for the running wakes to end.
    bool leaving = false;
  };

  const size_t queue_limit_;
  // The number of subscribers, read without the lock so that Publish()
  // returns at once when nobody watches.
  std::atomic<size_t> subscribers_{0};

  absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  // A map, so that a subscriber's address stays valid while its wake runs
  // outside the lock.
  std::map<uint64_t, Subscriber> subscribers_by_id_ ABSL_GUARDED_BY(mu_);
};

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_EVENT_HUB_H_
