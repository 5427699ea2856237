// Multi-host tests: a coordinator and three workers, each on a host of its
// own (a network namespace with its own address, NamespaceNetwork), started
// as a user would start them on several machines: the workers with only
// --coordinator, --name and either their certificates (--tls_dir, from
// scripts/dev_certs.sh) or --insecure (and --port_file, which the test reads
// to know a worker is registered, and --local_socket, one per host since the
// hosts share a file system). The ranks are chorusctl processes on the
// workers' hosts, each driving its host's worker through the worker's local
// API on its Unix socket. Every scenario asserts what every rank printed or
// the status it ended with, and a time bound.
//
// Skipped, saying why, where network namespaces cannot be made (not root,
// no `ip`).

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/multihost/netns_network.h"
#include "tests/testing/certs.h"
#include "tests/testing/daemons.h"
#include "tests/testing/process.h"
#include "tests/testing/wait.h"

namespace chorus::test {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;

// Workers (ranks); host 0 runs the coordinator, host i the worker of rank
// i - 1.
constexpr int kWorkers = 3;
// The coordinator's lease in the scenarios that lose a worker.
constexpr absl::Duration kLease = absl::Seconds(2);
// Deadline of each rank's join and collective (chorusctl --timeout): far
// longer than any bound asserted, so a hang shows as a broken bound.
constexpr absl::Duration kCallTimeout = absl::Seconds(30);
// How long a set of rank processes may run before the test kills them.
constexpr absl::Duration kRanksTimeout = absl::Seconds(60);
// Added to every bound: a verdict crosses the coordinator, a worker and a
// chorusctl process that had to start, on a loaded two-core machine.
constexpr absl::Duration kSchedulingSlack = absl::Seconds(1);
// Bound on one healthy collective across the hosts, chorusctl's start,
// join and exit included.
constexpr absl::Duration kCollectiveBound = absl::Seconds(10);

void PrintTime(const std::string& what, absl::Duration took) {
  std::printf("[ time     ] %s: %s\n", what.c_str(),
              absl::FormatDuration(took).c_str());
  std::fflush(stdout);
}

// When `path` was last written; InfinitePast() when it cannot be read.
absl::Time LastWritten(const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0) return absl::InfinitePast();
  return absl::TimeFromTimespec(info.st_mtim);
}

// How one rank process ended.
struct RankResult {
  int exit_code = -1;
  std::string out;  // the output values, stripped
  std::string err;  // chorusctl's report or status, stripped
};

// One rank's part in a collective: the chorusctl command and its values.
struct RankCall {
  std::vector<std::string> flags;
  std::vector<std::string> values;
};

// The calls of one collective: rank r gets flags and values[r].
std::vector<RankCall> Calls(
    const std::vector<std::string>& flags,
    const std::vector<std::vector<std::string>>& values) {
  std::vector<RankCall> calls;
  for (const std::vector<std::string>& v : values) calls.push_back({flags, v});
  return calls;
}

class MultiHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (absl::Status supported = NamespaceNetwork::CheckSupported();
        !supported.ok()) {
      GTEST_SKIP() << supported.message();
    }
    absl::StatusOr<std::unique_ptr<NamespaceNetwork>> net =
        NamespaceNetwork::Create(kWorkers + 1);
    if (absl::IsFailedPrecondition(net.status())) {
      GTEST_SKIP() << net.status().message();
    }
    ASSERT_TRUE(net.ok()) << net.status();
    net_ = *std::move(net);
    workers_.resize(kWorkers);
    // Unix socket paths must stay short; the scratch directory may not.
    socket_dir_ = "/tmp/chorus-mh-XXXXXX";
    ASSERT_NE(mkdtemp(socket_dir_.data()), nullptr);
  }

  void TearDown() override {
    for (Daemon& worker : workers_) worker.process.reset();
    if (socket_dir_.empty()) return;
    std::error_code ignored;
    std::filesystem::remove_all(socket_dir_, ignored);
  }

  // Makes certificates for the coordinator, every worker and an admin, so
  // that every daemon started afterwards runs with mutual TLS.
  void UseTls() {
    absl::StatusOr<std::string> certs = MakeDevCerts(
        ScratchDir(), {"--workers=host-1,host-2,host-3", "--admins=admin"});
    ASSERT_TRUE(certs.ok()) << certs.status();
    certs_ = *std::move(certs);
  }

  // The flags that secure a daemon: its certificate directory with TLS,
  // else --insecure (the hosts' addresses are not loopback).
  std::vector<std::string> Security(const std::string& identity) const {
    if (certs_.empty()) return {"--insecure"};
    return {absl::StrCat("--tls_dir=", certs_, "/", identity)};
  }

  std::string Socket(int rank) const {
    return absl::StrCat(socket_dir_, "/", WorkerName(rank), ".sock");
  }

  // Starts the coordinator on host 0 with `flags` after --listen and
  // --port_file.
  void StartCoordinator(const std::vector<std::string>& flags) {
    const std::string port_file = NewScratchPath("coordinator", ".port");
    std::vector<std::string> command = net_->Wrap(0);
    command.push_back(CoordinatorBinary());
    command.push_back("--listen=0.0.0.0:0");
    command.push_back(absl::StrCat("--port_file=", port_file));
    for (const std::string& flag : Security("coordinator")) {
      command.push_back(flag);
    }
    command.insert(command.end(), flags.begin(), flags.end());
    absl::StatusOr<Daemon> started =
        StartDaemonCommand(command, port_file, "coordinator");
    ASSERT_TRUE(started.ok()) << started.status();
    coordinator_ = *std::move(started);
    coordinator_.address =
        absl::StrCat(net_->address(0), ":", coordinator_.port);
  }

  static std::string WorkerName(int rank) {
    return absl::StrCat("host-", rank + 1);
  }

  // Starts the worker of `rank` on its host with only --coordinator,
  // --name and --port_file, then `extra`. Returns once it is registered.
  absl::Status StartWorker(int rank,
                           const std::vector<std::string>& extra = {}) {
    const std::string port_file = NewScratchPath(WorkerName(rank), ".port");
    std::vector<std::string> command = net_->Wrap(rank + 1);
    command.push_back(WorkerBinary());
    command.push_back(absl::StrCat("--coordinator=", coordinator_.address));
    command.push_back(absl::StrCat("--name=", WorkerName(rank)));
    command.push_back(absl::StrCat("--port_file=", port_file));
    command.push_back(absl::StrCat("--local_socket=", Socket(rank)));
    for (const std::string& flag : Security("worker-" + WorkerName(rank))) {
      command.push_back(flag);
    }
    command.insert(command.end(), extra.begin(), extra.end());
    absl::StatusOr<Daemon> started =
        StartDaemonCommand(command, port_file, WorkerName(rank));
    if (!started.ok()) return started.status();
    workers_[rank] = *std::move(started);
    return absl::OkStatus();
  }

  void StartAllWorkers(const std::vector<std::string>& extra = {}) {
    for (int rank = 0; rank < kWorkers; ++rank) {
      absl::Status started = StartWorker(rank, extra);
      ASSERT_TRUE(started.ok()) << started;
    }
  }

  // How a chorusctl rank reaches the cluster.
  enum class Via {
    // Through the local API of the worker daemon on its host.
    kWorkerDaemon,
    // As a worker of its own (no --worker), with only --coordinator and
    // the security flags.
    kOwnWorker,
  };

  // Starts `command` (chorusctl's collective command) as every rank of
  // `group`, rank r on worker r's host, each call with deadline `timeout`.
  std::vector<std::unique_ptr<Subprocess>> StartRanks(
      const std::string& group, const std::string& command,
      const std::vector<RankCall>& calls, absl::Duration timeout = kCallTimeout,
      Via via = Via::kWorkerDaemon) {
    std::vector<std::unique_ptr<Subprocess>> processes;
    for (int rank = 0; rank < static_cast<int>(calls.size()); ++rank) {
      std::vector<std::string> command_line = net_->Wrap(rank + 1);
      SubprocessOptions options;
      options.binary = command_line[0];
      options.args.assign(command_line.begin() + 1, command_line.end());
      options.args.push_back(ChorusctlBinary());
      if (via == Via::kWorkerDaemon) {
        options.args.push_back(absl::StrCat("--worker=unix:", Socket(rank)));
      } else {
        options.args.push_back(
            absl::StrCat("--coordinator=", coordinator_.address));
        for (const std::string& flag : Security("worker-" + WorkerName(rank))) {
          options.args.push_back(flag);
        }
      }
      options.args.push_back(absl::StrCat("--group=", group));
      options.args.push_back(absl::StrCat("--world=", calls.size()));
      options.args.push_back(absl::StrCat("--rank=", rank));
      options.args.push_back(
          absl::StrCat("--timeout=", absl::ToInt64Milliseconds(timeout), "ms"));
      options.args.insert(options.args.end(), calls[rank].flags.begin(),
                          calls[rank].flags.end());
      options.args.push_back(command);
      if (!calls[rank].values.empty()) {
        options.args.push_back("--");
        options.args.insert(options.args.end(), calls[rank].values.begin(),
                            calls[rank].values.end());
      }
      const std::string stem = absl::StrCat("rank-", rank, "-", group);
      options.stdout_path = NewScratchPath(stem, ".out");
      options.stderr_path = NewScratchPath(stem, ".err");
      absl::StatusOr<std::unique_ptr<Subprocess>> process =
          Subprocess::Start(options);
      EXPECT_TRUE(process.ok()) << process.status();
      if (process.ok()) processes.push_back(*std::move(process));
    }
    return processes;
  }

  // Waits for the rank processes of `group` and returns how each ended.
  std::vector<RankResult> WaitForRanks(
      const std::string& group,
      std::vector<std::unique_ptr<Subprocess>>& processes) {
    std::vector<RankResult> results(processes.size());
    const absl::Time give_up = absl::Now() + kRanksTimeout;
    for (size_t rank = 0; rank < processes.size(); ++rank) {
      absl::StatusOr<int> code =
          processes[rank]->WaitForExit(give_up - absl::Now());
      EXPECT_TRUE(code.ok())
          << "rank " << rank << " of " << group << ": " << code.status();
      if (!code.ok()) continue;
      results[rank].exit_code = *code;
      results[rank].out =
          std::string(absl::StripAsciiWhitespace(processes[rank]->ReadLog()));
      results[rank].err = std::string(
          absl::StripAsciiWhitespace(processes[rank]->ReadStderr()));
    }
    return results;
  }

  // StartRanks, then WaitForRanks. Sets *took to the time until the last
  // rank ended.
  std::vector<RankResult> RunRanks(const std::string& group,
                                   const std::string& command,
                                   const std::vector<RankCall>& calls,
                                   absl::Duration* took,
                                   absl::Duration timeout = kCallTimeout,
                                   Via via = Via::kWorkerDaemon) {
    const absl::Time start = absl::Now();
    std::vector<std::unique_ptr<Subprocess>> processes =
        StartRanks(group, command, calls, timeout, via);
    std::vector<RankResult> results = WaitForRanks(group, processes);
    *took = absl::Now() - start;
    return results;
  }

  // Runs `command` on every rank and expects each to succeed under `plan`
  // printing want[rank] (nullptr: anything) within kCollectiveBound.
  void ExpectCollective(const std::string& group, const std::string& command,
                        const std::vector<RankCall>& calls,
                        const std::string& plan,
                        const std::vector<const char*>& want) {
    SCOPED_TRACE(absl::StrCat(command, " (", plan, ") in group ", group));
    absl::Duration took;
    const std::vector<RankResult> results =
        RunRanks(group, command, calls, &took);
    for (size_t rank = 0; rank < results.size(); ++rank) {
      EXPECT_EQ(results[rank].exit_code, 0)
          << "rank " << rank << ": " << results[rank].err;
      EXPECT_THAT(results[rank].err, HasSubstr(absl::StrCat(" ran ", plan)))
          << "rank " << rank;
      if (want[rank] != nullptr) {
        EXPECT_EQ(results[rank].out, want[rank]) << "rank " << rank;
      }
    }
    EXPECT_LE(took, kCollectiveBound + kSchedulingSlack);
    PrintTime(absl::StrCat(command, " ", plan, " across ", kWorkers, " hosts"),
              took);
  }

  // A ring all-reduce of u32 across the three hosts: every rank prints
  // "6 60" within kCollectiveBound.
  void ExpectRingAllReduce(const std::string& group) {
    ExpectCollective(group, "allreduce",
                     Calls({"--algorithm=ring", "--dtype=u32"},
                           {{"1", "10"}, {"2", "20"}, {"3", "30"}}),
                     "ring", {"6 60", "6 60", "6 60"});
  }

  // Runs a ring across chorusctl's own workers (no --worker; only
  // --coordinator and the security flags) on the three hosts as `group`:
  // every rank prints the sum, says it ran the ring and exits 0 within
  // kCollectiveBound.
  void ExpectOwnWorkersRing(const std::string& group) {
    SCOPED_TRACE(group);
    absl::Duration took;
    const std::vector<RankResult> results =
        RunRanks(group, "allreduce",
                 Calls({"--algorithm=ring", "--dtype=u32"},
                       {{"1", "10"}, {"2", "20"}, {"3", "30"}}),
                 &took, kCallTimeout, Via::kOwnWorker);
    for (size_t rank = 0; rank < results.size(); ++rank) {
      EXPECT_EQ(results[rank].exit_code, 0)
          << "rank " << rank << ": " << results[rank].err;
      EXPECT_EQ(results[rank].out, "6 60") << "rank " << rank;
      EXPECT_THAT(results[rank].err, HasSubstr(" ran ring")) << "rank " << rank;
    }
    EXPECT_LE(took, kCollectiveBound + kSchedulingSlack);
    PrintTime(absl::StrCat("ring across ", kWorkers,
                           " hosts, chorusctl's own workers (", group, ")"),
              took);
  }

  // Starts the C++ elastic example as `rank_arg` ("0".. or "new") of
  // `group` (3 ranks, minimum 2, 400 steps of 20 ms) on worker `host`'s
  // host, through its worker daemon; nullptr when it could not start.
  std::unique_ptr<Subprocess> StartElasticRank(int host,
                                               const std::string& group,
                                               const std::string& rank_arg) {
    std::vector<std::string> command_line = net_->Wrap(host + 1);
    SubprocessOptions options;
    options.binary = command_line[0];
    options.args.assign(command_line.begin() + 1, command_line.end());
    options.args.insert(
        options.args.end(),
        {CHORUS_ELASTIC_EXAMPLE_BIN, absl::StrCat("unix:", Socket(host)), group,
         absl::StrCat(kWorkers), rank_arg, "2", "400", "20"});
    const std::string stem = absl::StrCat("elastic-", host, "-", rank_arg);
    options.stdout_path = NewScratchPath(stem, ".out");
    options.stderr_path = NewScratchPath(stem, ".err");
    absl::StatusOr<std::unique_ptr<Subprocess>> process =
        Subprocess::Start(options);
    EXPECT_TRUE(process.ok()) << process.status();
    return process.ok() ? *std::move(process) : nullptr;
  }

  // Lists the workers (chorusctl workers, run on the coordinator's host).
  std::string ListWorkers() { return Admin("workers"); }

  // Runs chorusctl's admin command `what` (workers, groups) on the
  // coordinator's host; returns what it printed, "" when it failed.
  std::string Admin(const std::string& what) {
    std::vector<std::string> command = net_->Wrap(0);
    command.push_back(ChorusctlBinary());
    command.push_back(absl::StrCat("--coordinator=", coordinator_.address));
    command.push_back("--timeout=5s");
    if (!certs_.empty()) {
      command.push_back(absl::StrCat("--tls_dir=", certs_, "/admin-admin"));
    }
    command.push_back(what);
    absl::StatusOr<CommandResult> result = RunCommand(
        command[0], {command.begin() + 1, command.end()}, absl::Seconds(20));
    if (!result.ok() || result->exit_code != 0) return "";
    return result->out;
  }

  // Waits until every rank of `group` joined (chorusctl groups lists it,
  // formed), then a little longer: its collective is under way.
  void WaitForRingUnderWay(const std::string& group) {
    ASSERT_TRUE(WaitUntil(
        [&] {
          const std::string groups = Admin("groups");
          return absl::StrContains(groups, group) &&
                 !absl::StrContains(groups, "forming");
        },
        absl::Seconds(20), absl::Milliseconds(50)))
        << Admin("groups");
    absl::SleepFor(absl::Milliseconds(300));
  }

  // Runs `tc` with `args` on host `host` to shape its link; skips the test
  // where the kernel lacks the qdisc (or there is no `tc`).
  void ShapeLink(int host, const std::vector<std::string>& args) {
    absl::StatusOr<std::string> shaped = net_->Tc(host, args);
    if (absl::IsFailedPrecondition(shaped.status()) ||
        absl::StrContains(shaped.status().message(), "qdisc kind is unknown")) {
      GTEST_SKIP() << "cannot shape a link here: " << shaped.status().message();
    }
    ASSERT_TRUE(shaped.ok()) << shaped.status();
  }

  // Declared first: destroyed after every process running in it.
  std::unique_ptr<NamespaceNetwork> net_;
  Daemon coordinator_;
  // workers_[rank] runs on host rank + 1.
  std::vector<Daemon> workers_;
  std::string socket_dir_;
  // The certificates' directory when the scenario runs with TLS.
  std::string certs_;
};

