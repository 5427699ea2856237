// Coordinators that run with --etcd: one leads, the others are standbys
// that refuse every call naming the leader and take over when it dies,
// stops or loses etcd. Real etcd, coordinators and workers on 127.0.0.1.
#include <signal.h>

#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/status_detail.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/worker/call_port_client.h"
#include "tests/testing/daemons.h"
#include "tests/testing/etcd.h"
#include "tests/testing/http_get.h"
#include "tests/testing/wait.h"

namespace chorus::test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The etcd lease of these tests' coordinators (etcd grants 2 s at least).
constexpr absl::Duration kLease = absl::Seconds(2);
// Generous: a loaded two-core machine; the figures come from the benches.
constexpr absl::Duration kTakeover = absl::Seconds(30);

class CoordinatorFailoverTest : public EtcdTest {
 protected:
  // A coordinator on a fixed port (it keeps it when it restarts as a
  // standby), campaigning on this test's etcd.
  // `metrics_port` > 0 serves the status page and metrics there;
  // `call_port` > 0 puts the call port there.
  Daemon StartCandidate(int metrics_port = 0, int call_port = 0) {
    const std::string listen = absl::StrCat("127.0.0.1:", PickFreePort());
    std::vector<std::string> flags = {
        absl::StrCat("--listen=", listen),
        absl::StrCat("--call_port=", call_port),
        absl::StrCat("--etcd=", etcd_.endpoint), "--etcd_prefix=/failover",
        absl::StrCat("--lease_timeout=", absl::FormatDuration(kLease))};
    if (metrics_port > 0) {
      flags.push_back(
          absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port));
    }
    absl::StatusOr<Daemon> started = StartCoordinator(flags);
    EXPECT_TRUE(started.ok()) << started.status();
    return started.ok() ? *std::move(started) : Daemon();
  }

  // ListWorkers at `address`: the workers, or the refusal.
  static absl::StatusOr<std::vector<v1::WorkerInfo>> Workers(
      const std::string& address) {
    auto stub = NewCoordinatorStub(address);
    return ListWorkers(*stub, absl::Seconds(5));
  }

  static bool Leads(const std::string& address) {
    return Workers(address).ok();
  }

  // The leader a refusal from `address` names; nullopt when it answered
  // or refused for another reason.
  static std::optional<std::string> NamedLeader(const std::string& address) {
    absl::StatusOr<std::vector<v1::WorkerInfo>> workers = Workers(address);
    if (workers.ok()) return std::nullopt;
    std::optional<v1::ErrorDetail> detail = ErrorDetailOf(workers.status());
    if (!absl::IsUnavailable(workers.status()) || !detail.has_value() ||
        detail->reason() != "NOT_LEADER") {
      return std::nullopt;
    }
    return detail->leader();
  }
};

TEST_F(CoordinatorFailoverTest, ListWorkers_OnStandby_UnavailableNamesLeader) {
  Daemon first = StartCandidate();
  ASSERT_TRUE(WaitUntil([&] { return Leads(first.address); }, kTakeover));
  Daemon second = StartCandidate();
  ASSERT_TRUE(WaitUntil(
      [&] { return NamedLeader(second.address) == first.address; }, kTakeover));
  absl::StatusOr<std::vector<v1::WorkerInfo>> refused = Workers(second.address);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.status().message(),
              HasSubstr(absl::StrCat("the leader is ", first.address)));
  // The leader still decides.
  EXPECT_TRUE(Leads(first.address));
}

TEST_F(CoordinatorFailoverTest, StatusPage_OnStandby_NamesLeader) {
  const int leader_http = PickFreePort();
  const int standby_http = PickFreePort();
  Daemon first = StartCandidate(leader_http);
  ASSERT_TRUE(WaitUntil([&] { return Leads(first.address); }, kTakeover));
  Daemon second = StartCandidate(standby_http);
  ASSERT_TRUE(WaitUntil(
      [&] { return NamedLeader(second.address) == first.address; }, kTakeover));
  EXPECT_THAT(
      HttpGet(standby_http, "/"),
      HasSubstr(absl::StrCat("standby; the leader is ", first.address)));
  EXPECT_THAT(HttpGet(leader_http, "/"), HasSubstr("leader (elected on etcd)"));
  EXPECT_THAT(HttpGet(standby_http, "/metrics"),
              HasSubstr("chorus_coordinator_leading 0"));
  EXPECT_THAT(HttpGet(leader_http, "/metrics"),
              HasSubstr("chorus_coordinator_leading 1"));
}

TEST_F(CoordinatorFailoverTest, CallPort_OnStandby_UnavailableNamesLeader) {
  Daemon first = StartCandidate();
  ASSERT_TRUE(WaitUntil([&] { return Leads(first.address); }, kTakeover));
  const int call_port = PickFreePort();
  Daemon second = StartCandidate(/*metrics_port=*/0, call_port);
  ASSERT_TRUE(WaitUntil(
      [&] { return NamedLeader(second.address) == first.address; }, kTakeover));
  CallPortClient client([&] { return absl::StrCat("127.0.0.1:", call_port); });
  ASSERT_TRUE(client.Ready(absl::Now() + kTakeover).ok());
  v1::CollectiveRequest request;
  request.set_group("g");
  request.set_epoch(1);
  request.set_sequence(1);
  request.mutable_spec()->set_kind(v1::COLLECTIVE_KIND_BARRIER);
  absl::StatusOr<v1::CollectiveResponse> refused =
      client.Call(request, absl::Now() + kTakeover);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  std::optional<v1::ErrorDetail> detail = ErrorDetailOf(refused.status());
  ASSERT_TRUE(detail.has_value()) << refused.status();
  EXPECT_EQ(detail->reason(), "NOT_LEADER");
  EXPECT_EQ(detail->leader(), first.address);
  client.Shutdown();
}

