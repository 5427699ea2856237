// A loop of collectives on three ranks while the leading coordinator is
// killed: the standby takes over the workers and the group from etcd, the
// calls the old leader could not answer go again to it, and every
// collective returns its right result, only later. Real etcd, coordinators
// and workers on 127.0.0.1; the ranks are embedded (in this process) or
// clients of worker daemons.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "chorus/communicator.h"
#include "gtest/gtest.h"
#include "server/worker/local/local_worker.h"
#include "tests/testing/collective_reference.h"
#include "tests/testing/daemons.h"
#include "tests/testing/etcd.h"
#include "tests/testing/wait.h"

namespace chorus::test {
namespace {

constexpr int kRanks = 3;
// The etcd lease and the workers' lease (etcd grants 2 s at least).
constexpr absl::Duration kLease = absl::Seconds(2);
// Generous: a loaded two-core machine. A call waits through the failover.
constexpr absl::Duration kCallTimeout = absl::Seconds(60);
constexpr absl::Duration kTakeover = absl::Seconds(30);
// Collectives each rank runs before the kill, and after it.
constexpr int kBefore = 20;
constexpr int kAfter = 20;

class FailoverLoopTest : public EtcdTest {
 protected:
  void SetUp() override {
    EtcdTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    leader_ = StartCandidate();
    ASSERT_TRUE(WaitUntil([&] { return Leads(leader_.address); }, kTakeover));
    standby_ = StartCandidate();
    both_ = absl::StrCat(leader_.address, ",", standby_.address);
  }

  Daemon StartCandidate() {
    absl::StatusOr<Daemon> started = StartCoordinator(
        {absl::StrCat("--listen=127.0.0.1:", PickFreePort()),
         absl::StrCat("--etcd=", etcd_.endpoint), "--etcd_prefix=/loop",
         absl::StrCat("--lease_timeout=", absl::FormatDuration(kLease))});
    EXPECT_TRUE(started.ok()) << started.status();
    return started.ok() ? *std::move(started) : Daemon();
  }

  static bool Leads(const std::string& address) {
    auto stub = NewCoordinatorStub(address);
    return ListWorkers(*stub, absl::Seconds(5)).ok();
  }

  // Runs kBefore + kAfter all_reduces (sum of rank + 1 times the call's
  // number) on every rank of `ranks`, killing the leader once every rank
  // finished kBefore. Expects every result right; prints the longest time
  // from the kill to a rank's next completed collective.
  void LoopThroughKill(
      const std::vector<std::unique_ptr<Communicator>>& ranks) {
    std::atomic<int> before_done{0};
    absl::Mutex mu;
    absl::Time killed = absl::InfiniteFuture();
    absl::Duration longest = absl::ZeroDuration();
    std::vector<std::string> failures;
    std::thread killer([&] {
      EXPECT_TRUE(
          WaitUntil([&] { return before_done.load() == kRanks; }, kTakeover));
      EXPECT_TRUE(leader_.process->Signal(SIGKILL).ok());
      absl::MutexLock lock(&mu);
      killed = absl::Now();
    });
    RunOnRanks(kRanks, [&](int rank) {
      for (int call = 1; call <= kBefore + kAfter; ++call) {
        if (call == kBefore + 1) {
          ++before_done;
          absl::MutexLock lock(&mu);
          mu.Await(absl::Condition(
              +[](absl::Time* t) { return *t != absl::InfiniteFuture(); },
              &killed));
        }
        CallOptions options;
        options.timeout = kCallTimeout;
        std::vector<int64_t> out;
        const absl::Status status = ranks[rank]->AllReduce(
            std::vector<int64_t>{(rank + 1) * int64_t{call}}, &out,
            ReduceOp::kSum, options);
        absl::MutexLock lock(&mu);
        if (call == kBefore + 1)
          longest = std::max(longest, absl::Now() - killed);
        const int64_t want = 6 * int64_t{call};
        if (!status.ok() || out.size() != 1 || out[0] != want) {
          failures.push_back(absl::StrCat(
              "rank ", rank, " call ", call, ": ", status.ToString(), " got ",
              out.empty() ? -1 : out[0], " want ", want));
        }
      }
    });
    killer.join();
    for (const std::string& failure : failures) ADD_FAILURE() << failure;
    std::cout << "kill -9 of the leader to every rank's next completed "
                 "collective: "
              << longest << " (lease " << kLease << ")\n";
  }

  Daemon leader_;
  Daemon standby_;
  std::string both_;
};

TEST_F(FailoverLoopTest, LeaderKilled_EmbeddedRanksGetEveryResult) {
  std::vector<std::unique_ptr<LocalWorker>> workers;
  for (int i = 0; i < kRanks; ++i) {
    LocalWorkerOptions options;
    options.runtime.coordinator = both_;
    options.runtime.name = absl::StrCat("embedded-", i);
    options.runtime.register_timeout = kStartTimeout;
    absl::StatusOr<std::unique_ptr<LocalWorker>> started =
        LocalWorker::Start(std::move(options));
    ASSERT_TRUE(started.ok()) << started.status();
    workers.push_back(*std::move(started));
  }
  std::vector<std::unique_ptr<Communicator>> ranks(kRanks);
  RunOnRanks(kRanks, [&](int rank) {
    JoinOptions options;
    options.timeout = kCallTimeout;
    absl::StatusOr<std::unique_ptr<Communicator>> joined =
        Communicator::JoinEmbedded(workers[rank].get(), "loop", kRanks, rank,
                                   options);
    ASSERT_TRUE(joined.ok()) << joined.status();
    ranks[rank] = *std::move(joined);
  });
  LoopThroughKill(ranks);
  ranks.clear();
  RunOnRanks(kRanks, [&](int i) { workers[i]->Shutdown(); });
}

TEST_F(FailoverLoopTest, LeaderKilled_DaemonRanksGetEveryResult) {
  std::vector<Daemon> workers;
  for (int i = 0; i < kRanks; ++i) {
    absl::StatusOr<Daemon> started =
        StartWorker(both_, {absl::StrCat("--name=daemon-", i)});
    ASSERT_TRUE(started.ok()) << started.status();
    workers.push_back(*std::move(started));
  }
  std::vector<std::unique_ptr<Communicator>> ranks(kRanks);
  RunOnRanks(kRanks, [&](int rank) {
    JoinOptions options;
    options.timeout = kCallTimeout;
    absl::StatusOr<std::unique_ptr<Communicator>> joined =
        Communicator::JoinThroughDaemon(workers[rank].address, "loop", kRanks,
                                        rank, options);
    ASSERT_TRUE(joined.ok()) << joined.status();
    ranks[rank] = *std::move(joined);
  });
  LoopThroughKill(ranks);
}

}  // namespace
}  // namespace chorus::test
