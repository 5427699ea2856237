// Inbox: group epochs. A newer epoch of a group makes the inbox forget the
// older one: its stored messages go (and their flow-control bytes with
// them), its late data is dropped, and waits on it end ABORTED naming the
// newer epoch. Waits on a shared word (AwaitWord) end the same ways. A
// waiting rank polls the stream its sender's messages came by. No sockets,
// no clocks: deadlines are in the past, far away, or short where the wait
// must end at them.

#include "server/worker/dataplane/inbox.h"

#include <atomic>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "common/futex_word.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

MessageKey Key(uint64_t epoch, uint64_t sequence = 1) {
  MessageKey key;
  key.group = "g";
  key.epoch = epoch;
  key.sequence = sequence;
  key.from_rank = 0;
  key.to_rank = 1;
  return key;
}

const absl::Time kNow = absl::InfinitePast();  // already passed

TEST(InboxTest, Take_DeliveredMessage_ReturnsIt) {
  Inbox inbox;
  const Inbox::StreamId stream = inbox.NewStream();
  EXPECT_TRUE(inbox.Deliver(stream, Key(5), "data", nullptr));
  absl::StatusOr<std::string> taken = inbox.Take(Key(5), kNow);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(*taken, "data");
}

TEST(InboxTest, Deliver_NewerEpoch_DropsOlderMessagesAndResumesStream) {
  Inbox inbox(/*stream_limit_bytes=*/4);
  const Inbox::StreamId stream = inbox.NewStream();
  bool resumed = false;
  // Over the limit: the stream must wait for the rank to take it.
  EXPECT_FALSE(inbox.Deliver(stream, Key(5), "12345678",
                             [&resumed] { resumed = true; }));
  EXPECT_FALSE(resumed);
  // The group formed again: epoch 5's message is gone, its bytes released.
  EXPECT_TRUE(inbox.Deliver(inbox.NewStream(), Key(6), "x", nullptr));
  EXPECT_TRUE(resumed);
  absl::StatusOr<std::string> old = inbox.Take(Key(5), kNow);
  EXPECT_EQ(old.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(old.status().message()),
              HasSubstr("group g epoch 5 is over: this worker has seen its "
                        "epoch 6"));
}

TEST(InboxTest, Deliver_OlderEpochAfterNewer_DroppedAndStreamKeepsReading) {
  Inbox inbox(/*stream_limit_bytes=*/4);
  const Inbox::StreamId stream = inbox.NewStream();
  EXPECT_TRUE(inbox.Deliver(stream, Key(7), "a", nullptr));
  // Late data of epoch 6 is dropped; it holds no flow-control bytes.
  EXPECT_TRUE(inbox.Deliver(stream, Key(6), "123456789", nullptr));
  EXPECT_EQ(inbox.Take(Key(6), kNow).status().code(),
            absl::StatusCode::kAborted);
  absl::StatusOr<std::string> current = inbox.Take(Key(7), kNow);
  ASSERT_TRUE(current.ok()) << current.status();
  EXPECT_EQ(*current, "a");
}

TEST(InboxTest, Abort_OlderEpochAfterNewer_LeavesNewerAlone) {
  Inbox inbox;
  const Inbox::StreamId stream = inbox.NewStream();
  EXPECT_TRUE(inbox.Deliver(stream, Key(9), "kept", nullptr));
  inbox.Abort("g", 8, absl::AbortedError("old epoch aborted"));
  inbox.PeerLost("g", 8, absl::UnavailableError("old peer gone"));
  EXPECT_TRUE(inbox.AbortStatus("g", 9).ok());
  absl::StatusOr<std::string> taken = inbox.Take(Key(9), kNow);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(*taken, "kept");
}

