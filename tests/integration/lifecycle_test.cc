// Integration tests of the daemons' lifecycle: lease expiry after a worker is
// killed, re-registration after a coordinator restart, orderly shutdown on
// SIGTERM, and a worker refused a local socket another one serves. Every test
// kills or signals real processes on 127.0.0.1.

#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemons.h"
#include "tests/testing/wait.h"

namespace chorus::test {
namespace {

using ::testing::ElementsAre;

// Generous bounds for things that should take well under a second; a loaded
// two-core machine must not make the tests flaky.
constexpr absl::Duration kExitTimeout = absl::Seconds(30);
constexpr absl::Duration kReregisterTimeout = absl::Seconds(20);
// Pause between two ListWorkers polls while watching for a change.
constexpr absl::Duration kWatchPause = absl::Milliseconds(20);

bool Listed(const std::vector<v1::WorkerInfo>& workers,
            const std::string& name) {
  return std::any_of(workers.begin(), workers.end(),
                     [&](const v1::WorkerInfo& w) { return w.name() == name; });
}

TEST(LifecycleTest, Lease_WorkerKilled_EvictedWithinLeasePlusOneSecond) {
  absl::StatusOr<Daemon> coordinator = StartCoordinator({"--lease_timeout=2s"});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  absl::StatusOr<Daemon> doomed =
      StartWorker(coordinator->address, {"--name=doomed", "--devices=cpu"});
  ASSERT_TRUE(doomed.ok()) << doomed.status();
  absl::StatusOr<Daemon> survivor =
      StartWorker(coordinator->address, {"--name=survivor", "--devices=cpu"});
  ASSERT_TRUE(survivor.ok()) << survivor.status();
  auto stub = NewCoordinatorStub(coordinator->address);
  ASSERT_THAT(ListedNamesOrEmpty(*stub), ElementsAre("doomed", "survivor"));

  const absl::Time killed_at = absl::Now();
  ASSERT_TRUE(doomed->process->Kill().ok());
  // A failed ListWorkers call means "not observed yet", never "gone".
  const bool evicted = WaitUntil(
      [&] {
        absl::StatusOr<std::vector<v1::WorkerInfo>> workers =
            ListWorkers(*stub);
        return workers.ok() && !Listed(*workers, "doomed");
      },
      absl::Seconds(30), kWatchPause);
  const absl::Duration elapsed = absl::Now() - killed_at;
  ASSERT_TRUE(evicted) << "still listed " << elapsed << " after SIGKILL";
  EXPECT_LE(elapsed, absl::Seconds(3))
      << "a 2 s lease took " << elapsed << " to expire";

  absl::StatusOr<int> code = doomed->process->WaitForExit(kExitTimeout);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, ExitCodeForSignal(SIGKILL));
  EXPECT_THAT(ListedNamesOrEmpty(*stub), ElementsAre("survivor"));
}

TEST(LifecycleTest, CoordinatorRestart_SamePort_WorkersReregisterThemselves) {
  absl::StatusOr<Daemon> first = StartCoordinator();
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<Daemon> a =
      StartWorker(first->address, {"--name=worker-a", "--devices=cpu"});
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<Daemon> b =
      StartWorker(first->address, {"--name=worker-b", "--devices=cpu"});
  ASSERT_TRUE(b.ok()) << b.status();
  auto first_stub = NewCoordinatorStub(first->address);
  absl::StatusOr<std::vector<v1::WorkerInfo>> before = ListWorkers(*first_stub);
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_THAT(WorkerNames(*before), ElementsAre("worker-a", "worker-b"));

  ASSERT_TRUE(first->process->Kill().ok());
  absl::StatusOr<int> code = first->process->WaitForExit(kExitTimeout);
  ASSERT_TRUE(code.ok()) << code.status();

  absl::StatusOr<Daemon> second =
      StartCoordinator({absl::StrCat("--listen=127.0.0.1:", first->port)});
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->port, first->port);
  auto second_stub = NewCoordinatorStub(second->address);
  std::vector<std::string> names;
  const bool back = WaitUntil(
      [&] {
        names = ListedNamesOrEmpty(*second_stub);
        return names.size() == 2;
      },
      kReregisterTimeout);
  EXPECT_TRUE(back) << "listed after " << kReregisterTimeout << ": "
                    << ::testing::PrintToString(names);
  EXPECT_THAT(names, ElementsAre("worker-a", "worker-b"));

