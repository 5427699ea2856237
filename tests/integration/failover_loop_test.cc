// A loop of collectives on three ranks while the leading coordinator is
// killed: the standby takes over the workers and the group from etcd, the
// calls the old leader could not answer go again to it, and every
// collective returns its right result, only later. Real etcd, coordinators
// and workers on 127.0.0.1; the ranks are embedded (in this process) or
// clients of worker daemons.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "chorus/communicator.h"
#include "common/grpc_status.h"
#include "gtest/gtest.h"
#include "server/worker/local/local_worker.h"
#include "tests/testing/collective_reference.h"
#include "tests/testing/daemons.h"
#include "tests/testing/etcd.h"
#include "tests/testing/http_get.h"
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

// A coordinator campaigning on `etcd` (comma-separated client URLs) with
// `lease` as its etcd lease and the workers', serving its metrics on
// `metrics_port` (0: none), with `extra_flags`.
Daemon StartCandidate(const std::string& etcd, absl::Duration lease = kLease,
                      int metrics_port = 0,
                      const std::vector<std::string>& extra_flags = {}) {
  std::vector<std::string> flags = {
      absl::StrCat("--listen=127.0.0.1:", PickFreePort()),
      absl::StrCat("--etcd=", etcd), "--etcd_prefix=/loop",
      absl::StrCat("--lease_timeout=", absl::FormatDuration(lease))};
  flags.insert(flags.end(), extra_flags.begin(), extra_flags.end());
  if (metrics_port > 0) {
    flags.push_back(absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port));
  }
  absl::StatusOr<Daemon> started = StartCoordinator(flags);
  EXPECT_TRUE(started.ok()) << started.status();
  return started.ok() ? *std::move(started) : Daemon();
}

bool Leads(const std::string& address) {
  auto stub = NewCoordinatorStub(address);
  return ListWorkers(*stub, absl::Seconds(5)).ok();
}

// kRanks embedded workers registered with `coordinators`.
std::vector<std::unique_ptr<LocalWorker>> StartEmbedded(
    const std::string& coordinators) {
  std::vector<std::unique_ptr<LocalWorker>> workers;
  for (int i = 0; i < kRanks; ++i) {
    LocalWorkerOptions options;
    options.runtime.coordinator = coordinators;
    options.runtime.name = absl::StrCat("embedded-", i);
    options.runtime.register_timeout = kStartTimeout;
    absl::StatusOr<std::unique_ptr<LocalWorker>> started =
        LocalWorker::Start(std::move(options));
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return {};
    workers.push_back(*std::move(started));
  }
  return workers;
}

// Every rank joins `group` from its own thread through `join(rank)`;
// returns the communicators (empty when a join failed).
std::vector<std::unique_ptr<Communicator>> JoinAll(
    const std::function<absl::StatusOr<std::unique_ptr<Communicator>>(int)>&
        join) {
  std::vector<std::unique_ptr<Communicator>> ranks(kRanks);
  std::atomic<bool> failed{false};
  RunOnRanks(kRanks, [&](int rank) {
    absl::StatusOr<std::unique_ptr<Communicator>> joined = join(rank);
    EXPECT_TRUE(joined.ok()) << joined.status();
    if (!joined.ok()) {
      failed = true;
      return;
    }
    ranks[rank] = *std::move(joined);
  });
  if (failed) ranks.clear();
  return ranks;
}

JoinOptions PatientJoin() {
  JoinOptions options;
  options.timeout = kCallTimeout;
  return options;
}

// The collectives a loop runs: `before` + `after` all_reduces (sum) of
// `count` i64 each, under `algorithm`; `mid_call`: the act happens as
// every rank starts call `before` + 1 (its data plane most likely running),
// else between the calls.
struct LoopShape {
  int before = kBefore;
  int after = kAfter;
  size_t count = 1;
  Algorithm algorithm = Algorithm::kUnspecified;
  bool mid_call = false;
};

