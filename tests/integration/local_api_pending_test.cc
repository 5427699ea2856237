// Pending joins through one worker daemon's local API, against real daemons:
// thousands of joins waiting at once for ranks that have not come hold no
// thread of the daemon each, and every one of them completes once its
// group does.
#include <dirent.h>
#include <grpcpp/client_context.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

  for (int i = 0; i < kPendingJoins; ++i) {
    burst.Start(absl::StrCat("pending-", i), 0);
  }
  ASSERT_TRUE(WaitUntil([&] { return FormingGroups(*admin) == kPendingJoins; },
                        kJoinTimeout))
      << FormingGroups(*admin) << " groups forming of " << kPendingJoins;
  const int threads_pending = ThreadsOf(worker->process->pid());
  RecordProperty("daemon_threads_before", threads_before);
  RecordProperty("daemon_threads_pending", threads_pending);
  EXPECT_LE(threads_pending, threads_before + kThreadSlack)
      << kPendingJoins << " pending joins took " << threads_pending << " - "
      << threads_before << " threads";
  EXPECT_EQ(burst.ended(), 2) << "a join ended before its group formed: "
                              << burst.first_error().error_message();

  // The other rank of every group comes: each pending join completes.
  for (int i = 0; i < kPendingJoins; ++i) {
    burst.Start(absl::StrCat("pending-", i), 1);
  }
  ASSERT_TRUE(burst.WaitEnded(2 + 2 * kPendingJoins, kJoinTimeout))
      << burst.ended() << " joins ended";
  EXPECT_TRUE(burst.first_error().ok()) << burst.first_error().error_message();
  EXPECT_EQ(FormingGroups(*admin), 0);
}

}  // namespace
}  // namespace chorus::test
