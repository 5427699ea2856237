// Failure tests: a worker lost while its group runs collectives. Real
// chorus-coordinator and chorus-worker processes on 127.0.0.1; each rank is
// a worker daemon driven by a client in this test, so killing (SIGKILL) or
// stopping (SIGSTOP) the daemon loses the rank. Every surviving rank must
// get a typed status within the bound (the lease plus one second, plus
// kSchedulingSlack), never a hang and never a success.
//
// Each scenario runs several times against fresh victims so that one ctest
// entry exercises it repeatedly.

#include <signal.h>

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
#include "tests/testing/daemons.h"
#include "tests/testing/failure_cluster.h"
#include "tests/testing/wait.h"

namespace chorus::test {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;

// How long a killed daemon may take to be reaped.
constexpr absl::Duration kExitTimeout = absl::Seconds(30);
// Elements of the small collectives (inline plan).
constexpr uint64_t kSmallCount = 16;
// The large ring collective: 12 Mi u32 elements, 48 MiB per rank (the
// local API's 64 MiB message limit leaves room for the rest of the call),
// in 64 KiB chunks, so each rank sends about 1000 chunks.
constexpr uint64_t kLargeCount = uint64_t{12} << 20;
constexpr char kSmallChunks[] = "--chunk_bytes=65536";
// The victim (rank 2) is lost once it has delivered this much to its ring
// successor, rank 0: the ring is under way with about 62 MiB of its 64 MiB
// still to send.
constexpr uint64_t kMidRingBytes = uint64_t{2} << 20;

std::vector<std::string> ShortLeaseFlags() {
  return {absl::StrCat("--lease_timeout=", absl::ToInt64Seconds(kFailureLease),
                       "s"),
          kSmallChunks};
}

void PrintLatency(const std::string& what, absl::Duration latency) {
  std::printf("[ latency  ] %s: %s\n", what.c_str(),
              absl::FormatDuration(latency).c_str());
  std::fflush(stdout);
}

// The status every survivor gets when `victim` (rank 2) was evicted.
auto EvictedVerdict(const std::string& group, const std::string& victim) {
  return StatusIs(
      absl::StatusCode::kAborted,
      AllOf(HasSubstr(absl::StrCat("group ", group, " (epoch ")),
            HasSubstr(absl::StrCat("rank 2 on worker \"", victim, "\"")),
            HasSubstr("no heartbeat within the lease")));
}

// Waits for every call in `calls` until `deadline`; a call still running
// then is a hang as far as the design is concerned.
void ExpectAllEndBy(const std::vector<std::unique_ptr<BackgroundCall>>& calls,
                    absl::Time deadline, absl::Time lost_at,
                    const std::string& what) {
  for (size_t rank = 0; rank < calls.size(); ++rank) {
    const bool ended = calls[rank]->WaitUntilTime(deadline);
    EXPECT_TRUE(ended) << "rank " << rank << " still waiting "
                       << (absl::Now() - lost_at) << " after " << what;
    if (ended) {
      PrintLatency(absl::StrCat(what, " -> verdict on rank ", rank, " (",
                                calls[rank]->status().ToString(), ")"),
                   calls[rank]->ended_at() - lost_at);
    }
  }
}

class LostWorkerTest : public ::testing::Test {
 protected:
  // The coordinator's flags.
  virtual std::vector<std::string> Flags() { return ShortLeaseFlags(); }

  void SetUp() override {
    absl::StatusOr<std::unique_ptr<FailureCluster>> cluster =
        FailureCluster::Start(Flags(), {"survivor-0", "survivor-1"});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
  }

  // Starts worker `name` and forms `group` with ranks 0 and 1 on the
  // survivors and rank 2 on the new worker; returns the worker's index.
  int JoinWithVictim(const std::string& group, const std::string& name,
                     std::vector<std::unique_ptr<Communicator>>* ranks) {
    absl::StatusOr<int> victim = cluster_->AddWorker(name);
    EXPECT_TRUE(victim.ok()) << victim.status();
    if (!victim.ok()) return -1;
    absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> joined =
        cluster_->Join(group, {0, 1, *victim});
    EXPECT_TRUE(joined.ok()) << joined.status();
    if (!joined.ok()) return -1;
    *ranks = *std::move(joined);
    return *victim;
  }

