// Failure tests: restarts and graceful shutdown. A coordinator killed while
// ranks wait fails their calls with UNAVAILABLE and, restarted on the same
// port, is re-registered by its workers without help, and a join sent
// right after the restart succeeds once they did; a worker restarted
// under the same name aborts its old groups and comes back with a new
// incarnation; SIGTERM ends a worker or the coordinator in order, with a
// status for every waiting rank. Real daemons on 127.0.0.1; the ranks are
// worker daemons driven by clients in this test.

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

namespace chorus::test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kCount = 16;
constexpr uint64_t kRingCount = 1 << 16;
// A ring long enough to be signalled in the middle of: 48 MiB per rank in
// 64 KiB chunks; the leaving worker (rank 2) is signalled once it delivered
// kMidRingBytes of its 64 MiB to its successor.
constexpr uint64_t kLargeCount = uint64_t{12} << 20;
constexpr uint64_t kMidRingBytes = uint64_t{2} << 20;
constexpr absl::Duration kExitTimeout = absl::Seconds(30);
// A daemon told to stop (SIGTERM) must be gone within this: it deregisters
// (one call) and gives in-flight calls a two-second grace.
constexpr absl::Duration kShutdownBound = absl::Seconds(10);
// Verdicts that need no lease to expire: one hop to the coordinator and
// back, plus kSchedulingSlack.
const absl::Duration kPromptBound = absl::Seconds(1) + kSchedulingSlack;
// Leases longer than any of these tests, so that only the event under test
// (a restart, a shutdown) can explain an abort.
constexpr char kLongLease[] = "--lease_timeout=60s";

void PrintVerdict(const std::string& what, const BackgroundCall& call,
                  absl::Time since) {
  std::printf("[ latency  ] %s: %s (%s)\n", what.c_str(),
              absl::FormatDuration(call.ended_at() - since).c_str(),
              call.status().ToString().c_str());
  std::fflush(stdout);
}

std::vector<std::unique_ptr<BackgroundCall>> CallOn(
    const std::vector<std::unique_ptr<Communicator>>& ranks,
    const std::vector<int>& callers) {
  std::vector<std::unique_ptr<BackgroundCall>> calls;
  for (int rank : callers) {
    calls.push_back(std::make_unique<BackgroundCall>(
        ranks[rank].get(), AllReduceU32(kCount), RankInputU32(rank, kCount),
        FailureCallOptions()));
  }
  return calls;
}

absl::StatusOr<v1::WorkerInfo> FindWorker(FailureCluster& cluster,
                                          const std::string& name) {
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers =
      ListWorkers(cluster.stub());
  if (!workers.ok()) return workers.status();
  for (const v1::WorkerInfo& worker : *workers) {
    if (worker.name() == name) return worker;
  }
  return absl::NotFoundError(absl::StrCat("no worker ", name));
}

TEST(RestartTest, CoordinatorKilled_WhileRanksWait_UnavailableThenRecovers) {
  absl::StatusOr<std::unique_ptr<FailureCluster>> started =
      FailureCluster::Start({"--lease_timeout=2s"},
                            {"worker-0", "worker-1", "worker-2"});
  ASSERT_TRUE(started.ok()) << started.status();
  FailureCluster& cluster = **started;
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const std::string group = "restarted";
    absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> ranks =
        cluster.Join(group, {0, 1, 2});
    ASSERT_TRUE(ranks.ok()) << ranks.status();
    ASSERT_TRUE(AllReduceWorks(*ranks, kRingCount, Algorithm::kRing));

    std::vector<std::unique_ptr<BackgroundCall>> calls = CallOn(*ranks, {0, 1});
    ASSERT_TRUE(cluster.WaitForPending(group, 2, {2}));
    const absl::Time killed_at = absl::Now();
    ASSERT_TRUE(cluster.coordinator().process->Kill().ok());
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(calls[rank]->WaitUntilTime(killed_at + kPromptBound))
          << "rank " << rank << " still waiting after the coordinator died";
      PrintVerdict(absl::StrCat("coordinator SIGKILL -> rank ", rank),
                   *calls[rank], killed_at);
      EXPECT_THAT(
          calls[rank]->status(),
          StatusIs(absl::StatusCode::kUnavailable, Not(HasSubstr("Deadline"))))
          << "rank " << rank;
    }
    calls.clear();
    ASSERT_TRUE(cluster.coordinator().process->WaitForExit(kExitTimeout).ok());

    // A new coordinator on the same port; the workers find it themselves.
    ASSERT_TRUE(cluster.RestartCoordinator().ok());
    const absl::Time restarted_at = absl::Now();
    ASSERT_TRUE(cluster.WaitForWorkers({"worker-0", "worker-1", "worker-2"}))
        << "the workers did not register with the new coordinator";
    std::printf("[ latency  ] workers re-registered %s after the restart\n",
                absl::FormatDuration(absl::Now() - restarted_at).c_str());

    absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> rejoined =
        cluster.Join(group, {0, 1, 2});
    ASSERT_TRUE(rejoined.ok()) << rejoined.status();
    EXPECT_NE((*rejoined)[0]->epoch(), (*ranks)[0]->epoch());
    EXPECT_TRUE(AllReduceWorks(*rejoined, kCount, Algorithm::kInline));
    EXPECT_TRUE(AllReduceWorks(*rejoined, kRingCount, Algorithm::kRing));
  }
}

