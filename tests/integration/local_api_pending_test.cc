// Pending joins through one worker daemon's local API, against real daemons:
// thousands of joins waiting at once for ranks that have not come hold no
// thread of the daemon each, every one of them completes once its group
// does, and later bursts leave the daemon's memory where earlier ones left it.
#include <dirent.h>
#include <grpcpp/client_context.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/v1/worker.grpc.pb.h"
#include "gtest/gtest.h"
#include "server/common/net.h"
#include "tests/testing/daemons.h"
#include "tests/testing/process.h"
#include "tests/testing/wait.h"

namespace chorus::test {
namespace {

// Joins waiting at once through the daemon (the local API's contract).
constexpr int kPendingJoins = 10000;
// Far longer than the burst takes on a loaded machine.
constexpr absl::Duration kJoinTimeout = absl::Seconds(120);
// Threads the daemon may add under the burst (gRPC's own pools); a thread
// per waiting join would be kPendingJoins.
constexpr int kThreadSlack = 32;
// Sanitizer builds' allocators hold freed memory back (ASan's quarantine),
// so there memory is not checked, and one burst checks the threads.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// Bursts of kPendingJoins: the last must grow the daemon's resident memory
// by less than half of what the first did.
constexpr int kBursts = kSanitized ? 1 : 3;

// Threads of process `pid`; 0 when they cannot be read.
int ThreadsOf(pid_t pid) {
  int count = 0;
  if (DIR* dir = opendir(absl::StrCat("/proc/", pid, "/task").c_str())) {
    while (dirent* entry = readdir(dir)) {
      if (entry->d_name[0] != '.') ++count;
    }
    closedir(dir);
  }
  return count;
}

// Resident memory of process `pid` in KiB (VmRSS); 0 when it cannot be read.
int64_t ResidentKiB(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    int64_t kib = 0;
    if (absl::StartsWith(line, "VmRSS:") &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::StripSuffix(
                             absl::StripPrefix(line, "VmRSS:"), "kB")),
                         &kib)) {
      return kib;
    }
  }
  return 0;
}

// Joins issued without waiting, and how they ended.
class JoinBurst {
 public:
  explicit JoinBurst(v1::WorkerLocal::Stub* stub) : stub_(stub) {}

  // Starts the join of group `group` (of two) as `rank`.
  void Start(const std::string& group, int rank) {
    auto call = std::make_unique<Call>();
    call->context.set_deadline(DeadlineAfter(kJoinTimeout));
    call->request.set_group(group);
    call->request.set_world_size(2);
    call->request.set_rank(rank);
    Call* raw = call.get();
    {
      absl::MutexLock lock(&mu_);
      calls_.push_back(std::move(call));
    }
    stub_->async()->JoinGroup(&raw->context, &raw->request, &raw->response,
                              [this](grpc::Status status) {
                                absl::MutexLock lock(&mu_);
                                ++ended_;
                                if (!status.ok() && first_error_.ok()) {
                                  first_error_ = status;
                                }
                              });
  }

  // Waits until `count` joins ended; returns false when the deadline
  // passed first.
  bool WaitEnded(int count, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto reached = [this, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return ended_ >= count;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }

  int ended() {
    absl::MutexLock lock(&mu_);
    return ended_;
  }

  // The first failed join's status (OK when none failed).
  grpc::Status first_error() {
    absl::MutexLock lock(&mu_);
    return first_error_;
  }

 private:
  struct Call {
    grpc::ClientContext context;
    v1::LocalJoinRequest request;
    v1::LocalJoinResponse response;
  };

  v1::WorkerLocal::Stub* const stub_;
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Call>> calls_ ABSL_GUARDED_BY(mu_);
  int ended_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::Status first_error_ ABSL_GUARDED_BY(mu_);
};

// Groups the coordinator holds as forming (ranks waiting in JoinGroup);
// -1 when it cannot be asked.
int FormingGroups(v1::Coordinator::Stub& coordinator) {
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(kRpcTimeout));
  v1::ListGroupsResponse response;
  if (!coordinator.ListGroups(&context, v1::ListGroupsRequest(), &response)
           .ok()) {
    return -1;
  }
  return response.forming_size();
}