// The ring all-reduce calls of u32 vectors of `count` elements: rank r's
// elements are all r + 1, so every element of the result is 6.
std::vector<RankCall> LargeRingCalls(int count) {
  std::vector<std::vector<std::string>> values(kWorkers);
  for (int rank = 0; rank < kWorkers; ++rank) {
    values[rank].assign(count, absl::StrCat(rank + 1));
  }
  return Calls({"--algorithm=ring", "--dtype=u32"}, values);
}

// What every rank of LargeRingCalls(count) prints.
std::string LargeRingResult(int count) {
  return absl::StrJoin(std::vector<std::string>(count, "6"), " ");
}

// The deployment the README describes: certificates from dev_certs.sh and
// otherwise default flags.
TEST_F(MultiHostTest, MutualTls_EveryCollectiveAcrossThreeHosts) {
  ASSERT_NO_FATAL_FAILURE(UseTls());
  ASSERT_NO_FATAL_FAILURE(StartCoordinator({}));
  const absl::Time start = absl::Now();
  ASSERT_NO_FATAL_FAILURE(StartAllWorkers());
  PrintTime("3 workers registered", absl::Now() - start);
  const std::string listed = ListWorkers();
  for (int rank = 0; rank < kWorkers; ++rank) {
    EXPECT_THAT(listed, HasSubstr(WorkerName(rank))) << listed;
  }

  int group = 0;
  for (const std::string plan : {"ring", "inline"}) {
    const std::vector<std::string> flags = {absl::StrCat("--algorithm=", plan),
                                            "--dtype=u32"};
    auto next = [&] { return absl::StrCat(plan, "-", group++); };
    ExpectCollective(next(), "allreduce",
                     Calls(flags, {{"1", "10"}, {"2", "20"}, {"3", "30"}}),
                     plan, {"6 60", "6 60", "6 60"});
    ExpectCollective(next(), "allgather", Calls(flags, {{"0"}, {"1"}, {"2"}}),
                     plan, {"0 1 2", "0 1 2", "0 1 2"});
    {
      std::vector<RankCall> calls = Calls(flags, {{"7", "8", "9"}, {}, {}});
      calls[1].flags.push_back("--count=3");
      calls[2].flags.push_back("--count=3");
      ExpectCollective(next(), "broadcast", calls, plan,
                       {"7 8 9", "7 8 9", "7 8 9"});
    }
    ExpectCollective(next(), "reduce",
                     Calls(flags, {{"1", "10"}, {"2", "20"}, {"3", "30"}}),
                     plan, {"6 60", nullptr, nullptr});
    ExpectCollective(
        next(), "reducescatter",
        Calls(flags, {{"1", "2", "3"}, {"2", "4", "6"}, {"3", "6", "9"}}), plan,
        {"6", "12", "18"});
    ExpectCollective(next(), "gather", Calls(flags, {{"10"}, {"11"}, {"12"}}),
                     plan, {"10 11 12", nullptr, nullptr});
    {
      std::vector<RankCall> calls = Calls(flags, {{"5", "6", "7"}, {}, {}});
      calls[1].flags.push_back("--count=1");
      calls[2].flags.push_back("--count=1");
      ExpectCollective(next(), "scatter", calls, plan, {"5", "6", "7"});
    }
    ExpectCollective(
        next(), "alltoall",
        Calls(flags, {{"0", "1", "2"}, {"10", "11", "12"}, {"20", "21", "22"}}),
        plan, {"0 10 20", "1 11 21", "2 12 22"});
  }
  ExpectCollective("barrier", "barrier", Calls({}, {{}, {}, {}}), "inline",
                   {"", "", ""});
  // The planner's own choice for a small all-reduce across hosts.
  ExpectCollective("auto", "allreduce",
                   Calls({"--dtype=f32"}, {{"1.5"}, {"2"}, {"3"}}), "inline",
                   {"6.5", "6.5", "6.5"});
  // And for a large one: the hosts share the host name but not a machine
  // and network namespace, so it plans no same_host (shared memory).
  constexpr int kCount = 100000;
  std::vector<RankCall> calls = LargeRingCalls(kCount);
  for (RankCall& call : calls) call.flags = {"--dtype=u32"};
  absl::Duration took;
  const std::vector<RankResult> results =
      RunRanks("auto-large", "allreduce", calls, &took);
  for (size_t rank = 0; rank < results.size(); ++rank) {
    EXPECT_EQ(results[rank].exit_code, 0)
        << "rank " << rank << ": " << results[rank].err;
    EXPECT_TRUE(results[rank].out == LargeRingResult(kCount))
        << "rank " << rank << " printed " << results[rank].out.size()
        << " characters";
    EXPECT_THAT(results[rank].err, HasSubstr(" ran ")) << "rank " << rank;
    EXPECT_THAT(results[rank].err, Not(HasSubstr("same_host")))
        << "rank " << rank;
  }
  EXPECT_LE(took, kCollectiveBound + kSchedulingSlack);
  PrintTime("large allreduce, planner's choice, across 3 hosts", took);
}