// A join sent right after a coordinator restart, before the workers' next
// heartbeat (every 5 s under this lease) told them they must register again:
// the new coordinator does not know their worker ids and answers
// UNAVAILABLE saying the worker is registering again; each worker then
// checks its registration at once (registering again) and sends the join
// again under its new id. The join succeeds, well before a heartbeat would
// have come. (It used to fail on every rank with NOT_FOUND: unknown worker
// id N.)
TEST(RestartTest, JoinRightAfterCoordinatorRestart_WorkersRegisterAgainJoined) {
  absl::StatusOr<std::unique_ptr<FailureCluster>> started =
      FailureCluster::Start({"--lease_timeout=20s"}, {"worker-0", "worker-1"});
  ASSERT_TRUE(started.ok()) << started.status();
  FailureCluster& cluster = **started;
  ASSERT_TRUE(cluster.coordinator().process->Kill().ok());
  ASSERT_TRUE(cluster.coordinator().process->WaitForExit(kExitTimeout).ok());
  ASSERT_TRUE(cluster.RestartCoordinator().ok());

  const absl::Time restarted_at = absl::Now();
  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> ranks =
      cluster.Join("after-restart", {0, 1});
  const absl::Duration took = absl::Now() - restarted_at;
  std::printf("[ latency  ] join right after a coordinator restart: %s\n",
              absl::FormatDuration(took).c_str());
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  EXPECT_LE(took, kPromptBound + absl::Seconds(1));
  EXPECT_TRUE(AllReduceWorks(*ranks, kCount, Algorithm::kInline));
}

TEST(RestartTest, WorkerRestarted_SameName_OldGroupsAbortedNewIncarnation) {
  absl::StatusOr<std::unique_ptr<FailureCluster>> started =
      FailureCluster::Start({kLongLease}, {"worker-0", "worker-1", "phoenix"});
  ASSERT_TRUE(started.ok()) << started.status();
  FailureCluster& cluster = **started;
  int phoenix = 2;
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const std::string group = absl::StrCat("phoenix-", round);
    absl::StatusOr<v1::WorkerInfo> before = FindWorker(cluster, "phoenix");
    ASSERT_TRUE(before.ok()) << before.status();
    absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> ranks =
        cluster.Join(group, {0, 1, phoenix});
    ASSERT_TRUE(ranks.ok()) << ranks.status();
    std::vector<std::unique_ptr<BackgroundCall>> calls = CallOn(*ranks, {0, 1});
    ASSERT_TRUE(cluster.WaitForPending(group, 1, {2}));

    ASSERT_TRUE(cluster.worker(phoenix).process->Kill().ok());
    ASSERT_TRUE(
        cluster.worker(phoenix).process->WaitForExit(kExitTimeout).ok());
    // The lease is a minute: nothing is aborted until the worker is back.
    EXPECT_FALSE(calls[0]->done() || calls[1]->done());
    const absl::Time restart_at = absl::Now();
    absl::StatusOr<int> restarted = cluster.AddWorker("phoenix");
    ASSERT_TRUE(restarted.ok()) << restarted.status();
    phoenix = *restarted;
    // It registered before AddWorker returned; the abort comes with that.
    const absl::Time registered_at = absl::Now();
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(calls[rank]->WaitUntilTime(registered_at + kPromptBound))
          << "rank " << rank << " still waiting after the restart";
      PrintVerdict(absl::StrCat("worker restart -> rank ", rank), *calls[rank],
                   restart_at);
      EXPECT_THAT(
          calls[rank]->status(),
          StatusIs(absl::StatusCode::kAborted,
                   AllOf(HasSubstr(absl::StrCat("group ", group)),
                         HasSubstr("rank 2 on worker \"phoenix\""),
                         HasSubstr("restarted with a new incarnation"))))
          << "rank " << rank;
    }

    absl::StatusOr<v1::WorkerInfo> after = FindWorker(cluster, "phoenix");
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_NE(after->incarnation(), before->incarnation());
    EXPECT_NE(after->worker_id(), before->worker_id());
    EXPECT_TRUE(cluster.WaitForWorkers({"phoenix", "worker-0", "worker-1"}));

    absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> rejoined =
        cluster.Join(group, {0, 1, phoenix});
    ASSERT_TRUE(rejoined.ok()) << rejoined.status();
    EXPECT_GT((*rejoined)[0]->epoch(), (*ranks)[0]->epoch());
    EXPECT_TRUE(AllReduceWorks(*rejoined, kRingCount, Algorithm::kRing));
  }
}

