// The event hub on its own: every subscriber sees every event in order, is
// woken once per wait, loses the oldest events when it falls behind (and
// hears how many), and ends after Close() with what was queued.
#include "server/coordinator/event_hub.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

Event Numbered(int n) {
  Event event;
  event.kind = Event::Kind::kGroupFormed;
  event.time = absl::FromUnixSeconds(1700000000 + n);
  event.group = absl::StrCat("g", n);
  return event;
}

// Takes every queued event of subscriber `id`; the last poll's result goes
// to `last`.
std::vector<std::string> TakeAll(EventHub& hub, uint64_t id,
                                 EventHub::Poll* last = nullptr) {
  std::vector<std::string> groups;
  Event event;
  EventHub::Poll poll;
  while ((poll = hub.Next(id, &event)) == EventHub::Poll::kEvent) {
    groups.push_back(event.kind == Event::Kind::kEventsDropped
                         ? absl::StrCat("dropped ", event.dropped)
                         : event.group);
  }
  if (last != nullptr) *last = poll;
  return groups;
}

TEST(EventHubTest, Publish_NoSubscriber_NothingToWake) {
  EventHub hub;
  EXPECT_FALSE(hub.Publish(Numbered(1)));
  hub.Wake();
}

TEST(EventHubTest, Next_TwoSubscribers_EachSeesEveryEventInOrder) {
  EventHub hub;
  const uint64_t a = hub.Subscribe([] {});
  const uint64_t b = hub.Subscribe([] {});
  EXPECT_NE(a, b);
  for (int n = 1; n <= 3; ++n) hub.Publish(Numbered(n));
  EXPECT_EQ(TakeAll(hub, a), (std::vector<std::string>{"g1", "g2", "g3"}));
  EXPECT_EQ(TakeAll(hub, b), (std::vector<std::string>{"g1", "g2", "g3"}));
}

TEST(EventHubTest, Subscribe_AfterPublish_SeesOnlyLaterEvents) {
  EventHub hub;
  const uint64_t early = hub.Subscribe([] {});
  hub.Publish(Numbered(1));
  const uint64_t late = hub.Subscribe([] {});
  hub.Publish(Numbered(2));
  EXPECT_EQ(TakeAll(hub, early), (std::vector<std::string>{"g1", "g2"}));
  EXPECT_EQ(TakeAll(hub, late), (std::vector<std::string>{"g2"}));
}

TEST(EventHubTest, Wake_AfterEmptyPoll_OncePerWait) {
  EventHub hub;
  int wakes = 0;
  const uint64_t id = hub.Subscribe([&wakes] { ++wakes; });
  // The first event wakes the new subscriber; later ones until it polls do
  // not.
  EXPECT_TRUE(hub.Publish(Numbered(1)));
  EXPECT_FALSE(hub.Publish(Numbered(2)));
  hub.Wake();
  hub.Wake();
  EXPECT_EQ(wakes, 1);
  EventHub::Poll last;
  EXPECT_THAT(TakeAll(hub, id, &last), ::testing::SizeIs(2));
  EXPECT_EQ(last, EventHub::Poll::kEmpty);
  // Having seen kEmpty it waits again: the next event wakes it.
  EXPECT_TRUE(hub.Publish(Numbered(3)));
  hub.Wake();
  EXPECT_EQ(wakes, 2);
}