TEST(InboxTest, Abort_NewerEpoch_ForgetsOlderAbort) {
  Inbox inbox;
  inbox.Abort("g", 1, absl::AbortedError("first"));
  EXPECT_FALSE(inbox.AbortStatus("g", 1).ok());
  inbox.Abort("g", 2, absl::AbortedError("second"));
  // Epoch 1's entry is gone; calls on it are refused as over instead.
  EXPECT_TRUE(inbox.AbortStatus("g", 1).ok());
  EXPECT_EQ(inbox.Take(Key(1), kNow).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(inbox.AbortStatus("g", 2).message(), "second");
}

TEST(InboxTest, Take_WaitingOnEpochWhenNewerArrives_EndsAborted) {
  Inbox inbox;
  absl::StatusOr<std::string> taken = absl::UnknownError("not run");
  std::thread waiter(
      [&] { taken = inbox.Take(Key(3), absl::Now() + absl::Hours(1)); });
  // Whether the waiter is already waiting or not yet, epoch 4 ends it.
  EXPECT_TRUE(inbox.Deliver(inbox.NewStream(), Key(4), "new", nullptr));
  waiter.join();
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kAborted);
}

TEST(InboxTest, Take_PollingWhenDeliveredOrAborted_EndsWithIt) {
  // Waits that poll a long while before blocking: what ends them arrives
  // while they poll (or before, or after; the outcome is the same).
  Inbox inbox;
  inbox.SetSpin(absl::Seconds(1));
  absl::StatusOr<std::string> taken = absl::UnknownError("not run");
  std::thread waiter(
      [&] { taken = inbox.Take(Key(3), absl::Now() + absl::Hours(1)); });
  MessageKey other = Key(3);
  other.tag = 7;  // another message first: the wait goes on
  EXPECT_TRUE(inbox.Deliver(inbox.NewStream(), other, "other", nullptr));
  EXPECT_TRUE(inbox.Deliver(inbox.NewStream(), Key(3), "data", nullptr));
  waiter.join();
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(*taken, "data");

  std::thread aborted(
      [&] { taken = inbox.Take(Key(3, 2), absl::Now() + absl::Hours(1)); });
  inbox.Abort("g", 3, absl::AbortedError("gone"));
  aborted.join();
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kAborted);
}