TEST(ShutdownTest, WorkerSigterm_WhileRankWaits_ExitsZeroAndPeersAborted) {
  absl::StatusOr<std::unique_ptr<FailureCluster>> started =
      FailureCluster::Start({kLongLease}, {"worker-0", "worker-1"});
  ASSERT_TRUE(started.ok()) << started.status();
  FailureCluster& cluster = **started;
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const std::string group = absl::StrCat("sigterm-", round);
    const std::string leaving_name = absl::StrCat("leaving-", round);
    absl::StatusOr<int> leaving = cluster.AddWorker(leaving_name);
    ASSERT_TRUE(leaving.ok()) << leaving.status();
    absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> ranks =
        cluster.Join(group, {0, 1, *leaving});
    ASSERT_TRUE(ranks.ok()) << ranks.status();
    // Ranks 1 and 2 wait for rank 0; rank 2's worker is told to stop.
    std::vector<std::unique_ptr<BackgroundCall>> calls = CallOn(*ranks, {1, 2});
    ASSERT_TRUE(cluster.WaitForPending(group, 1, {0}));

    Subprocess& process = *cluster.worker(*leaving).process;
    const absl::Time signalled_at = absl::Now();
    ASSERT_TRUE(process.Signal(SIGTERM).ok());
    absl::StatusOr<int> code = process.WaitForExit(kShutdownBound);
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0);
    std::printf("[ latency  ] SIGTERM -> worker exit: %s\n",
                absl::FormatDuration(absl::Now() - signalled_at).c_str());

    const auto shut_down = StatusIs(
        absl::StatusCode::kAborted,
        AllOf(
            HasSubstr(absl::StrCat("group ", group)),
            HasSubstr(absl::StrCat("rank 2 on worker \"", leaving_name, "\"")),
            HasSubstr("it shut down")));
    // The leaving rank's own call was answered by its daemon before it
    // exited (the answer may still be on its way here when the exit is
    // seen; a daemon gone without answering would leave a closed
    // connection, not this text).
    ASSERT_TRUE(calls[1]->WaitFor(kShutdownBound))
        << "the leaving rank's call was never answered";
    PrintVerdict("SIGTERM -> the leaving rank", *calls[1], signalled_at);
    EXPECT_THAT(calls[1]->status(),
                StatusIs(absl::StatusCode::kUnavailable,
                         HasSubstr("this worker is shutting down")));
    // The waiting peer learns who left.
    ASSERT_TRUE(calls[0]->WaitUntilTime(signalled_at + kPromptBound))
        << "rank 1 still waiting after its peer shut down";
    PrintVerdict("SIGTERM -> rank 1", *calls[0], signalled_at);
    EXPECT_THAT(calls[0]->status(), shut_down);
    // So does the rank that had not called yet, at once.
    BackgroundCall late((*ranks)[0].get(), AllReduceU32(kCount),
                        RankInputU32(0, kCount), FailureCallOptions());
    ASSERT_TRUE(late.WaitFor(kPromptBound));
    EXPECT_THAT(late.status(), shut_down);
    EXPECT_TRUE(cluster.WaitForWorkers({"worker-0", "worker-1"}));
  }
}