TEST_F(CoordinatorFailoverTest,
       LeaderKilled_StandbyLeadsAndWorkerRegistersThere) {
  Daemon first = StartCandidate();
  ASSERT_TRUE(WaitUntil([&] { return Leads(first.address); }, kTakeover));
  Daemon second = StartCandidate();
  // The worker lists the standby first: it follows the refusal.
  absl::StatusOr<Daemon> worker = StartWorker(
      absl::StrCat(second.address, ",", first.address), {"--name=w0"});
  ASSERT_TRUE(worker.ok()) << worker.status();
  absl::StatusOr<std::vector<v1::WorkerInfo>> listed = Workers(first.address);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_THAT(WorkerNames(*listed), ElementsAre("w0"));
  // chorusctl given the standby first asks the leader.
  const std::string both = absl::StrCat(second.address, ",", first.address);
  absl::StatusOr<CommandResult> ctl =
      RunChorusctl({absl::StrCat("--coordinator=", both), "workers"});
  ASSERT_TRUE(ctl.ok()) << ctl.status();
  EXPECT_EQ(ctl->exit_code, 0) << ctl->err;
  EXPECT_THAT(ctl->out, HasSubstr("w0"));

  ASSERT_TRUE(first.process->Kill().ok());
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(WaitUntil(
      [&] {
        absl::StatusOr<std::vector<v1::WorkerInfo>> now =
            Workers(second.address);
        return now.ok() && WorkerNames(*now) == std::vector<std::string>{"w0"};
      },
      kTakeover));
  // Given the dead one first, chorusctl moves on to the leader.
  ctl = RunChorusctl(
      {absl::StrCat("--coordinator=", first.address, ",", second.address),
       "workers"});
  ASSERT_TRUE(ctl.ok()) << ctl.status();
  EXPECT_EQ(ctl->exit_code, 0) << ctl->err;
  EXPECT_THAT(ctl->out, HasSubstr("w0"));
  std::cout << "the standby led with the worker registered "
            << absl::Now() - killed << " after the kill (lease " << kLease
            << ")\n";
}

TEST_F(CoordinatorFailoverTest,
       LeaderStopped_RefusesOnResumeAndBecomesStandby) {
  Daemon first = StartCandidate();
  ASSERT_TRUE(WaitUntil([&] { return Leads(first.address); }, kTakeover));
  Daemon second = StartCandidate();
  ASSERT_TRUE(first.process->Signal(SIGSTOP).ok());
  ASSERT_TRUE(WaitUntil([&] { return Leads(second.address); }, kTakeover));
  ASSERT_TRUE(first.process->Signal(SIGCONT).ok());
  // Its lease ran out while it was stopped: it decides nothing, at once.
  absl::StatusOr<std::vector<v1::WorkerInfo>> resumed = Workers(first.address);
  EXPECT_EQ(resumed.status().code(), absl::StatusCode::kUnavailable)
      << resumed.status();
  // It restarted as a standby (the same process) that names the leader.
  ASSERT_TRUE(WaitUntil(
      [&] { return NamedLeader(first.address) == second.address; }, kTakeover));
  EXPECT_TRUE(first.process->IsRunning());
  EXPECT_TRUE(Leads(second.address));
}

TEST_F(CoordinatorFailoverTest, EtcdGone_NobodyDecidesUntilItReturns) {
  Daemon first = StartCandidate();
  ASSERT_TRUE(WaitUntil([&] { return Leads(first.address); }, kTakeover));
  Daemon second = StartCandidate();
  ASSERT_TRUE(etcd_.process->Kill().ok());
  ASSERT_TRUE(etcd_.process->WaitForExit(absl::Seconds(30)).ok());
  // Within its lease the leader stops deciding; no coordinator leads.
  ASSERT_TRUE(WaitUntil(
      [&] {
        return NamedLeader(first.address).has_value() &&
               NamedLeader(second.address).has_value();
      },
      kTakeover));
  ASSERT_TRUE(RestartEtcd(etcd_).ok());
  EXPECT_TRUE(
      WaitUntil([&] { return Leads(first.address) || Leads(second.address); },
                kTakeover));
}

TEST_F(CoordinatorFailoverTest, Start_EtcdLeaseLongerThanWorkerLease_Exits2) {
  absl::StatusOr<CommandResult> ran = RunCommand(
      CoordinatorBinary(),
      {"--listen=127.0.0.1:0", absl::StrCat("--etcd=", etcd_.endpoint),
       "--lease_timeout=2s", "--etcd_lease=10s"},
      absl::Seconds(30));
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_EQ(ran->exit_code, 2);
  EXPECT_THAT(ran->err + ran->out, HasSubstr("--etcd_lease must be between"));
}

TEST(CoordinatorHelpTest, Help_ListsTheEtcdFlags) {
  absl::StatusOr<CommandResult> ran =
      RunCommand(CoordinatorBinary(), {"--help"}, absl::Seconds(30));
  ASSERT_TRUE(ran.ok()) << ran.status();
  for (const char* flag : {"--etcd ", "--etcd_prefix", "--etcd_lease",
                           "--etcd_ca", "--advertise"}) {
    EXPECT_THAT(ran->out + ran->err, HasSubstr(flag));
  }
}

}  // namespace
}  // namespace chorus::test