TEST_F(MultiHostTest, WorkerRestartedWithSameFlags_RingAtOnce) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator(
      {absl::StrCat("--lease_timeout=", absl::ToInt64Seconds(kLease), "s")}));
  // Fixed ports, as a deployment has them: the restarted worker is at the
  // same address, so its peers' connections to the old process are the
  // ones they would reuse.
  const std::vector<std::string> ports = {"--listen=0.0.0.0:7100",
                                          "--data_port=7101"};
  ASSERT_NO_FATAL_FAILURE(StartAllWorkers(ports));
  ExpectRingAllReduce("restart-0");

  for (int round = 1; round <= 2; ++round) {
    SCOPED_TRACE(absl::StrCat("restart ", round));
    const int victim = 1;  // rank 0 sends to it in the ring
    ASSERT_TRUE(workers_[victim].process->Signal(SIGTERM).ok());
    absl::StatusOr<int> code =
        workers_[victim].process->WaitForExit(absl::Seconds(30));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0);
    const absl::Time restarted_at = absl::Now();
    absl::Status started = StartWorker(victim, ports);
    ASSERT_TRUE(started.ok()) << started;
    PrintTime("SIGTERM'd worker registered again", absl::Now() - restarted_at);
    ExpectRingAllReduce(absl::StrCat("restart-", round));
  }
}