// Runs the loop's all_reduces (rank r's input: (r + 1) times the call's
// number in every element) on every rank of `ranks`, running `act` once
// every rank finished `before` calls. Expects every result right; returns
// the longest time from `act` to a rank's next completed collective.
absl::Duration LoopThrough(
    const std::vector<std::unique_ptr<Communicator>>& ranks,
    const std::function<void()>& act, const LoopShape& shape = LoopShape()) {
  std::atomic<int> before_done{0};
  absl::Mutex mu;
  absl::Time acted = absl::InfiniteFuture();
  absl::Duration longest = absl::ZeroDuration();
  std::vector<std::string> failures;
  std::thread actor([&] {
    EXPECT_TRUE(
        WaitUntil([&] { return before_done.load() == kRanks; }, kTakeover));
    act();
    absl::MutexLock lock(&mu);
    acted = absl::Now();
  });
  RunOnRanks(kRanks, [&](int rank) {
    for (int call = 1; call <= shape.before + shape.after; ++call) {
      if (call == shape.before + 1) {
        ++before_done;
        absl::MutexLock lock(&mu);
        if (!shape.mid_call) {
          mu.Await(absl::Condition(
              +[](absl::Time* t) { return *t != absl::InfiniteFuture(); },
              &acted));
        }
      }
      CallOptions options;
      options.timeout = kCallTimeout;
      options.algorithm = shape.algorithm;
      std::vector<int64_t> out;
      const absl::Status status = ranks[rank]->AllReduce(
          std::vector<int64_t>(shape.count, (rank + 1) * int64_t{call}), &out,
          ReduceOp::kSum, options);
      absl::MutexLock lock(&mu);
      if (call == shape.before + 1 && !shape.mid_call) {
        longest = std::max(longest, absl::Now() - acted);
      }
      const int64_t want = 6 * int64_t{call};
      const bool right = out.size() == shape.count &&
                         std::all_of(out.begin(), out.end(),
                                     [want](int64_t v) { return v == want; });
      if (!status.ok() || !right) {
        failures.push_back(absl::StrCat(
            "rank ", rank, " call ", call, ": ", status.ToString(), " got ",
            out.empty() ? -1 : out[0], " want ", want, " in ", shape.count));
      }
    }
  });
  actor.join();
  for (const std::string& failure : failures) ADD_FAILURE() << failure;
  return longest;
}

class FailoverLoopTest : public EtcdTest {
 protected:
  void SetUp() override {
    EtcdTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    leader_ = StartCandidate(etcd_.endpoint, kLease, 0, CandidateFlags());
    ASSERT_TRUE(WaitUntil([&] { return Leads(leader_.address); }, kTakeover));
    standby_ = StartCandidate(etcd_.endpoint, kLease, 0, CandidateFlags());
    both_ = absl::StrCat(leader_.address, ",", standby_.address);
  }

  // Flags both coordinators get besides the election's.
  virtual std::vector<std::string> CandidateFlags() const { return {}; }

  // LoopThrough a kill -9 of the leader; prints how long it took.
  void LoopThroughKill(
      const std::vector<std::unique_ptr<Communicator>>& ranks) {
    ASSERT_EQ(ranks.size(), static_cast<size_t>(kRanks));
    const absl::Duration longest = LoopThrough(
        ranks, [&] { EXPECT_TRUE(leader_.process->Signal(SIGKILL).ok()); });
    std::cout << "kill -9 of the leader to every rank's next completed "
                 "collective: "
              << longest << " (lease " << kLease << ")\n";
  }

  // Embedded ranks of both coordinators join `group` and loop through a
  // kill -9 of the leader in `shape`.
  void LoopEmbeddedThroughKill(const std::string& group,
                               const LoopShape& shape) {
    std::vector<std::unique_ptr<LocalWorker>> workers = StartEmbedded(both_);
    ASSERT_EQ(workers.size(), static_cast<size_t>(kRanks));
    std::vector<std::unique_ptr<Communicator>> ranks = JoinAll([&](int rank) {
      return Communicator::JoinEmbedded(workers[rank].get(), group, kRanks,
                                        rank, PatientJoin());
    });
    ASSERT_EQ(ranks.size(), static_cast<size_t>(kRanks));
    LoopThrough(
        ranks, [&] { EXPECT_TRUE(leader_.process->Signal(SIGKILL).ok()); },
        shape);
    ranks.clear();
    RunOnRanks(kRanks, [&](int i) { workers[i]->Shutdown(); });
  }

