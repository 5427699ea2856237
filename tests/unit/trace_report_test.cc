// chorusctl trace's analysis and JSON on entries made by hand.
#include "client/cli/trace_report.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TraceEntry Entry(uint64_t sequence, std::vector<absl::Time> arrived) {
  TraceEntry e;
  e.epoch = 3;
  e.sequence = sequence;
  e.spec.kind = CollectiveKind::kAllReduce;
  e.spec.dtype = DType::kF32;
  e.spec.count = 8;
  e.spec.op = ReduceOp::kSum;
  for (absl::Time t : arrived) {
    e.asked.push_back(t == absl::InfinitePast() ? "" : "all_reduce f32[8] sum");
    e.committed.push_back(absl::InfinitePast());
  }
  e.arrived = std::move(arrived);
  e.state = TraceEntry::State::kCompleted;
  e.plan = Algorithm::kInline;
  return e;
}

std::string Joined(const std::vector<std::string>& findings) {
  std::string out;
  for (const std::string& f : findings) out += f + "\n";
  return out;
}

TEST(TraceReportTest, AnalyzeTrace_RankNeverCalled_NamedWithTheWait) {
  TraceEntry e = Entry(42, {kT0, absl::InfinitePast(), kT0});
  e.state = TraceEntry::State::kWaiting;
  const std::string out = Joined(AnalyzeTrace({e}, 10, kT0 + absl::Seconds(3)));
  EXPECT_THAT(out, HasSubstr("all_reduce #42 (epoch 3): rank 1 never called "
                             "it; the others have waited 3s"));
}

TEST(TraceReportTest, AnalyzeTrace_OneRankAlwaysLast_Straggler) {
  std::vector<TraceEntry> entries;
  for (uint64_t s = 1; s <= 5; ++s) {
    entries.push_back(Entry(s, {kT0, kT0 + absl::Milliseconds(12), kT0}));
  }
  const std::string out = Joined(AnalyzeTrace(entries, 10, kT0));
  EXPECT_THAT(out, HasSubstr("straggler: rank 1 arrived last in 5 of the "
                             "last 5 calls, on average 12000us after the "
                             "first rank"));
}

TEST(TraceReportTest, AnalyzeTrace_NoRankUsuallyLast_NoStraggler) {
  std::vector<TraceEntry> entries;
  for (uint64_t s = 1; s <= 4; ++s) {
    std::vector<absl::Time> t = {kT0, kT0, kT0};
    t[s % 3] = kT0 + absl::Milliseconds(1);
    entries.push_back(Entry(s, t));
  }
  EXPECT_THAT(AnalyzeTrace(entries, 10, kT0), IsEmpty());
}

TEST(TraceReportTest, AnalyzeTrace_RanksDisagree_EachRanksCall) {
  TraceEntry e = Entry(7, {kT0, kT0});
  e.asked[1] = "all_gather f32[8]";
  e.state = TraceEntry::State::kFailed;
  e.verdict = absl::InvalidArgumentError("does not match");
  EXPECT_THAT(AnalyzeTrace({e}, 10, kT0),
              Contains(HasSubstr("ranks disagree: rank 0 all_reduce f32[8] "
                                 "sum; rank 1 all_gather f32[8]")));
}

TEST(TraceReportTest, AnalyzeTrace_CommitMissing_RankNamed) {
  TraceEntry e = Entry(9, {kT0, kT0});
  e.state = TraceEntry::State::kDecided;
  e.plan = Algorithm::kRing;
  e.decided = kT0;
  e.committed[0] = kT0 + absl::Milliseconds(2);
  EXPECT_THAT(AnalyzeTrace({e}, 10, kT0 + absl::Seconds(1)),
              Contains(HasSubstr("all_reduce #9 (epoch 3) (ring): rank 1 did "
                                 "not finish it yet")));
}

TEST(TraceReportTest, FormatTrace_MembershipChange_OneLineWithItsMessage) {
  TraceEntry change;
  change.epoch = 3;
  change.state = TraceEntry::State::kMembershipChanged;
  change.ended = kT0;
  change.verdict = absl::AbortedError(
      "the membership of group g changed at epoch 3: rank 1 left");
  const std::vector<TraceEntry> entries = {Entry(7, {kT0, kT0}), change};
  EXPECT_THAT(FormatTrace(entries),
              HasSubstr("e3 membership changed: the membership of group g "
                        "changed at epoch 3: rank 1 left\n"));
  EXPECT_THAT(Joined(AnalyzeTrace(entries, 10, kT0)),
              HasSubstr("epoch 3: the membership of group g changed"));
  EXPECT_THAT(TraceJson("g", entries),
              HasSubstr("\"profiling_name\": \"chorus:membership_changed\""));
}

TEST(TraceReportTest, TraceJson_Entry_FlightRecorderFieldNames) {
  TraceEntry e = Entry(4, {kT0});
  e.record_id = 11;
  e.verdict = absl::OkStatus();
  const std::string json = TraceJson("g\"1", {e});
  EXPECT_THAT(json, HasSubstr("\"pg_name\": \"g\\\"1\""));
  EXPECT_THAT(json, HasSubstr("\"record_id\": 11"));
  EXPECT_THAT(json, HasSubstr("\"collective_seq_id\": 4"));
  EXPECT_THAT(json, HasSubstr("\"profiling_name\": \"chorus:all_reduce\""));
  EXPECT_THAT(json, HasSubstr("\"time_created_ns\": 1000000000000"));
  EXPECT_THAT(json, HasSubstr("\"state\": \"completed\""));
  EXPECT_THAT(json, HasSubstr("\"input_sizes\": [[8]]"));
}

}  // namespace
}  // namespace chorus