TEST_F(MultiHostTest, PartitionHealed_RingAtOnce) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator(
      {absl::StrCat("--lease_timeout=", absl::ToInt64Seconds(kLease), "s")}));
  ASSERT_NO_FATAL_FAILURE(StartAllWorkers());
  ExpectRingAllReduce("partition-0");

  const int victim = 2;
  const int host = victim + 1;
  ASSERT_TRUE(net_->SetConnected(host, false).ok());
  const absl::Time cut_at = absl::Now();
  // The coordinator evicts the unreachable worker after its lease.
  ASSERT_TRUE(WaitUntil(
      [&] {
        const std::string listed = ListWorkers();
        return !listed.empty() &&
               !absl::StrContains(listed, WorkerName(victim));
      },
      kLease + absl::Seconds(10), absl::Milliseconds(100)))
      << "the partitioned worker was never evicted";
  PrintTime("partition -> evicted", absl::Now() - cut_at);
  // A partition longer than the lease, so retransmissions back off.
  ASSERT_TRUE(
      WaitUntil([&] { return absl::Now() - cut_at > 2 * kLease; }, 3 * kLease));

  ASSERT_TRUE(net_->SetConnected(host, true).ok());
  const absl::Time healed_at = absl::Now();
  ASSERT_TRUE(WaitUntil(
      [&] { return absl::StrContains(ListWorkers(), WorkerName(victim)); },
      absl::Seconds(20), absl::Milliseconds(50)))
      << "the worker did not register again after the partition healed";
  PrintTime("heal -> registered again", absl::Now() - healed_at);

  absl::Duration took;
  const std::vector<RankResult> results =
      RunRanks("partition-1", "allreduce",
               Calls({"--algorithm=ring", "--dtype=u32"},
                     {{"1", "10"}, {"2", "20"}, {"3", "30"}}),
               &took);
  for (size_t rank = 0; rank < results.size(); ++rank) {
    EXPECT_EQ(results[rank].exit_code, 0)
        << "rank " << rank << ": " << results[rank].err;
    EXPECT_EQ(results[rank].out, "6 60") << "rank " << rank;
  }
  PrintTime("first ring after the heal", took);
  // The worker's connection to the coordinator carried a heartbeat into the
  // partition; a fresh one replaces it rather than waiting out TCP's
  // retransmission backoff, so the whole way back stays within the lease.
  const absl::Duration heal_to_ring = absl::Now() - healed_at;
  EXPECT_LE(heal_to_ring, kLease + absl::Seconds(1) + kSchedulingSlack);
  PrintTime("heal -> first ring done", heal_to_ring);
}

// The coordinator stopped (SIGSTOP) for longer than the lease: every rank
// that calls meanwhile ends at its deadline with a status naming the
// coordinator; once it runs again it evicts no one (the pause is its own,
// not the workers') and a ring runs at once.
TEST_F(MultiHostTest, CoordinatorPaused_RanksNameItAndNoWorkerEvicted) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator(
      {absl::StrCat("--lease_timeout=", absl::ToInt64Seconds(kLease), "s")}));
  ASSERT_NO_FATAL_FAILURE(StartAllWorkers());
  ExpectRingAllReduce("pause-0");

  ASSERT_TRUE(coordinator_.process->Signal(SIGSTOP).ok());
  const absl::Time stopped_at = absl::Now();
  const absl::Duration timeout = absl::Seconds(3);
  absl::Duration took;
  const std::vector<RankResult> results = RunRanks(
      "pause-1", "allreduce",
      Calls({"--algorithm=ring", "--dtype=u32"}, {{"1"}, {"2"}, {"3"}}), &took,
      timeout);
  for (size_t rank = 0; rank < results.size(); ++rank) {
    EXPECT_NE(results[rank].exit_code, 0) << "rank " << rank;
    EXPECT_THAT(results[rank].err, HasSubstr("DEADLINE_EXCEEDED"))
        << "rank " << rank;
    EXPECT_THAT(
        results[rank].err,
        HasSubstr(absl::StrCat("the coordinator at ", coordinator_.address,
                               " did not answer the join of group "
                               "pause-1 as rank ",
                               rank)))
        << "rank " << rank;
  }
  EXPECT_LE(took, timeout + kSchedulingSlack);
  PrintTime("ranks' calls to the stopped coordinator ended", took);
  // Stopped for more than two leases in all.
  ASSERT_TRUE(WaitUntil([&] { return absl::Now() - stopped_at > 2 * kLease; },
                        3 * kLease));

  ASSERT_TRUE(coordinator_.process->Signal(SIGCONT).ok());
  const absl::Time resumed_at = absl::Now();
  ExpectRingAllReduce("pause-2");
  PrintTime("SIGCONT -> ring done", absl::Now() - resumed_at);
  // The lease timer notices the pause when it next runs.
  EXPECT_TRUE(WaitUntil(
      [&] {
        return absl::StrContains(coordinator_.process->ReadLog(),
                                 "workers get a fresh lease");
      },
      kLease + absl::Seconds(5), absl::Milliseconds(50)));
  EXPECT_THAT(coordinator_.process->ReadLog(),
              Not(HasSubstr("evicted worker")));
  const std::string listed = ListWorkers();
  for (int rank = 0; rank < kWorkers; ++rank) {
    EXPECT_THAT(listed, HasSubstr(WorkerName(rank))) << listed;
  }
}

// The coordinator killed with SIGKILL and started again on the same port:
// the workers register again on their own and a ring runs at once.
TEST_F(MultiHostTest, CoordinatorKilledAndRestarted_WorkersBackRingAtOnce) {
  const std::vector<std::string> flags = {
      "--listen=0.0.0.0:7000",
      absl::StrCat("--lease_timeout=", absl::ToInt64Seconds(kLease), "s")};
  ASSERT_NO_FATAL_FAILURE(StartCoordinator(flags));
  ASSERT_NO_FATAL_FAILURE(StartAllWorkers());
  ExpectRingAllReduce("restart-0");

  ASSERT_TRUE(coordinator_.process->Kill().ok());
  ASSERT_TRUE(coordinator_.process->WaitForExit(absl::Seconds(10)).ok());
  const absl::Time killed_at = absl::Now();
  ASSERT_NO_FATAL_FAILURE(StartCoordinator(flags));
  ASSERT_TRUE(WaitUntil(
      [&] {
        const std::string listed = ListWorkers();
        for (int rank = 0; rank < kWorkers; ++rank) {
          if (!absl::StrContains(listed, WorkerName(rank))) return false;
        }
        return true;
      },
      kLease + absl::Seconds(10), absl::Milliseconds(50)))
      << "the workers did not register with the new coordinator";
  const absl::Duration back = absl::Now() - killed_at;
  PrintTime("coordinator kill -9 + restart -> every worker registered", back);
  EXPECT_LE(back, kLease + kSchedulingSlack);
  ExpectRingAllReduce("restart-1");
}