  // Starts AllReduceU32(count) on ranks 0 .. `callers`-1 (planned freely).
  static std::vector<std::unique_ptr<BackgroundCall>> StartCalls(
      const std::vector<std::unique_ptr<Communicator>>& ranks, int callers,
      uint64_t count) {
    std::vector<std::unique_ptr<BackgroundCall>> calls;
    for (int rank = 0; rank < callers; ++rank) {
      calls.push_back(std::make_unique<BackgroundCall>(
          ranks[rank].get(), AllReduceU32(count), RankInputU32(rank, count),
          FailureCallOptions()));
    }
    return calls;
  }

  // Waits until the victim process `victim_pid` (rank 2) delivered
  // kMidRingBytes to its ring successor, rank 0's worker.
  absl::Status WaitForRingProgress(
      pid_t victim_pid,
      const std::vector<std::unique_ptr<BackgroundCall>>& calls) {
    return WaitForBytesDelivered(victim_pid, cluster_->worker(0).port,
                                 kMidRingBytes, calls);
  }

  std::unique_ptr<FailureCluster> cluster_;
};

// The small-call tests run twice: with the coordinator judging every call,
// and with small calls at the group's rank-0 worker (--leader_calls), where
// the callers take a call the leader cannot end to the coordinator.
class LostWorkerSmallCallTest : public LostWorkerTest,
                                public ::testing::WithParamInterface<bool> {
 protected:
  std::vector<std::string> Flags() override {
    std::vector<std::string> flags = ShortLeaseFlags();
    if (GetParam()) flags.push_back("--leader_calls");
    return flags;
  }
};

INSTANTIATE_TEST_SUITE_P(Judges, LostWorkerSmallCallTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "leader" : "coordinator";
                         });

TEST_P(LostWorkerSmallCallTest, Kill_BeforeRankCalls_OthersAbortedNamingIt) {
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const std::string group = absl::StrCat("before-call-", round);
    const std::string victim_name = absl::StrCat("victim-", round);
    std::vector<std::unique_ptr<Communicator>> ranks;
    const int victim = JoinWithVictim(group, victim_name, &ranks);
    ASSERT_GE(victim, 0);

    const absl::Time killed_at = absl::Now();
    ASSERT_TRUE(cluster_->worker(victim).process->Kill().ok());
    std::vector<std::unique_ptr<BackgroundCall>> calls =
        StartCalls(ranks, 2, kSmallCount);
    ExpectAllEndBy(calls, killed_at + kLostWorkerBound, killed_at,
                   "SIGKILL before rank 2 called");
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(calls[rank]->done());
      EXPECT_THAT(calls[rank]->status(), EvictedVerdict(group, victim_name))
          << "rank " << rank;
    }

    // Later calls on the aborted epoch get the same verdict at once.
    const absl::Time later_at = absl::Now();
    BackgroundCall later(ranks[0].get(), AllReduceU32(kSmallCount),
                         RankInputU32(0, kSmallCount), FailureCallOptions());
    ASSERT_TRUE(later.WaitFor(absl::Seconds(1) + kSchedulingSlack))
        << "a call on the aborted group is still waiting";
    EXPECT_THAT(later.status(), EvictedVerdict(group, victim_name));
    PrintLatency("call on an aborted group", later.ended_at() - later_at);

    absl::StatusOr<int> code =
        cluster_->worker(victim).process->WaitForExit(kExitTimeout);
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, ExitCodeForSignal(SIGKILL));
  }
}