  Daemon leader_;
  Daemon standby_;
  std::string both_;
};

TEST_F(FailoverLoopTest, LeaderKilledMidDataPlane_EmbeddedRanksGetEveryResult) {
  // 32 MiB rings: the kill most likely lands while they run, after every
  // rank got its plan (the runs go on, their calls go to the new leader as
  // running calls, and their commits are taken there); or before the plan
  // (the calls go again). Every result must be right either way.
  LoopShape shape;
  shape.before = 2;
  shape.after = 2;
  shape.count = 4 << 20;
  shape.algorithm = Algorithm::kRing;
  shape.mid_call = true;
  LoopEmbeddedThroughKill("ring", shape);
}

// Join replies without the member list: the workers fetch their peers from
// the leader at their first data-plane call.
class UnlistedFailoverTest : public FailoverLoopTest {
 protected:
  std::vector<std::string> CandidateFlags() const override {
    return {"--member_list_max=0"};
  }
};

TEST_F(UnlistedFailoverTest,
       LeaderKilledBeforeFirstCall_PeersFetchedFromTheNewLeader) {
  // The leader dies before any call: the first call waits for the new
  // leader, which took the group over from etcd and answers the ranks'
  // questions for their peers.
  LoopShape shape;
  shape.before = 0;
  shape.after = 3;
  shape.count = 1 << 16;
  shape.algorithm = Algorithm::kRing;
  LoopEmbeddedThroughKill("unlisted", shape);
}

TEST_F(FailoverLoopTest, LeaderKilled_EmbeddedRanksGetEveryResult) {
  std::vector<std::unique_ptr<LocalWorker>> workers = StartEmbedded(both_);
  ASSERT_EQ(workers.size(), static_cast<size_t>(kRanks));
  std::vector<std::unique_ptr<Communicator>> ranks = JoinAll([&](int rank) {
    return Communicator::JoinEmbedded(workers[rank].get(), "loop", kRanks, rank,
                                      PatientJoin());
  });
  LoopThroughKill(ranks);
  ranks.clear();
  RunOnRanks(kRanks, [&](int i) { workers[i]->Shutdown(); });
}

// A store request to the coordinator at `address`: the answer, or its
// status.
absl::StatusOr<v1::StoreResponse> StoreAt(const std::string& address,
                                          v1::StoreOp op,
                                          const std::string& key,
                                          const std::string& value = "") {
  v1::StoreRequest request;
  request.set_op(op);
  request.add_keys(key);
  request.set_value(value);
  request.set_amount(1);
  v1::StoreResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  const grpc::Status status =
      NewCoordinatorStub(address)->Store(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

TEST_F(FailoverLoopTest, LeaderKilled_StoreKeysOnTheNewLeader) {
  ASSERT_TRUE(
      StoreAt(leader_.address, v1::STORE_OP_SET, "master", "10.0.0.1").ok());
  ASSERT_TRUE(StoreAt(leader_.address, v1::STORE_OP_ADD, "arrived").ok());
  ASSERT_TRUE(leader_.process->Signal(SIGKILL).ok());
  ASSERT_TRUE(WaitUntil([&] { return Leads(standby_.address); }, kTakeover));
  absl::StatusOr<v1::StoreResponse> got =
      StoreAt(standby_.address, v1::STORE_OP_GET, "master");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->value(), "10.0.0.1");
  absl::StatusOr<v1::StoreResponse> added =
      StoreAt(standby_.address, v1::STORE_OP_ADD, "arrived");
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_EQ(added->number(), 2);
}

// The value of `name` in a Prometheus text page; -1 when it is not there.
double MetricValue(const std::string& page, const std::string& name) {
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    if (!absl::ConsumePrefix(&line, name) || !absl::ConsumePrefix(&line, " ")) {
      continue;
    }
    double value = -1;
    if (absl::SimpleAtod(line, &value)) return value;
  }
  return -1;
}