// A worker killed with SIGKILL while a ring runs: every surviving rank ends
// with a status naming that worker within the lease and a second, and no
// rank succeeds. A link is slowed (tbf) so the ring is still running when
// the kill comes.
TEST_F(MultiHostTest, WorkerKilledMidRing_SurvivorsNameItWithinLease) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator(
      {absl::StrCat("--lease_timeout=", absl::ToInt64Seconds(kLease), "s")}));
  ASSERT_NO_FATAL_FAILURE(StartAllWorkers());
  const int victim = 1;
  // The link of the victim's ring predecessor (rank 0, on host 1) at
  // 2 Mbit/s: the ring of 800 KB per rank below takes seconds. (Shaping the
  // victim's own link would delay the end of its connections: the kernel
  // sends what a killed process left in its socket buffers before the FIN.)
  ShapeLink(victim,
            {"qdisc", "replace", "dev", NamespaceNetwork::kInterface, "root",
             "tbf", "rate", "2mbit", "burst", "32kb", "latency", "100ms"});
  if (IsSkipped() || HasFatalFailure()) return;

  constexpr int kCount = 200000;
  std::vector<std::unique_ptr<Subprocess>> ranks =
      StartRanks("kill-0", "allreduce", LargeRingCalls(kCount));
  ASSERT_NO_FATAL_FAILURE(WaitForRingUnderWay("kill-0"));
  ASSERT_TRUE(workers_[victim].process->Kill().ok());
  const absl::Time killed_at = absl::Now();

  // The bound is on when each survivor printed its status.
  std::vector<RankResult> results(ranks.size());
  absl::Duration took;
  for (int rank = 0; rank < kWorkers; ++rank) {
    absl::StatusOr<int> code = ranks[rank]->WaitForExit(kRanksTimeout);
    ASSERT_TRUE(code.ok()) << "rank " << rank << ": " << code.status();
    results[rank].exit_code = *code;
    results[rank].err = ranks[rank]->ReadStderr();
    PrintTime(absl::StrCat("kill -9 -> rank ", rank, " exited"),
              absl::Now() - killed_at);
    if (rank == victim) {
      std::printf(
          "[ status   ] rank %d (its worker killed): %s\n", rank,
          std::string(absl::StripAsciiWhitespace(results[rank].err)).c_str());
    }
    if (rank != victim) {
      const absl::Duration printed =
          LastWritten(ranks[rank]->stderr_path()) - killed_at;
      took = std::max(took, printed);
      PrintTime(absl::StrCat("kill -9 -> rank ", rank, " printed its status"),
                printed);
      std::printf(
          "[ status   ] rank %d: %s\n", rank,
          std::string(absl::StripAsciiWhitespace(results[rank].err)).c_str());
    }
  }
  const absl::Duration exited = absl::Now() - killed_at;
  PrintTime("kill -9 -> every rank process exited", exited);
  // chorusctl leaves once it printed its status (it used to linger until
  // its call's deadline in gRPC's shutdown now and then).
  EXPECT_LE(exited, kLease + absl::Seconds(1) + kSchedulingSlack);
  for (int rank = 0; rank < kWorkers; ++rank) {
    EXPECT_NE(results[rank].exit_code, 0) << "rank " << rank;
    if (rank == victim) continue;
    EXPECT_THAT(results[rank].err,
                AnyOf(HasSubstr("ABORTED"), HasSubstr("UNAVAILABLE")))
        << "rank " << rank;
    EXPECT_THAT(results[rank].err, HasSubstr(WorkerName(victim)))
        << "rank " << rank << ": " << results[rank].err;
  }
  EXPECT_LE(took, kLease + absl::Seconds(1) + kSchedulingSlack);
  PrintTime("kill -9 mid-ring -> every survivor ended", took);
}

// A host cut off (its link down, nothing tells either side) while a ring
// runs: the surviving ranks end within the lease and a second with the
// coordinator's verdict naming the lost worker; the cut-off rank ends by
// its deadline saying whom it waited for and that the coordinator did not
// answer. A link is slowed so the ring is under way at the cut.
TEST_F(MultiHostTest, PartitionMidRing_EveryRankNamesTheParty) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator(
      {absl::StrCat("--lease_timeout=", absl::ToInt64Seconds(kLease), "s")}));
  ASSERT_NO_FATAL_FAILURE(StartAllWorkers());
  const int victim = 2;
  ShapeLink(1, {"qdisc", "replace", "dev", NamespaceNetwork::kInterface, "root",
                "tbf", "rate", "2mbit", "burst", "32kb", "latency", "100ms"});
  if (IsSkipped() || HasFatalFailure()) return;

  const absl::Duration timeout = absl::Seconds(8);
  std::vector<std::unique_ptr<Subprocess>> ranks =
      StartRanks("cut-0", "allreduce", LargeRingCalls(200000), timeout);
  ASSERT_NO_FATAL_FAILURE(WaitForRingUnderWay("cut-0"));
  ASSERT_TRUE(net_->SetConnected(victim + 1, false).ok());
  const absl::Time cut_at = absl::Now();

  std::vector<RankResult> results(ranks.size());
  for (int rank = 0; rank < kWorkers; ++rank) {
    absl::StatusOr<int> code = ranks[rank]->WaitForExit(kRanksTimeout);
    ASSERT_TRUE(code.ok()) << "rank " << rank << ": " << code.status();
    results[rank].exit_code = *code;
    results[rank].err =
        std::string(absl::StripAsciiWhitespace(ranks[rank]->ReadStderr()));
    // The bounds are on when each rank printed its status.
    const absl::Duration ended =
        LastWritten(ranks[rank]->stderr_path()) - cut_at;
    PrintTime(absl::StrCat("cut -> rank ", rank, " printed its status"), ended);
    std::printf("[ status   ] rank %d: %s\n", rank, results[rank].err.c_str());
    EXPECT_NE(results[rank].exit_code, 0) << "rank " << rank;
    if (rank == victim) {
      // Its deadline comes first (its silent peer and the coordinator that
      // did not answer its report), or its worker's heartbeats fail first
      // (the connection to the coordinator is given up after 2 s and the
      // new one finds no route).
      EXPECT_THAT(
          results[rank].err,
          HasSubstr(absl::StrCat("the coordinator at ", coordinator_.address)));
      if (absl::StrContains(results[rank].err, "DEADLINE_EXCEEDED")) {
        EXPECT_THAT(results[rank].err, HasSubstr("sent no data"));
        EXPECT_THAT(results[rank].err, HasSubstr("did not answer"));
      } else {
        EXPECT_THAT(results[rank].err,
                    HasSubstr("UNAVAILABLE: the coordinator at"));
        EXPECT_THAT(results[rank].err, HasSubstr("is unreachable"));
      }
      EXPECT_LE(ended, timeout + kSchedulingSlack);
    } else {
      EXPECT_THAT(results[rank].err, HasSubstr("ABORTED"));
      EXPECT_THAT(results[rank].err,
                  HasSubstr(absl::StrCat("\"", WorkerName(victim), "\"")));
      EXPECT_THAT(results[rank].err, HasSubstr("no heartbeat"));
      EXPECT_LE(ended, kLease + absl::Seconds(1) + kSchedulingSlack);
    }
  }
  ASSERT_TRUE(net_->SetConnected(victim + 1, true).ok());
}