  // The same processes came back on their own: same incarnations.
  absl::StatusOr<std::vector<v1::WorkerInfo>> after = ListWorkers(*second_stub);
  ASSERT_TRUE(after.ok()) << after.status();
  std::map<std::string, uint64_t> incarnation_before;
  for (const v1::WorkerInfo& w : *before) {
    incarnation_before[w.name()] = w.incarnation();
  }
  for (const v1::WorkerInfo& w : *after) {
    EXPECT_EQ(w.incarnation(), incarnation_before[w.name()]) << w.name();
  }
  EXPECT_TRUE(a->process->IsRunning());
  EXPECT_TRUE(b->process->IsRunning());
}

TEST(LifecycleTest, WorkerSigterm_Registered_ExitsZeroAndDeregisters) {
  // With a 30 s lease, only deregistration can remove the worker in time.
  absl::StatusOr<Daemon> coordinator =
      StartCoordinator({"--lease_timeout=30s"});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  absl::StatusOr<Daemon> leaving =
      StartWorker(coordinator->address, {"--name=leaving", "--devices=cpu"});
  ASSERT_TRUE(leaving.ok()) << leaving.status();
  absl::StatusOr<Daemon> staying =
      StartWorker(coordinator->address, {"--name=staying", "--devices=cpu"});
  ASSERT_TRUE(staying.ok()) << staying.status();
  auto stub = NewCoordinatorStub(coordinator->address);
  ASSERT_THAT(ListedNamesOrEmpty(*stub), ElementsAre("leaving", "staying"));

  const absl::Time signalled_at = absl::Now();
  ASSERT_TRUE(leaving->process->Signal(SIGTERM).ok());
  absl::StatusOr<int> code = leaving->process->WaitForExit(kExitTimeout);
  const absl::Duration elapsed = absl::Now() - signalled_at;
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  EXPECT_LE(elapsed, absl::Seconds(10));

  // The worker deregisters before it exits, so it is gone by now.
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = ListWorkers(*stub);
  ASSERT_TRUE(workers.ok()) << workers.status();
  EXPECT_THAT(WorkerNames(*workers), ElementsAre("staying"));
}

TEST(LifecycleTest, CoordinatorSigterm_WithWorker_ExitsZeroPromptly) {
  absl::StatusOr<Daemon> coordinator = StartCoordinator();
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  // A registered worker keeps a connection open and heartbeats.
  absl::StatusOr<Daemon> worker =
      StartWorker(coordinator->address, {"--name=worker-a", "--devices=cpu"});
  ASSERT_TRUE(worker.ok()) << worker.status();

  const absl::Time signalled_at = absl::Now();
  ASSERT_TRUE(coordinator->process->Signal(SIGTERM).ok());
  absl::StatusOr<int> code = coordinator->process->WaitForExit(kExitTimeout);
  const absl::Duration elapsed = absl::Now() - signalled_at;
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  EXPECT_LE(elapsed, absl::Seconds(10));
}