TEST(InboxTest, Take_StreamPollHasTheMessage_WaiterDeliversItItself) {
  // Nobody else delivers: only the waiter's own poll of the sender's stream
  // can end the wait before its deadline.
  Inbox inbox;
  inbox.SetSpin(absl::Seconds(10));
  const Inbox::StreamId stream = inbox.NewStream();
  ASSERT_TRUE(inbox.Deliver(stream, Key(3, 1), "first", nullptr));
  ASSERT_TRUE(inbox.Take(Key(3, 1), kNow).ok());
  // A spin polls at least once, however busy the machine.
  int polls = 0;
  inbox.SetStreamPoll(stream, [&] {
    ++polls;
    inbox.Deliver(stream, Key(3, 2), "second", nullptr);
    return Inbox::PollResult::kDelivered;
  });
  absl::StatusOr<std::string> taken =
      inbox.Take(Key(3, 2), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(*taken, "second");
  EXPECT_EQ(polls, 1);
}

TEST(InboxTest, Take_StreamPollLeavesItToStream_PolledOnceThenWaits) {
  Inbox inbox;
  inbox.SetSpin(absl::Milliseconds(50));
  const Inbox::StreamId stream = inbox.NewStream();
  ASSERT_TRUE(inbox.Deliver(stream, Key(3, 1), "first", nullptr));
  std::atomic<int> polls{0};
  inbox.SetStreamPoll(stream, [&] {
    ++polls;
    return Inbox::PollResult::kLeftToStream;
  });
  absl::StatusOr<std::string> taken = absl::UnknownError("not run");
  std::thread waiter(
      [&] { taken = inbox.Take(Key(3, 2), absl::Now() + absl::Hours(1)); });
  // The stream's own thread delivers it, whenever that is.
  EXPECT_TRUE(inbox.Deliver(stream, Key(3, 2), "second", nullptr));
  waiter.join();
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_LE(polls.load(), 1);
}

TEST(InboxTest, Take_SpinOffOrStreamClosed_StreamNotPolled) {
  Inbox inbox;
  const Inbox::StreamId stream = inbox.NewStream();
  ASSERT_TRUE(inbox.Deliver(stream, Key(3, 1), "first", nullptr));
  int polls = 0;
  inbox.SetStreamPoll(stream, [&] {
    ++polls;
    return Inbox::PollResult::kNothingYet;
  });
  inbox.SetSpin(absl::ZeroDuration());
  EXPECT_EQ(inbox.Take(Key(3, 2), absl::Now() + absl::Milliseconds(20))
                .status()
                .code(),
            absl::StatusCode::kDeadlineExceeded);
  inbox.SetSpin(absl::Milliseconds(5));
  inbox.CloseStream(stream);
  EXPECT_EQ(inbox.Take(Key(3, 2), absl::Now() + absl::Milliseconds(20))
                .status()
                .code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(polls, 0);
}

TEST(InboxTest, Deliver_OtherGroups_Independent) {
  Inbox inbox;
  const Inbox::StreamId stream = inbox.NewStream();
  MessageKey other = Key(1);
  other.group = "h";
  EXPECT_TRUE(inbox.Deliver(stream, other, "h1", nullptr));
  EXPECT_TRUE(inbox.Deliver(stream, Key(2), "g2", nullptr));
  absl::StatusOr<std::string> taken = inbox.Take(other, kNow);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(*taken, "h1");
}

// AwaitWord: a word another rank advances in shared memory (here another
// thread), waited on as a message is.
TEST(InboxTest, AwaitWord_AdvancedByAnotherThread_Ok) {
  Inbox inbox;
  inbox.SetSpin(absl::ZeroDuration());  // block at once
  std::atomic<uint64_t> word{4};
  absl::Status waited = absl::UnknownError("not run");
  std::thread waiter([&] {
    waited = inbox.AwaitWord(Key(1), word, 6, absl::Now() + absl::Hours(1));
  });
  word.store(5);
  WakeWordWaiters(word);
  word.store(7);
  WakeWordWaiters(word);
  waiter.join();
  EXPECT_TRUE(waited.ok()) << waited;
}

TEST(InboxTest, AwaitWord_AlreadyThere_OkWithoutWaiting) {
  Inbox inbox;
  std::atomic<uint64_t> word{9};
  EXPECT_TRUE(inbox.AwaitWord(Key(1), word, 9, kNow).ok());
}

TEST(InboxTest, AwaitWord_NeverAdvanced_DeadlineExceededNamingRank) {
  Inbox inbox;
  inbox.SetSpin(absl::ZeroDuration());
  std::atomic<uint64_t> word{0};
  const absl::Status waited = inbox.AwaitWord(Key(1, 7), word, 1, kNow);
  EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(waited.message()),
              HasSubstr("rank 0 of group g sent no data for collective #7"));
}

TEST(InboxTest, AwaitWord_AbortedOrPeerLostWhileBlocked_EndsWithThatStatus) {
  for (bool abort : {true, false}) {
    Inbox inbox;
    inbox.SetSpin(absl::ZeroDuration());
    std::atomic<uint64_t> word{0};
    absl::Status waited;
    std::thread waiter([&] {
      waited = inbox.AwaitWord(Key(2), word, 1, absl::Now() + absl::Hours(1));
    });
    const absl::Status why = abort ? absl::AbortedError("verdict")
                                   : absl::UnavailableError("rank 3 is gone");
    if (abort) {
      inbox.Abort("g", 2, why);
    } else {
      inbox.PeerLost("g", 2, why);
    }
    waiter.join();
    EXPECT_EQ(waited, why);
  }
}

TEST(InboxTest, AwaitWord_NewerEpochWhileBlocked_EndsAborted) {
  Inbox inbox;
  inbox.SetSpin(absl::ZeroDuration());
  EXPECT_TRUE(inbox.Deliver(inbox.NewStream(), Key(3), "seen", nullptr));
  std::atomic<uint64_t> word{0};
  absl::Status waited;
  std::thread waiter([&] {
    waited = inbox.AwaitWord(Key(3), word, 1, absl::Now() + absl::Hours(1));
  });
  EXPECT_TRUE(inbox.Deliver(inbox.NewStream(), Key(4), "new", nullptr));
  waiter.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(waited.message()), HasSubstr("epoch 3 is over"));
}

}  // namespace
}  // namespace chorus