// chorusctl without --worker is a worker of its own: ranks on three hosts
// with only --coordinator and --insecure run a ring across them (the data
// plane between the chorusctl processes themselves). One told to listen on
// loopback while the coordinator is on another host is refused at start.
TEST_F(MultiHostTest, ChorusctlOwnWorkers_RingAcrossHosts) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator({}));
  ExpectOwnWorkersRing("own-0");

  absl::Duration took;
  std::vector<RankResult> results =
      RunRanks("own-1", "allreduce",
               Calls({"--listen=127.0.0.1:0", "--dtype=u32"}, {{"1"}}), &took,
               kCallTimeout, Via::kOwnWorker);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_NE(results[0].exit_code, 0);
  EXPECT_THAT(results[0].err,
              HasSubstr("INVALID_ARGUMENT: this worker listens on "
                        "127.0.0.1:0, a loopback address, but the "
                        "coordinator at " +
                        coordinator_.address + " is on another host"));
  EXPECT_LE(took, kCollectiveBound + kSchedulingSlack);
}

// The same with mutual TLS, each chorusctl with its host's worker
// certificate: every rank exits 0 after printing the sum. (When a rank's
// data connections closed, the TLS alert written on a socket already shut
// down used to end chorusctl with SIGPIPE, exit code 141, after it had
// printed its result; several rounds, as it struck some ranks only.)
TEST_F(MultiHostTest, MutualTls_ChorusctlOwnWorkers_RingAcrossHosts) {
  ASSERT_NO_FATAL_FAILURE(UseTls());
  ASSERT_NO_FATAL_FAILURE(StartCoordinator({}));
  for (int round = 0; round < 3; ++round) {
    ExpectOwnWorkersRing(absl::StrCat("own-tls-", round));
  }
}

// The hosts share a file system, as containers and test rigs do: a worker
// on a second host given the socket path the first host's worker serves
// (the default path is the same on every host) is refused at start, saying
// that another host may hold it and what to give instead.
TEST_F(MultiHostTest, SharedFileSystem_SecondHostSameSocket_RefusedSayingSo) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator({}));
  ASSERT_TRUE(StartWorker(0).ok());
  const absl::Status refused =
      StartWorker(1, {absl::StrCat("--local_socket=", Socket(0))});
  EXPECT_THAT(refused.message(),
              HasSubstr(absl::StrCat(
                  "another process serves the local socket ", Socket(0),
                  ": a worker already running on this host, or on another "
                  "host or container that shares this file system")))
      << refused;
  EXPECT_THAT(ListWorkers(), Not(HasSubstr(WorkerName(1))));
}

// An elastic group across the hosts (the C++ example's ranks, through their
// hosts' worker daemons): host 3 is lost (its worker and its rank killed
// with SIGKILL) mid-training; the two survivors are told within the lease
// and a second and go on as a group of two; host 3 comes back with a new
// worker and a newcomer rank, which the survivors admit at their next sync
// and hand their state; all three end with the same total.
TEST_F(MultiHostTest, ElasticHostLost_SurvivorsGoOnNewcomerAdmitted) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator(
      {absl::StrCat("--lease_timeout=", absl::ToInt64Seconds(kLease), "s")}));
  ASSERT_NO_FATAL_FAILURE(StartAllWorkers());
  const std::string group = "elastic-hosts";
  std::vector<std::unique_ptr<Subprocess>> ranks;
  for (int rank = 0; rank < kWorkers; ++rank) {
    ranks.push_back(StartElasticRank(rank, group, absl::StrCat(rank)));
    ASSERT_NE(ranks.back(), nullptr);
  }
  auto printed = [](Subprocess& rank, const std::string& text) {
    return WaitUntil([&] { return absl::StrContains(rank.ReadLog(), text); },
                     kRanksTimeout, absl::Milliseconds(10));
  };
  ASSERT_TRUE(printed(*ranks[0], "step 10 ")) << ranks[0]->ReadLog();

  const int victim = kWorkers - 1;
  ASSERT_TRUE(workers_[victim].process->Kill().ok());
  ASSERT_TRUE(ranks[victim]->Kill().ok());
  const absl::Time killed_at = absl::Now();
  for (int rank = 0; rank < victim; ++rank) {
    ASSERT_TRUE(printed(*ranks[rank], "membership changed"))
        << ranks[rank]->ReadLog();
    const absl::Duration told = absl::Now() - killed_at;
    PrintTime(absl::StrCat("host lost -> rank ", rank, " told"), told);
    EXPECT_LE(told, kLease + absl::Seconds(1) + kSchedulingSlack);
  }

  ASSERT_TRUE(StartWorker(victim).ok());
  ranks[victim] = StartElasticRank(victim, group, "new");
  ASSERT_NE(ranks[victim], nullptr);
  std::vector<std::string> totals;
  for (int rank = 0; rank < kWorkers; ++rank) {
    absl::StatusOr<int> code = ranks[rank]->WaitForExit(kRanksTimeout);
    ASSERT_TRUE(code.ok()) << "rank " << rank << ": " << code.status();
    const std::string log = ranks[rank]->ReadLog();
    EXPECT_EQ(*code, 0) << "rank " << rank << ": " << log
                        << ranks[rank]->ReadStderr();
    const size_t done = log.rfind("done: ");
    ASSERT_NE(done, std::string::npos) << log;
    totals.push_back(std::string(absl::StripAsciiWhitespace(log.substr(done))));
  }
  EXPECT_THAT(ranks[0]->ReadLog(),
              HasSubstr("admitted 1 newcomer(s): world 3"));
  EXPECT_THAT(ranks[victim]->ReadLog(), HasSubstr("joined as rank 2 of 3"));
  EXPECT_EQ(totals[0], totals[1]);
  EXPECT_EQ(totals[0], totals[2]);
  std::printf("[ result   ] every rank: %s\n", totals[0].c_str());
}