TEST(ShutdownTest, WorkerSigterm_MidRing_ExitsZeroAndNoRankHangs) {
  // A short lease: the survivors waiting on the data plane learn of the
  // abort with their next heartbeat, a quarter of the lease.
  absl::StatusOr<std::unique_ptr<FailureCluster>> started =
      FailureCluster::Start({"--lease_timeout=2s", "--chunk_bytes=65536"},
                            {"worker-0", "worker-1", "leaving"});
  ASSERT_TRUE(started.ok()) << started.status();
  FailureCluster& cluster = **started;
  const std::string group = "sigterm-mid-ring";
  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> ranks =
      cluster.Join(group, {0, 1, 2});
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  std::vector<std::unique_ptr<BackgroundCall>> calls;
  for (int rank = 0; rank < 3; ++rank) {
    calls.push_back(std::make_unique<BackgroundCall>(
        (*ranks)[rank].get(), AllReduceU32(kLargeCount),
        RankInputU32(rank, kLargeCount), FailureCallOptions(Algorithm::kRing)));
  }
  Subprocess& process = *cluster.worker(2).process;
  const absl::Status progress = WaitForBytesDelivered(
      process.pid(), cluster.worker(0).port, kMidRingBytes, calls);
  ASSERT_TRUE(progress.ok()) << "the ring never got under way: " << progress;

  const absl::Time signalled_at = absl::Now();
  ASSERT_TRUE(process.Signal(SIGTERM).ok());
  absl::StatusOr<int> code = process.WaitForExit(kShutdownBound);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  std::printf("[ latency  ] SIGTERM mid-ring -> worker exit: %s\n",
              absl::FormatDuration(absl::Now() - signalled_at).c_str());
  // The answer may still be on its way to this process when the exit is
  // seen; its text shows the worker gave it (a worker that exited without
  // answering would leave the client a closed connection instead).
  ASSERT_TRUE(calls[2]->WaitFor(kShutdownBound))
      << "the leaving rank's call was never answered";
  PrintVerdict("SIGTERM mid-ring -> the leaving rank", *calls[2], signalled_at);
  EXPECT_THAT(calls[2]->status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("this worker is shutting down")));
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(calls[rank]->WaitUntilTime(signalled_at + kLostWorkerBound))
        << "rank " << rank << " still running after its peer shut down";
    PrintVerdict(absl::StrCat("SIGTERM mid-ring -> rank ", rank), *calls[rank],
                 signalled_at);
    EXPECT_THAT(calls[rank]->status(),
                StatusIs(absl::StatusCode::kAborted,
                         AllOf(HasSubstr(absl::StrCat("group ", group)),
                               HasSubstr("rank 2"))))
        << "rank " << rank;
  }
}

TEST(ShutdownTest, CoordinatorSigterm_WhileRanksWait_UnavailablePromptly) {
  absl::StatusOr<std::unique_ptr<FailureCluster>> started =
      FailureCluster::Start({"--lease_timeout=2s"},
                            {"worker-0", "worker-1", "worker-2"});
  ASSERT_TRUE(started.ok()) << started.status();
  FailureCluster& cluster = **started;
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const std::string group = "coordinator-sigterm";
    if (round > 0) {
      ASSERT_TRUE(cluster.RestartCoordinator().ok());
      ASSERT_TRUE(cluster.WaitForWorkers({"worker-0", "worker-1", "worker-2"}));
    }
    absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> ranks =
        cluster.Join(group, {0, 1, 2});
    ASSERT_TRUE(ranks.ok()) << ranks.status();
    std::vector<std::unique_ptr<BackgroundCall>> calls = CallOn(*ranks, {0, 1});
    ASSERT_TRUE(cluster.WaitForPending(group, 1, {2}));

    const absl::Time signalled_at = absl::Now();
    ASSERT_TRUE(cluster.coordinator().process->Signal(SIGTERM).ok());
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(calls[rank]->WaitUntilTime(signalled_at + kPromptBound))
          << "rank " << rank << " still waiting after the coordinator's "
          << "SIGTERM";
      PrintVerdict(absl::StrCat("coordinator SIGTERM -> rank ", rank),
                   *calls[rank], signalled_at);
      EXPECT_THAT(calls[rank]->status(),
                  StatusIs(absl::StatusCode::kUnavailable,
                           HasSubstr("the coordinator is shutting down")))
          << "rank " << rank;
    }
    absl::StatusOr<int> code =
        cluster.coordinator().process->WaitForExit(kShutdownBound);
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0);
  }
}

}  // namespace
}  // namespace chorus::test