TEST_P(LostWorkerSmallCallTest,
       Kill_WhilePeersWaitInMatching_OthersAbortedNamingIt) {
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const std::string group = absl::StrCat("matching-", round);
    const std::string victim_name = absl::StrCat("victim-", round);
    std::vector<std::unique_ptr<Communicator>> ranks;
    const int victim = JoinWithVictim(group, victim_name, &ranks);
    ASSERT_GE(victim, 0);

    std::vector<std::unique_ptr<BackgroundCall>> calls;
    for (int rank = 0; rank < 2; ++rank) {
      calls.push_back(std::make_unique<BackgroundCall>(
          ranks[rank].get(), AllReduceU32(kSmallCount),
          RankInputU32(rank, kSmallCount), FailureCallOptions()));
    }
    ASSERT_TRUE(cluster_->WaitForPending(group, 1, {2}))
        << "ranks 0 and 1 never waited in matching for rank 2";

    const absl::Time killed_at = absl::Now();
    ASSERT_TRUE(cluster_->worker(victim).process->Kill().ok());
    ExpectAllEndBy(calls, killed_at + kLostWorkerBound, killed_at,
                   "SIGKILL while peers wait in matching");
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(calls[rank]->done());
      EXPECT_THAT(calls[rank]->status(), EvictedVerdict(group, victim_name))
          << "rank " << rank;
    }
  }
}

TEST_F(LostWorkerTest, Kill_MidRing_NoSurvivorSucceedsOrHangs) {
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const std::string group = absl::StrCat("mid-ring-", round);
    const std::string victim_name = absl::StrCat("victim-", round);
    std::vector<std::unique_ptr<Communicator>> ranks;
    const int victim = JoinWithVictim(group, victim_name, &ranks);
    ASSERT_GE(victim, 0);
    const pid_t victim_pid = cluster_->worker(victim).process->pid();

    std::vector<std::unique_ptr<BackgroundCall>> calls;
    for (int rank = 0; rank < 3; ++rank) {
      calls.push_back(std::make_unique<BackgroundCall>(
          ranks[rank].get(), AllReduceU32(kLargeCount),
          RankInputU32(rank, kLargeCount),
          FailureCallOptions(Algorithm::kRing)));
    }
    const absl::Status progress = WaitForRingProgress(victim_pid, calls);
    ASSERT_TRUE(progress.ok()) << "the ring never got under way: " << progress;
    const absl::Time killed_at = absl::Now();
    ASSERT_TRUE(cluster_->worker(victim).process->Kill().ok());
    ASSERT_FALSE(calls[2]->done() && calls[2]->status().ok())
        << "the ring finished before the kill; make kLargeCount larger";

    std::vector<std::unique_ptr<BackgroundCall>> survivors;
    survivors.push_back(std::move(calls[0]));
    survivors.push_back(std::move(calls[1]));
    ExpectAllEndBy(survivors, killed_at + kLostWorkerBound, killed_at,
                   "SIGKILL mid-ring");
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(survivors[rank]->done());
      // Rank 1 sends to rank 2 and sees the broken stream; rank 0 waits for
      // rank 2's chunks and learns of the abort. Either way one verdict.
      EXPECT_THAT(survivors[rank]->status(),
                  AnyOf(StatusIs(absl::StatusCode::kAborted,
                                 AllOf(HasSubstr(group), HasSubstr("rank 2"))),
                        StatusIs(absl::StatusCode::kUnavailable,
                                 AllOf(HasSubstr(group), HasSubstr("rank 2")))))
          << "rank " << rank;
      EXPECT_TRUE(survivors[rank]->output().empty()) << "rank " << rank;
    }
    // Both survivors got the same verdict.
    EXPECT_EQ(survivors[0]->status(), survivors[1]->status());
    // The victim's own client lost its daemon.
    ASSERT_TRUE(calls[2]->WaitFor(absl::Seconds(10)));
    EXPECT_FALSE(calls[2]->status().ok());
  }
}

