// AnsweredCalls: the replays a worker sends after it moved to another
// coordinator, and the calls whose plan runs.
#include "server/worker/answered_calls.h"

#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

v1::CollectiveRequest Call(uint64_t epoch, uint64_t sequence) {
  v1::CollectiveRequest request;
  request.set_group("g");
  request.set_epoch(epoch);
  request.set_rank(1);
  request.set_sequence(sequence);
  return request;
}

TEST(AnsweredCallsTest, AttachReplays_SameRegistration_Nothing) {
  AnsweredCalls calls;
  calls.Record(Call(1, 1), 1);
  v1::CollectiveRequest next = Call(1, 2);
  calls.AttachReplays(&next, 1);
  EXPECT_EQ(next.replays_size(), 0);
}

TEST(AnsweredCallsTest, AttachReplays_AfterMove_EarlierCallsOfTheEpoch) {
  AnsweredCalls calls;
  calls.Record(Call(1, 1), 1);
  calls.Record(Call(1, 2), 1);
  v1::CollectiveRequest next = Call(1, 3);
  calls.AttachReplays(&next, 2);
  ASSERT_EQ(next.replays_size(), 2);
  EXPECT_EQ(next.replays(0).sequence(), 1u);
  EXPECT_EQ(next.replays(1).sequence(), 2u);
  // Another epoch's call carries none.
  v1::CollectiveRequest other = Call(2, 1);
  calls.AttachReplays(&other, 2);
  EXPECT_EQ(other.replays_size(), 0);
}

TEST(AnsweredCallsTest, Record_MoreThanKept_KeepsTheNewest) {
  AnsweredCalls calls;
  for (uint64_t s = 1; s <= AnsweredCalls::kKept + 4; ++s) {
    calls.Record(Call(1, s), 1);
  }
  v1::CollectiveRequest next = Call(1, AnsweredCalls::kKept + 5);
  calls.AttachReplays(&next, 2);
  ASSERT_EQ(next.replays_size(), static_cast<int>(AnsweredCalls::kKept));
  EXPECT_EQ(next.replays(0).sequence(), 5u);
}

TEST(AnsweredCallsTest, RunningCalls_UntilRan_MarkedRunningWithoutReplays) {
  AnsweredCalls calls;
  v1::CollectiveRequest planned = Call(1, 3);
  *planned.add_replays() = Call(1, 2);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  calls.Running(planned, deadline);
  calls.Running(Call(1, 4), deadline);
  std::vector<AnsweredCalls::RunningCall> running = calls.RunningCalls();
  ASSERT_EQ(running.size(), 2u);
  EXPECT_EQ(running[0].request.sequence(), 3u);
  EXPECT_TRUE(running[0].request.running());
  EXPECT_EQ(running[0].request.replays_size(), 0);
  EXPECT_EQ(running[0].deadline, deadline);
  calls.Ran("g", 3);
  running = calls.RunningCalls();
  ASSERT_EQ(running.size(), 1u);
  EXPECT_EQ(running[0].request.sequence(), 4u);
  calls.Ran("g", 4);
  EXPECT_TRUE(calls.RunningCalls().empty());
}

}  // namespace
}  // namespace chorus
