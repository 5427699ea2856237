// Failure tests: deadlines. A collective that not every rank reaches in time
// ends with DEADLINE_EXCEEDED on every rank that did, naming the ranks that
// did not, at the callers' deadline (not at the client's own gRPC deadline,
// which would say nothing about the ranks). Real daemons on 127.0.0.1; the
// ranks are worker daemons driven by clients in this test.

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "chorus/communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/failure_cluster.h"

namespace chorus::test {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kCount = 16;
// The deadline of the calls that wait for a missing rank.
constexpr absl::Duration kShortTimeout = absl::Seconds(2);
// The coordinator answers a little before the caller's deadline (a tenth of
// the time left, at most 250 ms) so that its verdict, not the client's own
// timeout, reaches the rank. A verdict much earlier than that would mean the
// call did not wait for the missing rank at all.
constexpr absl::Duration kEarliestVerdict = absl::Seconds(1);

CallOptions ShortCall() {
  CallOptions options;
  options.timeout = kShortTimeout;
  return options;
}

CollectiveSpec BarrierSpec() {
  CollectiveSpec spec;
  spec.kind = CollectiveKind::kBarrier;
  return spec;
}

// Each test runs twice: with the coordinator judging every call, and with
// small calls at the group's rank-0 worker (--leader_calls), whose callers
// take a call a rank is missing from to the coordinator.
class DeadlineTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    std::vector<std::string> flags = {"--lease_timeout=2s"};
    if (GetParam()) flags.push_back("--leader_calls");
    absl::StatusOr<std::unique_ptr<FailureCluster>> cluster =
        FailureCluster::Start(flags,
                              {"worker-0", "worker-1", "worker-2", "worker-3"});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
  }

  // Starts `spec` with a kShortTimeout deadline on each of `callers`.
  std::vector<std::unique_ptr<BackgroundCall>> CallOn(
      const std::vector<std::unique_ptr<Communicator>>& ranks,
      const std::vector<int>& callers, const CollectiveSpec& spec) {
    std::vector<std::unique_ptr<BackgroundCall>> calls;
    for (int rank : callers) {
      calls.push_back(
          std::make_unique<BackgroundCall>(ranks[rank].get(), spec,
                                           spec.kind == CollectiveKind::kBarrier
                                               ? std::string()
                                               : RankInputU32(rank, spec.count),
                                           ShortCall()));
    }
    return calls;
  }

  // Expects every call to end with DEADLINE_EXCEEDED and `message`, no
  // earlier than kEarliestVerdict and no later than its deadline plus
  // kSchedulingSlack.
  void ExpectDeadlineVerdicts(
      const std::vector<std::unique_ptr<BackgroundCall>>& calls,
      const std::string& message) {
    for (size_t i = 0; i < calls.size(); ++i) {
      BackgroundCall& call = *calls[i];
      ASSERT_TRUE(call.WaitUntilTime(call.started_at() + kShortTimeout +
                                     kSchedulingSlack))
          << "call " << i << " still waiting past its deadline";
      const absl::Duration took = call.ended_at() - call.started_at();
      std::printf("[ latency  ] deadline verdict after %s: %s\n",
                  absl::FormatDuration(took).c_str(),
                  call.status().ToString().c_str());
      EXPECT_THAT(call.status(), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                          HasSubstr(message)))
          << "call " << i;
      EXPECT_GE(took, kEarliestVerdict) << "call " << i;
    }
  }

  std::unique_ptr<FailureCluster> cluster_;
};

TEST_P(DeadlineTest, Collective_RankNeverCalls_DeadlineExceededNamingIt) {
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const std::string group = absl::StrCat("deadline-", round);
    absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> ranks =
        cluster_->Join(group, {0, 1, 2});
    ASSERT_TRUE(ranks.ok()) << ranks.status();

    std::vector<std::unique_ptr<BackgroundCall>> calls =
        CallOn(*ranks, {0, 1}, AllReduceU32(kCount));
    const std::string verdict =
        absl::StrCat("rank 2 of group ", group, " did not reach all_reduce #1");
    ExpectDeadlineVerdicts(calls, verdict);

    // The late rank learns the same verdict at once, and the group goes on.
    BackgroundCall late((*ranks)[2].get(), AllReduceU32(kCount),
                        RankInputU32(2, kCount), FailureCallOptions());
    ASSERT_TRUE(late.WaitFor(absl::Seconds(1) + kSchedulingSlack));
    EXPECT_THAT(late.status(), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                        HasSubstr(verdict)));
    EXPECT_TRUE(AllReduceWorks(*ranks, kCount));
  }
}

TEST_P(DeadlineTest, Collective_TwoRanksNeverCall_DeadlineNamesBoth) {
  const std::string group = "deadline-two";
  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> ranks =
      cluster_->Join(group, {0, 1, 2, 3});
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  std::vector<std::unique_ptr<BackgroundCall>> calls =
      CallOn(*ranks, {0, 2}, AllReduceU32(kCount));
  ExpectDeadlineVerdicts(
      calls, absl::StrCat("ranks 1, 3 of group ", group,
                          " did not reach all_reduce #1 within the deadline"));
}

TEST_P(DeadlineTest, Collective_RankSkipsSecondCall_DeadlineNamesSequence) {
  const std::string group = "deadline-second";
  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> ranks =
      cluster_->Join(group, {0, 1, 2});
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  ASSERT_TRUE(AllReduceWorks(*ranks, kCount));
  std::vector<std::unique_ptr<BackgroundCall>> calls =
      CallOn(*ranks, {0, 1}, BarrierSpec());
  ExpectDeadlineVerdicts(calls, absl::StrCat("rank 2 of group ", group,
                                             " did not reach barrier #2"));
}

TEST_P(DeadlineTest, Collective_RingPlanRankNeverCalls_DeadlineExceeded) {
  const std::string group = "deadline-ring";
  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> ranks =
      cluster_->Join(group, {0, 1, 2});
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  std::vector<std::unique_ptr<BackgroundCall>> calls;
  for (int rank = 0; rank < 2; ++rank) {
    CallOptions options = ShortCall();
    options.algorithm = Algorithm::kRing;
    calls.push_back(std::make_unique<BackgroundCall>(
        (*ranks)[rank].get(), AllReduceU32(1 << 16),
        RankInputU32(rank, 1 << 16), options));
  }
  ExpectDeadlineVerdicts(calls, absl::StrCat("rank 2 of group ", group,
                                             " did not reach all_reduce #1"));
}

INSTANTIATE_TEST_SUITE_P(Judges, DeadlineTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "leader" : "coordinator";
                         });

}  // namespace
}  // namespace chorus::test