TEST(EtcdWritesTest, StableMembership_NoEtcdWritePerCollective) {
  if (EtcdBinary().empty()) {
    GTEST_SKIP() << "etcd is not installed (scripts/setup.sh installs it)";
  }
  absl::StatusOr<Etcd> etcd = StartEtcd();
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  const int metrics = PickFreePort();
  Daemon leader = StartCandidate(etcd->endpoint, kLease, metrics);
  ASSERT_TRUE(WaitUntil([&] { return Leads(leader.address); }, kTakeover));
  std::vector<std::unique_ptr<LocalWorker>> workers =
      StartEmbedded(leader.address);
  ASSERT_EQ(workers.size(), static_cast<size_t>(kRanks));
  std::vector<std::unique_ptr<Communicator>> ranks = JoinAll([&](int rank) {
    return Communicator::JoinEmbedded(workers[rank].get(), "steady", kRanks,
                                      rank, PatientJoin());
  });
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kRanks));
  const std::string writes = "chorus_coordinator_etcd_writes";
  const double before = MetricValue(HttpGet(metrics, "/metrics"), writes);
  ASSERT_GT(before, 0);  // the lease, the key, 3 workers, the group
  constexpr int kCollectives = 1000;
  RunOnRanks(kRanks, [&](int rank) {
    for (int call = 0; call < kCollectives; ++call) {
      std::vector<int64_t> out;
      ASSERT_TRUE(ranks[rank]
                      ->AllReduce(std::vector<int64_t>{1}, &out, ReduceOp::kSum)
                      .ok());
    }
  });
  const double after = MetricValue(HttpGet(metrics, "/metrics"), writes);
  // Lease renewals are not writes; nothing per collective.
  EXPECT_EQ(after, before);
  std::cout << "etcd writes per " << kCollectives
            << " collectives with a stable membership: " << after - before
            << "\n";
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
  std::vector<std::unique_ptr<Communicator>> ranks = JoinAll([&](int rank) {
    return Communicator::JoinThroughDaemon(workers[rank].address, "loop",
                                           kRanks, rank, PatientJoin());
  });
  LoopThroughKill(ranks);
}

// One of three etcd members killed (the one the coordinators talk to
// first): nothing is noticed. The leader keeps leading, every collective
// returns its result, and a group formed afterwards is written to the
// two members left. The lease is the default 5 s: should the member be
// etcd's own raft leader, etcd elects another within its election timeout
// (1 s, up to twice that), during which it renews no lease and takes no
// write; a 2 s lease would lapse meanwhile.
TEST(EtcdQuorumTest, MemberKilled_NothingNoticed) {
  if (EtcdBinary().empty()) {
    GTEST_SKIP() << "etcd is not installed (scripts/setup.sh installs it)";
  }
  absl::StatusOr<std::vector<Etcd>> cluster = StartEtcdCluster(3);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string endpoints = EtcdEndpoints(*cluster);
  Daemon leader = StartCandidate(endpoints, absl::Seconds(5));
  ASSERT_TRUE(WaitUntil([&] { return Leads(leader.address); }, kTakeover));
  Daemon standby = StartCandidate(endpoints, absl::Seconds(5));
  std::vector<std::unique_ptr<LocalWorker>> workers =
      StartEmbedded(absl::StrCat(leader.address, ",", standby.address));
  ASSERT_EQ(workers.size(), static_cast<size_t>(kRanks));
  auto join = [&](const std::string& group) {
    return JoinAll([&](int rank) {
      return Communicator::JoinEmbedded(workers[rank].get(), group, kRanks,
                                        rank, PatientJoin());
    });
  };
  std::vector<std::unique_ptr<Communicator>> ranks = join("before");
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kRanks));
  LoopThrough(
      ranks, [&] { EXPECT_TRUE((*cluster)[0].process->Signal(SIGKILL).ok()); });
  std::vector<std::unique_ptr<Communicator>> after = join("after");
  ASSERT_EQ(after.size(), static_cast<size_t>(kRanks));
  EXPECT_TRUE(Leads(leader.address));
  EXPECT_FALSE(Leads(standby.address));
  after.clear();
  ranks.clear();
  RunOnRanks(kRanks, [&](int i) { workers[i]->Shutdown(); });
}

}  // namespace
}  // namespace chorus::test