TEST(LocalApiPendingTest, JoinGroup_ThousandsPending_DaemonThreadsFlat) {
  absl::StatusOr<Daemon> coordinator = StartCoordinator();
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  absl::StatusOr<Daemon> worker =
      StartWorker(coordinator->address, {"--name=pending-w"});
  ASSERT_TRUE(worker.ok()) << worker.status();
  auto stub =
      v1::WorkerLocal::NewStub(MakeChannel(worker->address, Role::kWorker));
  std::unique_ptr<v1::Coordinator::Stub> admin =
      NewCoordinatorStub(coordinator->address);

  // One join that completes first warms the daemon's pools and connections.
  JoinBurst burst(stub.get());
  burst.Start("pending-warm", 0);
  burst.Start("pending-warm", 1);
  ASSERT_TRUE(burst.WaitEnded(2, kJoinTimeout));
  ASSERT_TRUE(burst.first_error().ok()) << burst.first_error().error_message();
  const int threads_before = ThreadsOf(worker->process->pid());
  ASSERT_GT(threads_before, 0);
  const int64_t resident_before = ResidentKiB(worker->process->pid());

  // Bursts of the same groups (each forms them again, at new epochs). Later
  // bursts may still grow the daemon's memory some (the allocator spreads
  // it over per-thread arenas that gRPC's threads fill in turn), but
  // nothing a burst used stays held.
  int64_t resident_after[kBursts] = {};
  for (int round = 0; round < kBursts; ++round) {
    SCOPED_TRACE(absl::StrCat("burst ", round + 1));
    const int ended_before = burst.ended();
    for (int i = 0; i < kPendingJoins; ++i) {
      burst.Start(absl::StrCat("pending-", i), 0);
    }
    ASSERT_TRUE(WaitUntil(
        [&] { return FormingGroups(*admin) == kPendingJoins; }, kJoinTimeout))
        << FormingGroups(*admin) << " groups forming of " << kPendingJoins;
    const int threads_pending = ThreadsOf(worker->process->pid());
    RecordProperty(absl::StrCat("daemon_threads_pending_", round + 1),
                   threads_pending);
    EXPECT_LE(threads_pending, threads_before + kThreadSlack)
        << kPendingJoins << " pending joins took " << threads_pending << " - "
        << threads_before << " threads";
    EXPECT_EQ(burst.ended(), ended_before)
        << "a join ended before its group formed: "
        << burst.first_error().error_message();

    // The other rank of every group comes: each pending join completes.
    for (int i = 0; i < kPendingJoins; ++i) {
      burst.Start(absl::StrCat("pending-", i), 1);
    }
    ASSERT_TRUE(burst.WaitEnded(ended_before + 2 * kPendingJoins, kJoinTimeout))
        << burst.ended() << " joins ended";
    EXPECT_TRUE(burst.first_error().ok())
        << burst.first_error().error_message();
    EXPECT_EQ(FormingGroups(*admin), 0);
    resident_after[round] = ResidentKiB(worker->process->pid());
    RecordProperty(absl::StrCat("daemon_rss_kib_after_", round + 1),
                   static_cast<int>(resident_after[round]));
  }
  RecordProperty("daemon_threads_before", threads_before);
  RecordProperty("daemon_rss_kib_before", static_cast<int>(resident_before));
  if (kSanitized) return;
  // Memory a burst kept would come back with every burst; what the
  // allocator keeps for reuse does not.
  ASSERT_GT(resident_before, 0);
  const int64_t first_growth = resident_after[0] - resident_before;
  const int64_t last_growth =
      resident_after[kBursts - 1] - resident_after[kBursts - 2];
  EXPECT_LT(last_growth, first_growth / 2)
      << "the daemon grew " << first_growth << " KiB in the first burst and "
      << last_growth << " KiB in the last (" << resident_before << " KiB "
      << "before the first, " << resident_after[kBursts - 1] << " after)";
}

}  // namespace
}  // namespace chorus::test