TEST_F(LostWorkerTest,
       Kill_BetweenBoundSameHostCalls_SurvivorsAbortedNamingIt) {
  // 80,000 bytes: planned same_host; the calls after the first run on its
  // kept segments without the coordinator, so the survivors learn of the
  // loss from their own waits.
  constexpr uint64_t kBoundCount = 20000;
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const std::string group = absl::StrCat("bound-", round);
    std::vector<std::unique_ptr<Communicator>> ranks;
    const int victim =
        JoinWithVictim(group, absl::StrCat("victim-", round), &ranks);
    ASSERT_GE(victim, 0);
    for (int call = 0; call < 3; ++call) {
      std::vector<std::unique_ptr<BackgroundCall>> calls =
          StartCalls(ranks, 3, kBoundCount);
      for (int rank = 0; rank < 3; ++rank) {
        ASSERT_TRUE(calls[rank]->WaitFor(kFailureCallTimeout));
        ASSERT_TRUE(calls[rank]->result().ok()) << calls[rank]->status();
        EXPECT_EQ(calls[rank]->result()->algorithm, Algorithm::kSameHost);
        EXPECT_EQ(calls[rank]->output(), SumOfInputsU32(3, kBoundCount));
      }
    }
    const absl::Time killed_at = absl::Now();
    ASSERT_TRUE(cluster_->worker(victim).process->Kill().ok());
    std::vector<std::unique_ptr<BackgroundCall>> survivors =
        StartCalls(ranks, 2, kBoundCount);
    ExpectAllEndBy(survivors, killed_at + kLostWorkerBound, killed_at,
                   "SIGKILL between bound same_host calls");
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(survivors[rank]->done());
      EXPECT_THAT(survivors[rank]->status(),
                  AnyOf(StatusIs(absl::StatusCode::kAborted,
                                 AllOf(HasSubstr(group), HasSubstr("rank 2"))),
                        StatusIs(absl::StatusCode::kUnavailable,
                                 AllOf(HasSubstr(group), HasSubstr("rank 2")))))
          << "rank " << rank;
      EXPECT_TRUE(survivors[rank]->output().empty()) << "rank " << rank;
    }
  }
}

TEST_F(LostWorkerTest, Stop_WhilePeersWaitInMatching_OthersAbortedNamingIt) {
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const std::string group = absl::StrCat("stopped-", round);
    const std::string victim_name = absl::StrCat("victim-", round);
    std::vector<std::unique_ptr<Communicator>> ranks;
    const int victim = JoinWithVictim(group, victim_name, &ranks);
    ASSERT_GE(victim, 0);
    Subprocess& process = *cluster_->worker(victim).process;

    std::vector<std::unique_ptr<BackgroundCall>> calls;
    for (int rank = 0; rank < 2; ++rank) {
      calls.push_back(std::make_unique<BackgroundCall>(
          ranks[rank].get(), AllReduceU32(kSmallCount),
          RankInputU32(rank, kSmallCount), FailureCallOptions()));
    }
    ASSERT_TRUE(cluster_->WaitForPending(group, 1, {2}));

    const absl::Time stopped_at = absl::Now();
    ASSERT_TRUE(process.Signal(SIGSTOP).ok());
    ExpectAllEndBy(calls, stopped_at + kLostWorkerBound, stopped_at,
                   "SIGSTOP while peers wait in matching");
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(calls[rank]->done());
      EXPECT_THAT(calls[rank]->status(), EvictedVerdict(group, victim_name))
          << "rank " << rank;
    }

    // Resumed, the worker finds itself forgotten and registers again.
    ASSERT_TRUE(process.Signal(SIGCONT).ok());
    std::vector<std::string> expected = {"survivor-0", "survivor-1",
                                         victim_name};
    EXPECT_TRUE(cluster_->WaitForWorkers(expected))
        << "the resumed worker did not register again";
    ASSERT_TRUE(process.Kill().ok());
    ASSERT_TRUE(process.WaitForExit(kExitTimeout).ok());
    EXPECT_TRUE(cluster_->WaitForWorkers({"survivor-0", "survivor-1"}));
  }
}

