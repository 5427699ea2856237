// The plan a call reports is the plan it ran: two worker daemons on one host
// are planned same_host, but when one of them runs in its own pid namespace
// neither can map the other's shared memory, every rank falls back to the
// ring, and chorusctl on each rank prints "ran ring" (and the right sums).
// Real coordinator and worker processes on 127.0.0.1; the namespace comes
// from util-linux's unshare, and the test skips where it cannot make one.

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemons.h"

namespace chorus::test {
namespace {

using ::testing::HasSubstr;

// Runs chorusctl for ranks 0 and 1 at once through `workers[r]`, forcing
// the same_host plan on an all_reduce of three f32 values.
std::vector<CommandResult> AllReduceOnRanks(const std::string& coordinator,
                                            const std::vector<Daemon*>& workers,
                                            const std::string& group) {
  std::vector<std::unique_ptr<Subprocess>> processes;
  std::vector<std::pair<std::string, std::string>> logs;
  for (int r = 0; r < 2; ++r) {
    SubprocessOptions options;
    options.binary = ChorusctlBinary();
    options.args = {absl::StrCat("--coordinator=", coordinator),
                    absl::StrCat("--worker=", workers[r]->address),
                    absl::StrCat("--group=", group),
                    "--world=2",
                    absl::StrCat("--rank=", r),
                    "--timeout=60s",
                    "--algorithm=same_host",
                    "--",
                    "allreduce",
                    r == 0 ? "1" : "10",
                    r == 0 ? "2" : "20",
                    r == 0 ? "3" : "30"};
    options.stdout_path = NewScratchPath(absl::StrCat("rank-", r), ".out");
    options.stderr_path = NewScratchPath(absl::StrCat("rank-", r), ".err");
    absl::StatusOr<std::unique_ptr<Subprocess>> process =
        Subprocess::Start(options);
    EXPECT_TRUE(process.ok()) << process.status();
    if (!process.ok()) return {};
    processes.push_back(*std::move(process));
  }
  std::vector<CommandResult> results(2);
  for (int r = 0; r < 2; ++r) {
    absl::StatusOr<int> code = processes[r]->WaitForExit(absl::Seconds(90));
    EXPECT_TRUE(code.ok()) << code.status();
    results[r].exit_code = code.value_or(-1);
    results[r].out = processes[r]->ReadLog();
    results[r].err = processes[r]->ReadStderr();
  }
  return results;
}

bool CanUnsharePid() {
  absl::StatusOr<CommandResult> probe = RunCommand(
      "/usr/bin/unshare", {"--pid", "--fork", "--mount-proc", "/bin/true"},
      absl::Seconds(30));
  return probe.ok() && probe->exit_code == 0;
}

TEST(SameHostFallbackTest, Run_PeerInOtherPidNamespace_ReportsRingOnEveryRank) {
  if (!CanUnsharePid()) {
    GTEST_SKIP() << "cannot make a pid namespace here (unshare --pid)";
  }
  absl::StatusOr<Daemon> coordinator = StartCoordinator();
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  absl::StatusOr<Daemon> plain =
      StartWorker(coordinator->address, {"--name=plain"});
  ASSERT_TRUE(plain.ok()) << plain.status();
  absl::StatusOr<Daemon> isolated = StartWrappedWorker(
      {"unshare", "--pid", "--fork", "--mount-proc", "--kill-child"},
      coordinator->address, {"--name=isolated"});
  ASSERT_TRUE(isolated.ok()) << isolated.status();

  const std::vector<CommandResult> across =
      AllReduceOnRanks(coordinator->address, {&*plain, &*isolated}, "across");
  ASSERT_EQ(across.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_EQ(across[r].exit_code, 0) << across[r].err;
    EXPECT_THAT(across[r].out, HasSubstr("11 22 33"));
    EXPECT_THAT(across[r].err, HasSubstr("#1 of group across"));
    EXPECT_THAT(across[r].err, HasSubstr("ran ring"));
  }

  // Two ranks on the one daemon map each other and run what was planned.
  const std::vector<CommandResult> within =
      AllReduceOnRanks(coordinator->address, {&*plain, &*plain}, "within");
  ASSERT_EQ(within.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_EQ(within[r].exit_code, 0) << within[r].err;
    EXPECT_THAT(within[r].out, HasSubstr("11 22 33"));
    EXPECT_THAT(within[r].err, HasSubstr("ran same_host"));
  }
}

}  // namespace
}  // namespace chorus::test
