// The flight recorder on its own: what each step records, capacity, and the
// groups it forgets.
#include "server/coordinator/flight_recorder.h"

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::ElementsAre;
using ::testing::SizeIs;

const absl::Time kT0 = absl::FromUnixSeconds(1000);

CollectiveSpec Sum(uint64_t count) {
  CollectiveSpec spec;
  spec.kind = CollectiveKind::kAllReduce;
  spec.dtype = DType::kF32;
  spec.count = count;
  spec.op = ReduceOp::kSum;
  return spec;
}

TEST(FlightRecorderTest, Arrived_TwoOfThreeRanks_WaitingWithTheirTimes) {
  FlightRecorder recorder(8, 4);
  recorder.Arrived("g", 7, 3, 1, 0, Sum(8), kT0);
  recorder.Arrived("g", 7, 3, 1, 2, Sum(4), kT0 + absl::Milliseconds(5));
  std::vector<TraceEntry> entries = recorder.Entries("g");
  ASSERT_THAT(entries, SizeIs(1));
  const TraceEntry& e = entries[0];
  EXPECT_EQ(e.record_id, 1u);
  EXPECT_EQ(e.epoch, 7u);
  EXPECT_EQ(e.sequence, 1u);
  EXPECT_EQ(e.state, TraceEntry::State::kWaiting);
  EXPECT_THAT(e.arrived, ElementsAre(kT0, absl::InfinitePast(),
                                     kT0 + absl::Milliseconds(5)));
  EXPECT_THAT(e.asked, ElementsAre("all_reduce f32[8] sum", "",
                                   "all_reduce f32[4] sum"));
}

TEST(FlightRecorderTest, Decided_DataPlanePlanThenCommits_Completed) {
  FlightRecorder recorder(8, 4);
  for (int r = 0; r < 2; ++r) recorder.Arrived("g", 1, 2, 1, r, Sum(8), kT0);
  recorder.Decided("g", 1, 1, Algorithm::kRing, kT0 + absl::Milliseconds(1));
  EXPECT_EQ(recorder.Entries("g")[0].state, TraceEntry::State::kDecided);
  recorder.Committed("g", 1, 1, 1, kT0 + absl::Milliseconds(3));
  recorder.Ended("g", 1, 1, absl::OkStatus(), kT0 + absl::Milliseconds(3));
  const TraceEntry e = recorder.Entries("g")[0];
  EXPECT_EQ(e.state, TraceEntry::State::kCompleted);
  EXPECT_EQ(e.plan, Algorithm::kRing);
  EXPECT_THAT(e.committed,
              ElementsAre(absl::InfinitePast(), kT0 + absl::Milliseconds(3)));
}

TEST(FlightRecorderTest, Decided_Inline_CompletedAtOnce) {
  FlightRecorder recorder(8, 4);
  recorder.Arrived("g", 1, 1, 1, 0, Sum(8), kT0);
  recorder.Decided("g", 1, 1, Algorithm::kInline, kT0);
  EXPECT_EQ(recorder.Entries("g")[0].state, TraceEntry::State::kCompleted);
}

TEST(FlightRecorderTest, EndAll_Abort_EndsOnlyOpenCallsOfThatEpoch) {
  FlightRecorder recorder(8, 4);
  recorder.Arrived("g", 1, 1, 1, 0, Sum(8), kT0);
  recorder.Decided("g", 1, 1, Algorithm::kInline, kT0);
  recorder.Arrived("g", 1, 2, 2, 0, Sum(8), kT0);
  recorder.Arrived("g", 2, 2, 1, 0, Sum(8), kT0);
  recorder.EndAll("g", 1, absl::AbortedError("lost"), kT0);
  const std::vector<TraceEntry> e = recorder.Entries("g");
  ASSERT_THAT(e, SizeIs(3));
  EXPECT_EQ(e[0].state, TraceEntry::State::kCompleted);
  EXPECT_EQ(e[1].state, TraceEntry::State::kFailed);
  EXPECT_TRUE(absl::IsAborted(e[1].verdict));
  EXPECT_EQ(e[2].state, TraceEntry::State::kWaiting);
}