TEST_F(LostWorkerTest, Stop_MidRing_NoRankSucceedsOrHangs) {
  const std::string group = "stopped-mid-ring";
  const std::string victim_name = "victim";
  std::vector<std::unique_ptr<Communicator>> ranks;
  const int victim = JoinWithVictim(group, victim_name, &ranks);
  ASSERT_GE(victim, 0);
  Subprocess& process = *cluster_->worker(victim).process;

  std::vector<std::unique_ptr<BackgroundCall>> calls;
  for (int rank = 0; rank < 3; ++rank) {
    calls.push_back(std::make_unique<BackgroundCall>(
        ranks[rank].get(), AllReduceU32(kLargeCount),
        RankInputU32(rank, kLargeCount), FailureCallOptions(Algorithm::kRing)));
  }
  const absl::Status progress = WaitForRingProgress(process.pid(), calls);
  ASSERT_TRUE(progress.ok()) << "the ring never got under way: " << progress;
  const absl::Time stopped_at = absl::Now();
  ASSERT_TRUE(process.Signal(SIGSTOP).ok());
  ASSERT_FALSE(calls[2]->done() && calls[2]->status().ok())
      << "the ring finished before the stop; make kLargeCount larger";

  std::vector<std::unique_ptr<BackgroundCall>> survivors;
  survivors.push_back(std::move(calls[0]));
  survivors.push_back(std::move(calls[1]));
  ExpectAllEndBy(survivors, stopped_at + kLostWorkerBound, stopped_at,
                 "SIGSTOP mid-ring");
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(survivors[rank]->done());
    EXPECT_THAT(survivors[rank]->status(),
                AnyOf(StatusIs(absl::StatusCode::kAborted,
                               AllOf(HasSubstr(group), HasSubstr("rank 2"))),
                      StatusIs(absl::StatusCode::kUnavailable,
                               AllOf(HasSubstr(group), HasSubstr("rank 2")))))
        << "rank " << rank;
  }

  // The stopped rank, once resumed, learns it was dropped and ends too.
  const absl::Time resumed_at = absl::Now();
  ASSERT_TRUE(process.Signal(SIGCONT).ok());
  ASSERT_TRUE(calls[2]->WaitFor(absl::Seconds(5) + kSchedulingSlack))
      << "the resumed rank is still running its collective";
  PrintLatency("SIGCONT -> verdict on the stopped rank",
               calls[2]->ended_at() - resumed_at);
  EXPECT_FALSE(calls[2]->status().ok());
}

TEST_F(LostWorkerTest, Kill_BetweenCollectives_NextAbortedThenRejoinWorks) {
  const std::string group = "between";
  uint64_t last_epoch = 0;
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const std::string victim_name = absl::StrCat("victim-", round);
    std::vector<std::unique_ptr<Communicator>> ranks;
    const int victim = JoinWithVictim(group, victim_name, &ranks);
    ASSERT_GE(victim, 0);
    EXPECT_GT(ranks[0]->epoch(), last_epoch);
    // The data plane connects every pair of neighbours.
    ASSERT_TRUE(AllReduceWorks(ranks, 1 << 16, Algorithm::kRing));

    const absl::Time killed_at = absl::Now();
    ASSERT_TRUE(cluster_->worker(victim).process->Kill().ok());
    std::vector<std::unique_ptr<BackgroundCall>> calls;
    for (int rank = 0; rank < 2; ++rank) {
      calls.push_back(std::make_unique<BackgroundCall>(
          ranks[rank].get(), AllReduceU32(1 << 16), RankInputU32(rank, 1 << 16),
          FailureCallOptions(Algorithm::kRing)));
    }
    ExpectAllEndBy(calls, killed_at + kLostWorkerBound, killed_at,
                   "SIGKILL between collectives");
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(calls[rank]->done());
      EXPECT_THAT(calls[rank]->status(), EvictedVerdict(group, victim_name))
          << "rank " << rank;
    }
    calls.clear();

    // A replacement worker takes rank 2; the group forms again at a new
    // epoch and works on both plans.
    std::vector<std::unique_ptr<Communicator>> reformed;
    const int replacement =
        JoinWithVictim(group, absl::StrCat("replacement-", round), &reformed);
    ASSERT_GE(replacement, 0);
    EXPECT_GT(reformed[0]->epoch(), ranks[0]->epoch());
    EXPECT_TRUE(AllReduceWorks(reformed, kSmallCount, Algorithm::kInline));
    EXPECT_TRUE(AllReduceWorks(reformed, 1 << 16, Algorithm::kRing));
    last_epoch = reformed[0]->epoch();
  }
}

}  // namespace
}  // namespace chorus::test