TEST(EventHubTest, Next_SlowSubscriber_OldestDroppedAndCounted) {
  EventHub hub(4);
  const uint64_t slow = hub.Subscribe([] {});
  const uint64_t fast = hub.Subscribe([] {});
  for (int n = 1; n <= 4; ++n) hub.Publish(Numbered(n));
  EXPECT_THAT(TakeAll(hub, fast), ::testing::SizeIs(4));
  for (int n = 5; n <= 7; ++n) hub.Publish(Numbered(n));

  Event dropped;
  ASSERT_EQ(hub.Next(slow, &dropped), EventHub::Poll::kEvent);
  EXPECT_EQ(dropped.kind, Event::Kind::kEventsDropped);
  EXPECT_EQ(dropped.dropped, 3u);
  // Dated when the last missed event happened.
  EXPECT_EQ(dropped.time, Numbered(3).time);
  EXPECT_THAT(dropped.text, HasSubstr("3 events dropped"));
  EXPECT_EQ(TakeAll(hub, slow),
            (std::vector<std::string>{"g4", "g5", "g6", "g7"}));
  // The fast one lost nothing.
  EXPECT_EQ(TakeAll(hub, fast), (std::vector<std::string>{"g5", "g6", "g7"}));

  // Once reported, the count starts again.
  for (int n = 8; n <= 13; ++n) hub.Publish(Numbered(n));
  EXPECT_EQ(TakeAll(hub, slow), (std::vector<std::string>{
                                    "dropped 2", "g10", "g11", "g12", "g13"}));
}

TEST(EventHubTest, Close_QueuedEvents_TakenThenClosed) {
  EventHub hub;
  int wakes = 0;
  const uint64_t busy = hub.Subscribe([] {});
  const uint64_t idle = hub.Subscribe([&wakes] { ++wakes; });
  EventHub::Poll last;
  EXPECT_THAT(TakeAll(hub, idle, &last), ::testing::IsEmpty());
  ASSERT_EQ(last, EventHub::Poll::kEmpty);
  hub.Publish(Numbered(1));
  hub.Wake();
  EXPECT_EQ(TakeAll(hub, idle, &last), (std::vector<std::string>{"g1"}));
  hub.Publish(Numbered(2));
  hub.Close();
  // The wake g2 made due runs at the close, which adds none of its own.
  EXPECT_EQ(wakes, 2);
  EXPECT_EQ(TakeAll(hub, busy, &last), (std::vector<std::string>{"g1", "g2"}));
  EXPECT_EQ(last, EventHub::Poll::kClosed);
  EXPECT_EQ(TakeAll(hub, idle, &last), (std::vector<std::string>{"g2"}));
  EXPECT_EQ(last, EventHub::Poll::kClosed);
  // Nothing is queued after the close, and a late subscriber ends at once.
  EXPECT_FALSE(hub.Publish(Numbered(3)));
  const uint64_t late = hub.Subscribe([] {});
  Event event;
  EXPECT_EQ(hub.Next(late, &event), EventHub::Poll::kClosed);
}

TEST(EventHubTest, Close_WaitingSubscriber_Woken) {
  EventHub hub;
  int wakes = 0;
  const uint64_t id = hub.Subscribe([&wakes] { ++wakes; });
  Event event;
  ASSERT_EQ(hub.Next(id, &event), EventHub::Poll::kEmpty);
  hub.Close();
  EXPECT_EQ(wakes, 1);
  EXPECT_EQ(hub.Next(id, &event), EventHub::Poll::kClosed);
}

TEST(EventHubTest, Unsubscribe_UnknownOrTwice_Ignored) {
  EventHub hub;
  const uint64_t id = hub.Subscribe([] {});
  hub.Unsubscribe(id);
  hub.Unsubscribe(id);
  hub.Unsubscribe(12345);
  Event event;
  EXPECT_EQ(hub.Next(id, &event), EventHub::Poll::kClosed);
  EXPECT_FALSE(hub.Publish(Numbered(1)));
}

TEST(EventHubTest, Unsubscribe_WakeRunning_WaitsForIt) {
  EventHub hub;
  absl::Notification in_wake;
  absl::Notification release;
  std::atomic<bool> wake_ended{false};
  const uint64_t id = hub.Subscribe([&] {
    in_wake.Notify();
    release.WaitForNotification();
    wake_ended = true;
  });
  ASSERT_TRUE(hub.Publish(Numbered(1)));
  std::thread waker([&hub] { hub.Wake(); });
  in_wake.WaitForNotification();
  // Whether the release comes before Unsubscribe waits or while it does,
  // the wake has ended when it returns.
  std::thread releaser([&release] { release.Notify(); });
  hub.Unsubscribe(id);
  EXPECT_TRUE(wake_ended);
  waker.join();
  releaser.join();
}

}  // namespace
}  // namespace chorus