// A socket directory others can write (e.g. a /tmp/chorus-UID another
// user made with mode 0777) would let them replace the socket: the worker
// refuses it at start, saying what to fix, and serves nothing there.
TEST(LifecycleTest, WorkerStart_SocketDirectoryOthersCanWrite_Refused) {
  absl::StatusOr<Daemon> coordinator = StartCoordinator();
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  std::string dir = "/tmp/chorus-open-XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  ASSERT_EQ(chmod(dir.c_str(), 0777), 0);
  const std::string socket = dir + "/worker.sock";
  absl::StatusOr<std::unique_ptr<Subprocess>> worker = SpawnWorker(
      coordinator->address, {"--name=open", "--local_socket=" + socket});
  ASSERT_TRUE(worker.ok()) << worker.status();
  absl::StatusOr<int> code = (*worker)->WaitForExit(kExitTimeout);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_NE(*code, 0);
  EXPECT_THAT((*worker)->ReadLog(),
              ::testing::HasSubstr(absl::StrCat("the local socket's directory ",
                                                dir, " belongs to uid ",
                                                geteuid(), " with mode 0777")));
  struct stat info;
  EXPECT_NE(lstat(socket.c_str(), &info), 0) << socket << " was made";
  rmdir(dir.c_str());
}

// A socket served by another user (SO_PEERCRED) may be an impostor:
// chorusctl refuses it before sending anything.
TEST(LifecycleTest, Chorusctl_SocketServedByAnotherUser_PermissionDenied) {
  if (geteuid() != 0) GTEST_SKIP() << "serving as another user needs root";
  std::string dir = "/tmp/chorus-peer-XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  ASSERT_EQ(chmod(dir.c_str(), 0777), 0);
  const std::string socket = dir + "/impostor.sock";
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t impostor = fork();
  ASSERT_GE(impostor, 0);
  if (impostor == 0) {
    // As nobody: listen on the socket, then wait to be killed.
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(1);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path, socket.data(), socket.size());
    if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        listen(fd, 8) != 0) {
      _exit(2);
    }
    (void)!write(ready[1], "r", 1);
    pause();
    _exit(0);
  }
  close(ready[1]);
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  close(ready[0]);
  absl::StatusOr<CommandResult> refused =
      RunChorusctl({"--worker=unix:" + socket, "--group=g", "allreduce", "1"});
  kill(impostor, SIGKILL);
  waitpid(impostor, nullptr, 0);
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_NE(refused->exit_code, 0);
  EXPECT_THAT(refused->err + refused->out,
              ::testing::HasSubstr(absl::StrCat("the socket ", socket,
                                                " is served by uid 65534")));
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

// A second worker given a local socket another worker serves (on one host,
// or on hosts or containers sharing a file system, where the default path
// is the same for each) is refused at start, saying who may hold it and
// what to give instead; the first keeps its socket and its registration.
TEST(LifecycleTest,
     WorkerStart_LocalSocketServed_RefusedNamingSharedFileSystem) {
  absl::StatusOr<Daemon> coordinator = StartCoordinator();
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  // Unix socket paths must stay short; the scratch directory may not.
  std::string dir = "/tmp/chorus-sock-XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  const std::string socket = dir + "/worker.sock";
  absl::StatusOr<Daemon> first = StartWorker(
      coordinator->address, {"--name=first", "--local_socket=" + socket});
  ASSERT_TRUE(first.ok()) << first.status();

  absl::StatusOr<std::unique_ptr<Subprocess>> second = SpawnWorker(
      coordinator->address, {"--name=second", "--local_socket=" + socket});
  ASSERT_TRUE(second.ok()) << second.status();
  absl::StatusOr<int> code = (*second)->WaitForExit(kExitTimeout);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_NE(*code, 0);
  EXPECT_THAT((*second)->ReadLog(),
              ::testing::HasSubstr(absl::StrCat(
                  "another process serves the local socket ", socket,
                  ": a worker already running on this host, or on another "
                  "host or container that shares this file system; give this "
                  "worker a --local_socket of its own")));

  auto stub = NewCoordinatorStub(coordinator->address);
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = ListWorkers(*stub);
  ASSERT_TRUE(workers.ok()) << workers.status();
  EXPECT_THAT(WorkerNames(*workers), ElementsAre("first"));
  absl::StatusOr<CommandResult> listed = RunChorusctl(
      {"--worker=unix:" + socket, "--group=still-there", "allreduce", "1"});
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->exit_code, 0) << listed->err;
  first->process.reset();
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

}  // namespace
}  // namespace chorus::test