TEST(FlightRecorderTest, Arrived_OverCapacity_OldestDropped) {
  FlightRecorder recorder(3, 4);
  for (uint64_t s = 1; s <= 5; ++s)
    recorder.Arrived("g", 1, 1, s, 0, Sum(1), kT0);
  const std::vector<TraceEntry> e = recorder.Entries("g");
  ASSERT_THAT(e, SizeIs(3));
  EXPECT_EQ(e[0].sequence, 3u);
  EXPECT_EQ(e[2].sequence, 5u);
}

TEST(FlightRecorderTest, Arrived_LargeGroup_KeepsWhatItsRankRecordsHold) {
  // Room for 1,000 rank records: three calls of 300 ranks, one of 5,000.
  FlightRecorder recorder(8, 4, 1000);
  for (uint64_t s = 1; s <= 5; ++s) {
    recorder.Arrived("g", 1, 300, s, 0, Sum(1), kT0);
  }
  std::vector<TraceEntry> e = recorder.Entries("g");
  ASSERT_THAT(e, SizeIs(3));
  EXPECT_EQ(e[0].sequence, 3u);
  recorder.Arrived("big", 1, 5000, 1, 0, Sum(1), kT0);
  recorder.Arrived("big", 1, 5000, 2, 4999, Sum(1), kT0);
  e = recorder.Entries("big");
  ASSERT_THAT(e, SizeIs(1));
  EXPECT_EQ(e[0].sequence, 2u);
  EXPECT_EQ(e[0].arrived[4999], kT0);
  // Smaller groups keep their own.
  EXPECT_THAT(recorder.Entries("g"), SizeIs(3));
}

TEST(FlightRecorderTest, Ended_AfterOthersDropped_FindsItsOwnEntryOnly) {
  FlightRecorder recorder(2, 4);
  for (uint64_t s = 1; s <= 3; ++s) {
    recorder.Arrived("g", 7, 2, s, 0, Sum(1), kT0);
  }
  // #1 was dropped: its end and a commit for it change nothing.
  recorder.Ended("g", 7, 1, absl::OkStatus(), kT0 + absl::Seconds(1));
  recorder.Committed("g", 7, 1, 0, kT0 + absl::Seconds(1));
  // #2 is kept and found by epoch and number (not #2 of another epoch).
  recorder.Ended("g", 8, 2, absl::OkStatus(), kT0 + absl::Seconds(2));
  recorder.Arrived("g", 7, 2, 2, 1, Sum(1), kT0 + absl::Seconds(3));
  const std::vector<TraceEntry> e = recorder.Entries("g");
  ASSERT_THAT(e, SizeIs(2));
  EXPECT_EQ(e[0].sequence, 2u);
  EXPECT_EQ(e[0].state, TraceEntry::State::kWaiting);
  EXPECT_EQ(e[0].arrived[1], kT0 + absl::Seconds(3));
  EXPECT_EQ(e[1].sequence, 3u);
  EXPECT_EQ(e[1].arrived[1], absl::InfinitePast());
}

TEST(FlightRecorderTest, Arrived_OverGroupLimit_LeastRecentGroupForgotten) {
  FlightRecorder recorder(3, 2);
  recorder.Arrived("a", 1, 1, 1, 0, Sum(1), kT0);
  recorder.Arrived("b", 1, 1, 1, 0, Sum(1), kT0);
  recorder.Arrived("a", 1, 1, 2, 0, Sum(1), kT0);
  recorder.Arrived("c", 1, 1, 1, 0, Sum(1), kT0);
  EXPECT_THAT(recorder.Entries("a"), SizeIs(2));
  EXPECT_THAT(recorder.Entries("b"), SizeIs(0));
  EXPECT_THAT(recorder.Entries("c"), SizeIs(1));
}

TEST(FlightRecorderTest, Arrived_NoCapacity_RecordsNothing) {
  FlightRecorder recorder(0, 2);
  recorder.Arrived("a", 1, 1, 1, 0, Sum(1), kT0);
  EXPECT_THAT(recorder.Entries("a"), SizeIs(0));
}

}  // namespace
}  // namespace chorus
