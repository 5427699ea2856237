// The coordinator's flight recorder through `chorusctl trace`, against a
// real coordinator: a rank that never calls is named after the others'
// deadline, mismatched calls show what each rank asked for, and --json
// carries the Flight Recorder field names; under --leader_calls the failed
// calls are traced the same way. (The analysis of calls still
// waiting is tested on entries in tests/unit/trace_report_test.cc.)
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/collective_harness.h"
#include "tests/testing/daemons.h"

namespace chorus::test {
namespace {

using ::testing::HasSubstr;

constexpr int kWorld = 3;

std::string Trace(const EmbeddedCluster& cluster, const std::string& group,
                  const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {
      absl::StrCat("--coordinator=", cluster.coordinator_address()),
      absl::StrCat("--group=", group), "--timeout=10s"};
  args.insert(args.end(), extra.begin(), extra.end());
  args.push_back("trace");
  absl::StatusOr<CommandResult> result = RunChorusctl(args);
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) return "";
  EXPECT_EQ(result->exit_code, 0) << result->err;
  return result->out;
}

CollectiveSpec SumOf(uint64_t count) {
  CollectiveSpec spec;
  spec.kind = CollectiveKind::kAllReduce;
  spec.dtype = DType::kF32;
  spec.count = count;
  spec.op = ReduceOp::kSum;
  return spec;
}

TEST(TraceTest, Trace_RankNeverCalls_NamedAfterTheDeadline) {
  absl::StatusOr<std::unique_ptr<EmbeddedCluster>> cluster =
      EmbeddedCluster::Start(kWorld);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto group = (*cluster)->JoinGroup("traced", kWorld);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<Communicator*> ranks = Pointers(*group);
  const std::string input(8 * sizeof(float), '\0');
  for (int call = 0; call < 3; ++call) {
    std::vector<CollectiveHandle> handles;
    std::vector<std::string> outputs(kWorld);
    for (int r = 0; r < kWorld; ++r) {
      handles.push_back(ranks[r]->RunAsync(SumOf(8), input, &outputs[r]));
    }
    for (CollectiveHandle& h : handles) ASSERT_TRUE(h.Wait().ok());
  }
  // Call #4: rank 2 never calls; the others' calls end at their deadline.
  CallOptions options;
  options.timeout = absl::Seconds(2);
  std::vector<std::string> outputs(kWorld);
  std::vector<CollectiveHandle> waiting;
  for (int r = 0; r < 2; ++r) {
    waiting.push_back(
        ranks[r]->RunAsync(SumOf(8), input, &outputs[r], options));
  }
  for (CollectiveHandle& h : waiting) {
    absl::StatusOr<CallResult> result = h.Wait();
    EXPECT_TRUE(absl::IsDeadlineExceeded(result.status())) << result.status();
  }
  const std::string out = Trace(**cluster, "traced");
  EXPECT_THAT(out, HasSubstr("#3 "));
  EXPECT_THAT(out, HasSubstr("completed inline"));
  EXPECT_THAT(out, HasSubstr("#4 "));
  EXPECT_THAT(out, HasSubstr("all_reduce #4 (epoch"));
  EXPECT_THAT(out, HasSubstr("rank 2 never called it; it ended with "
                             "DEADLINE_EXCEEDED"));

  const std::string json = Trace(**cluster, "traced", {"--json"});
  EXPECT_THAT(json, HasSubstr("\"pg_name\": \"traced\""));
  EXPECT_THAT(json, HasSubstr("\"collective_seq_id\": 4"));
  EXPECT_THAT(json, HasSubstr("\"profiling_name\": \"chorus:all_reduce\""));
  EXPECT_THAT(json, HasSubstr("\"state\": \"failed\""));
  EXPECT_THAT(json, HasSubstr("\"input_dtypes\": [\"f32\"]"));
}

TEST(TraceTest, Trace_RanksDisagree_EachRanksCallShown) {
  absl::StatusOr<std::unique_ptr<EmbeddedCluster>> cluster =
      EmbeddedCluster::Start(2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto group = (*cluster)->JoinGroup("split", 2);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<Communicator*> ranks = Pointers(*group);
  std::vector<std::string> outputs(2);
  CollectiveHandle a =
      ranks[0]->RunAsync(SumOf(8), std::string(32, '\0'), &outputs[0]);
  CollectiveHandle b =
      ranks[1]->RunAsync(SumOf(4), std::string(16, '\0'), &outputs[1]);
  EXPECT_TRUE(absl::IsInvalidArgument(a.Wait().status()));
  EXPECT_TRUE(absl::IsInvalidArgument(b.Wait().status()));
  const std::string out = Trace(**cluster, "split");
  EXPECT_THAT(out, HasSubstr("ranks disagree: rank 0 all_reduce f32[8] sum; "
                             "rank 1 all_reduce f32[4] sum"));
}

// Under --leader_calls the calls rank 0's worker ended are not recorded,
// and every failed call went to the coordinator: traced as without it.
TEST(TraceTest, Trace_LeaderCalls_MissingRankAndDisagreementTraced) {
  absl::StatusOr<std::unique_ptr<EmbeddedCluster>> cluster =
      EmbeddedCluster::Start(kWorld,
                             {"--leader_calls", "--leader_patience=10s"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto group = (*cluster)->JoinGroup("led", kWorld);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<Communicator*> ranks = Pointers(*group);
  const std::string input(8 * sizeof(float), '\0');
  std::vector<std::string> outputs(kWorld);
  std::vector<CollectiveHandle> handles;
  for (int r = 0; r < kWorld; ++r) {
    handles.push_back(ranks[r]->RunAsync(SumOf(8), input, &outputs[r]));
  }
  for (CollectiveHandle& h : handles) {
    absl::StatusOr<CallResult> result = h.Wait();
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->algorithm, Algorithm::kLeader);
  }
  // Call #2: rank 2 never calls.
  CallOptions options;
  options.timeout = absl::Seconds(2);
  std::vector<CollectiveHandle> waiting;
  for (int r = 0; r < 2; ++r) {
    waiting.push_back(
        ranks[r]->RunAsync(SumOf(8), input, &outputs[r], options));
  }
  for (CollectiveHandle& h : waiting) {
    EXPECT_TRUE(absl::IsDeadlineExceeded(h.Wait().status()));
  }
  // Rank 2's #2 ends with that verdict; then #3 disagrees on rank 1.
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      ranks[2]->Run(SumOf(8), input, &outputs[2], options).status()));
  handles.clear();
  for (int r = 0; r < kWorld; ++r) {
    const uint64_t count = r == 1 ? 4 : 8;
    handles.push_back(ranks[r]->RunAsync(
        SumOf(count), std::string(count * sizeof(float), '\0'), &outputs[r]));
  }
  for (CollectiveHandle& h : handles) {
    EXPECT_TRUE(absl::IsInvalidArgument(h.Wait().status()));
  }
  const std::string out = Trace(**cluster, "led");
  EXPECT_THAT(out, HasSubstr("DEADLINE_EXCEEDED: rank 2 of group led did not "
                             "reach all_reduce #2 within the deadline"));
  EXPECT_THAT(out, HasSubstr("ranks disagree: rank 0 all_reduce f32[8] sum; "
                             "rank 1 all_reduce f32[4] sum"));
}

TEST(TraceTest, Trace_UnknownGroup_NotFound) {
  absl::StatusOr<std::unique_ptr<EmbeddedCluster>> cluster =
      EmbeddedCluster::Start(1);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<CommandResult> result = RunChorusctl(
      {absl::StrCat("--coordinator=", (*cluster)->coordinator_address()),
       "--group=nobody", "--timeout=10s", "trace"});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 1);
  EXPECT_THAT(result->err, HasSubstr("NOT_FOUND"));
  EXPECT_THAT(result->err, HasSubstr("group nobody"));
}

}  // namespace
}  // namespace chorus::test