// chorus-bench across hosts: one invocation on each of two hosts, one rank
// each, sharing a coordinator and a group. Each prints the rows of its own
// rank, every result checked.
TEST_F(MultiHostTest, ChorusBench_OneRankPerHost_RowsCheckedOnBoth) {
#ifndef CHORUS_BENCH_BIN
  GTEST_SKIP() << "chorus-bench is not built (CHORUS_BENCH=OFF)";
#else
  ASSERT_NO_FATAL_FAILURE(StartCoordinator({}));
  std::vector<std::unique_ptr<Subprocess>> benches;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<std::string> command_line = net_->Wrap(rank + 1);
    SubprocessOptions options;
    options.binary = command_line[0];
    options.args.assign(command_line.begin() + 1, command_line.end());
    options.args.push_back(CHORUS_BENCH_BIN);
    for (const std::string& flag :
         {absl::StrCat("--coordinator=", coordinator_.address),
          std::string("--group=bench-0"), std::string("--world=2"),
          std::string("--ranks=1"), absl::StrCat("--first_rank=", rank),
          std::string("--listen=0.0.0.0:0"), std::string("--algorithm=ring"),
          std::string("--min_bytes=1K"), std::string("--max_bytes=64K"),
          std::string("--step_factor=8"), std::string("--iters=2"),
          std::string("--warmup=1"), std::string("--timeout=10s")}) {
      options.args.push_back(flag);
    }
    const std::string stem = absl::StrCat("bench-", rank);
    options.stdout_path = NewScratchPath(stem, ".out");
    options.stderr_path = NewScratchPath(stem, ".err");
    absl::StatusOr<std::unique_ptr<Subprocess>> process =
        Subprocess::Start(options);
    ASSERT_TRUE(process.ok()) << process.status();
    benches.push_back(*std::move(process));
  }
  for (int rank = 0; rank < 2; ++rank) {
    absl::StatusOr<int> code = benches[rank]->WaitForExit(kRanksTimeout);
    ASSERT_TRUE(code.ok()) << "bench " << rank << ": " << code.status();
    const std::string out = benches[rank]->ReadLog();
    EXPECT_EQ(*code, 0) << "bench " << rank << ": " << out
                        << benches[rank]->ReadStderr();
    EXPECT_THAT(out, HasSubstr(absl::StrCat("2 ranks, ranks ", rank, "..", rank,
                                            " here")));
    // 1K, 8K and 64K, each a ring.
    EXPECT_THAT(out, HasSubstr("65536"));
    int rows = 0;
    for (absl::string_view line : absl::StrSplit(out, '\n')) {
      rows += absl::StrContains(line, " ring ") ? 1 : 0;
    }
    EXPECT_EQ(rows, 3) << out;
    EXPECT_THAT(out, HasSubstr("# wrong elements in total: 0\n"));
  }
#endif
}

// A rate-limited link whose queue overflows (tbf drops what does not fit,
// so TCP retransmits), with netem's random loss added where the kernel has
// it: a ring across it completes with the exact result on every rank.
TEST_F(MultiHostTest, LossyLink_RingExactOnEveryRank) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator({}));
  ASSERT_NO_FATAL_FAILURE(StartAllWorkers());
  const int host = 2;  // rank 1's host
  const std::string dev = NamespaceNetwork::kInterface;
  absl::StatusOr<std::string> netem =
      net_->Tc(host, {"qdisc", "replace", "dev", dev, "root", "handle",
                      "1:", "netem", "loss", "2%"});
  const bool lossy = netem.ok();
  if (!lossy) {
    std::printf("[ note     ] no netem here (%s): tbf drops only\n",
                std::string(netem.status().message()).c_str());
  }
  std::vector<std::string> tbf = {"qdisc", "replace", "dev", dev};
  if (lossy) {
    tbf.insert(tbf.end(), {"parent", "1:1", "handle", "10:"});
  } else {
    tbf.push_back("root");
  }
  // A queue of 16 KB at 8 Mbit/s: bursts beyond it are dropped.
  tbf.insert(tbf.end(),
             {"tbf", "rate", "8mbit", "burst", "8kb", "limit", "16kb"});
  ShapeLink(host, tbf);
  if (IsSkipped() || HasFatalFailure()) return;

  constexpr int kCount = 50000;
  absl::Duration took;
  const std::vector<RankResult> results =
      RunRanks("lossy-0", "allreduce", LargeRingCalls(kCount), &took);
  const std::string want = LargeRingResult(kCount);
  for (size_t rank = 0; rank < results.size(); ++rank) {
    EXPECT_EQ(results[rank].exit_code, 0)
        << "rank " << rank << ": " << results[rank].err;
    EXPECT_TRUE(results[rank].out == want)
        << "rank " << rank << " printed " << results[rank].out.size()
        << " characters, not the " << want.size() << " of the exact result";
  }
  EXPECT_LE(took, kCollectiveBound + kSchedulingSlack);
  PrintTime("ring over the lossy link", took);
  absl::StatusOr<std::string> stats =
      net_->Tc(host, {"-s", "qdisc", "show", "dev", dev});
  ASSERT_TRUE(stats.ok()) << stats.status();
  std::printf("[ link     ] %s\n", stats->c_str());
}

}  // namespace
}  // namespace chorus::test
