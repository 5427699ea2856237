#include "server/coordinator/event_hub.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace chorus {

EventHub::EventHub(size_t queue_limit)
    : queue_limit_(std::max<size_t>(queue_limit, 1)) {}

uint64_t EventHub::Subscribe(WakeCallback wake) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  subscribers_by_id_[id].wake = std::move(wake);
  subscribers_.store(subscribers_by_id_.size());
  return id;
}

void EventHub::Unsubscribe(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = subscribers_by_id_.find(id);
  if (it == subscribers_by_id_.end()) return;
  Subscriber& subscriber = it->second;
  subscriber.leaving = true;
  subscriber.queue.clear();
  mu_.Await(absl::Condition(
      +[](Subscriber* s) { return s->waking == 0; }, &subscriber));
  subscribers_by_id_.erase(it);
  subscribers_.store(subscribers_by_id_.size());
}

EventHub::Poll EventHub::Next(uint64_t id, Event* event) {
  absl::MutexLock lock(&mu_);
  auto it = subscribers_by_id_.find(id);
  if (it == subscribers_by_id_.end() || it->second.leaving) {
    return Poll::kClosed;
  }
  Subscriber& subscriber = it->second;
  if (subscriber.dropped > 0) {
    *event = Event();
    event->kind = Event::Kind::kEventsDropped;
    event->time = subscriber.dropped_at;
    event->dropped = subscriber.dropped;
    event->text = absl::StrCat(subscriber.dropped,
                               subscriber.dropped == 1 ? " event" : " events",
                               " dropped: this watcher fell more than ",
                               queue_limit_, " events behind");
    subscriber.dropped = 0;
    return Poll::kEvent;
  }
  if (!subscriber.queue.empty()) {
    *event = std::move(subscriber.queue.front());
    subscriber.queue.pop_front();
    return Poll::kEvent;
  }
  if (closed_) return Poll::kClosed;
  subscriber.waiting = true;
  return Poll::kEmpty;
}

bool EventHub::Publish(const Event& event) {
  if (subscribers_.load(std::memory_order_relaxed) == 0) return false;
  absl::MutexLock lock(&mu_);
  if (closed_) return false;
  bool wake = false;
  for (auto& [id, subscriber] : subscribers_by_id_) {
    if (subscriber.leaving) continue;
    if (subscriber.queue.size() == queue_limit_) {
      subscriber.dropped_at = subscriber.queue.front().time;
      subscriber.queue.pop_front();
      ++subscriber.dropped;
    }
    subscriber.queue.push_back(event);
    if (subscriber.waiting) {
      subscriber.waiting = false;
      subscriber.wake_due = true;
      wake = true;
    }
  }
  return wake;
}

void EventHub::Wake() {
  std::vector<Subscriber*> due;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, subscriber] : subscribers_by_id_) {
      if (!subscriber.wake_due || subscriber.leaving) continue;
      subscriber.wake_due = false;
      ++subscriber.waking;
      due.push_back(&subscriber);
    }
  }
  if (due.empty()) return;
  // Unsubscribe() waits for `waking` to drop, so each stays valid here.
  for (Subscriber* subscriber : due) {
    subscriber->wake();
    absl::MutexLock lock(&mu_);
    --subscriber->waking;
  }
}

void EventHub::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    for (auto& [id, subscriber] : subscribers_by_id_) {
      if (subscriber.waiting) {
        subscriber.waiting = false;
        subscriber.wake_due = true;
      }
    }
  }
  Wake();
}

}  // namespace chorus
