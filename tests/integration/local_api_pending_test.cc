// Pending calls through one worker daemon's local API, against real daemons:
// thousands of joins, or of collectives, waiting at once for ranks that have
// not come hold no thread of the daemon each, every one of them completes
// once the other ranks come, and later bursts leave the daemon's memory
// where earlier ones left it (for collectives, because the daemon gives a
// burst's freed memory back once gRPC released its calls).
#include <dirent.h>
#include <grpcpp/client_context.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/v1/worker.grpc.pb.h"
#include "common/net.h"
#include "gtest/gtest.h"
#include "tests/testing/daemons.h"
#include "tests/testing/http_get.h"
#include "tests/testing/local_calls.h"
#include "tests/testing/process.h"
#include "tests/testing/wait.h"

namespace chorus::test {
namespace {

// Joins, and collectives, waiting at once through the daemon (the local
// API's contract).
constexpr int kPendingJoins = 10000;
constexpr int kPendingCalls = 10000;
// The groups the pending collectives are spread over: a rank may have at
// most kMaxNumbersAhead (1024) numbers ahead of its lowest unused one.
constexpr int kCallGroups = 20;
// Threads the daemon may add under a burst of collectives: as for joins,
// plus the task threads of calls that reached the daemon before a lower
// number of their rank (gRPC hands calls to its threads out of order) and
// waited for it; they park afterwards. A thread per waiting call would be
// kPendingCalls.
constexpr int kCallThreadSlack = 200;
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

// Bursts of pending joins (or collectives): the last must grow the daemon's
// resident memory by less than half of what the first did.
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

// How far a daemon's resident memory moves by itself over the bursts after
// the first (after a trim it lands a few MiB either way from burst to
// burst): measured up to 6 MiB over two bursts.
constexpr int64_t kResidentNoiseKiB = 12 << 10;

// Checks that the daemon's resident memory stopped growing: memory a burst
// kept would come back with every burst, while what the allocator keeps for
// reuse does not. `before` is read before the first burst, `after[b]` after
// burst b (kBursts of them). The bursts after the first are taken together
// and may grow by the first burst's growth or by the noise, whichever is
// more: with little kept per call the first burst grows by only 6-10 MiB,
// about as much as the noise. A burst that kept 1 KiB per call (10 MiB)
// still fails it.
void ExpectMemoryFlat(int64_t before, const int64_t (&after)[kBursts]) {
  if (kSanitized) return;
  ASSERT_GT(before, 0);
  const int64_t first_growth = after[0] - before;
  const int64_t later_growth = after[kBursts - 1] - after[0];
  EXPECT_LT(later_growth, std::max(first_growth, kResidentNoiseKiB))
      << "the daemon grew " << first_growth << " KiB in the first burst and "
      << later_growth << " KiB in the " << kBursts - 1 << " after it ("
      << before << " KiB before the first, " << after[kBursts - 1] << " after)";
}

// Calls issued without waiting, and how they ended.
template <typename Request, typename Response>
class Burst {
 public:
  struct Call {
    grpc::ClientContext context;
    Request request;
    Response response;
  };

  // Waits until `count` calls ended; returns false when `timeout` passed
  // first.
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

  // The first failed call's status (OK when none failed).
  grpc::Status first_error() {
    absl::MutexLock lock(&mu_);
    return first_error_;
  }

 protected:
  // A new call with a deadline kJoinTimeout away, kept as long as the burst.
  Call* NewCall() {
    auto call = std::make_unique<Call>();
    call->context.set_deadline(DeadlineAfter(kJoinTimeout));
    Call* raw = call.get();
    absl::MutexLock lock(&mu_);
    calls_.push_back(std::move(call));
    return raw;
  }

  // Counts a call that ended with `status`.
  void Ended(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    ++ended_;
    if (!status.ok() && first_error_.ok()) first_error_ = status;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Call>> calls_ ABSL_GUARDED_BY(mu_);
  int ended_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::Status first_error_ ABSL_GUARDED_BY(mu_);
};

// Joins issued without waiting.
class JoinBurst : public Burst<v1::LocalJoinRequest, v1::LocalJoinResponse> {
 public:
  explicit JoinBurst(v1::WorkerLocal::Stub* stub) : stub_(stub) {}

  // Starts the join of group `group` (of two) as `rank`.
  void Start(const std::string& group, int rank) {
    Call* call = NewCall();
    call->request.set_group(group);
    call->request.set_world_size(2);
    call->request.set_rank(rank);
    stub_->async()->JoinGroup(&call->context, &call->request, &call->response,
                              [this](grpc::Status status) { Ended(status); });
  }

 private:
  v1::WorkerLocal::Stub* const stub_;
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

// The value of `sample` (a metric with its labels) read from the HTTP port
// of a daemon; -1 when it cannot be read.
int MetricValue(int metrics_port, absl::string_view sample) {
  const std::string page = HttpGet(metrics_port, "/metrics");
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    double value = 0;
    if (absl::ConsumePrefix(&line, sample) && absl::ConsumePrefix(&line, " ") &&
        absl::SimpleAtod(line, &value)) {
      return static_cast<int>(value);
    }
  }
  return -1;
}

// A worker daemon named `name` serving its metrics, and their port.
struct MeteredWorker {
  Daemon daemon;
  int metrics_port = 0;
};

absl::StatusOr<MeteredWorker> StartMeteredWorker(const std::string& coordinator,
                                                 const std::string& name) {
  const std::string port_file = NewScratchPath("worker-metrics", ".port");
  absl::StatusOr<Daemon> worker = StartWorker(
      coordinator,
      {absl::StrCat("--name=", name), "--metrics_listen=127.0.0.1:0",
       absl::StrCat("--metrics_port_file=", port_file)});
  if (!worker.ok()) return worker.status();
  if (!WaitUntil([&] { return ReadPort(port_file) > 0; }, kJoinTimeout)) {
    return absl::DeadlineExceededError("no metrics port");
  }
  return MeteredWorker{*std::move(worker), ReadPort(port_file)};
}

// Waits until gRPC released every call of the daemon (it does that some
// time after the client got the reply); false when it did not in time.
bool CallsReleased(const MeteredWorker& worker) {
  return WaitUntil(
      [&] {
        return MetricValue(worker.metrics_port, "chorus_local_calls") == 0;
      },
      kJoinTimeout);
}

// The worker's trims of the memory its bursts freed: as each burst ended,
// and once more a second after its last call (gRPC frees part of a call's
// memory after the call, later when the machine is busy).
constexpr absl::string_view kBurstTrims =
    "chorus_memory_trims_total{when=\"burst\"}";
constexpr absl::string_view kSettledTrims =
    "chorus_memory_trims_total{when=\"settled\"}";

// Waits until the worker trimmed its heap once more after the burst that
// began when its settled trims were `settled_before`: what the memory
// check reads is the heap once everything of the burst was freed.
bool BurstSettled(const MeteredWorker& worker, int settled_before) {
  return WaitUntil(
      [&] {
        return MetricValue(worker.metrics_port, kSettledTrims) > settled_before;
      },
      kJoinTimeout);
}

TEST(LocalApiPendingTest, JoinGroup_ThousandsPending_DaemonThreadsFlat) {
  // What is measured is the daemon's threads, not liveness: a lease long
  // enough that a coordinator starved of CPU (sanitizers, a loaded
  // machine) while 10,000 joins queue ahead of a heartbeat evicts nobody.
  absl::StatusOr<Daemon> coordinator =
      StartCoordinator({"--lease_timeout=60s"});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  absl::StatusOr<MeteredWorker> metered =
      StartMeteredWorker(coordinator->address, "pending-w");
  ASSERT_TRUE(metered.ok()) << metered.status();
  const Daemon* worker = &metered->daemon;
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
  ASSERT_TRUE(CallsReleased(*metered));
  const int threads_before = ThreadsOf(worker->process->pid());
  ASSERT_GT(threads_before, 0);
  const int64_t resident_before = ResidentKiB(worker->process->pid());

  // Bursts of the same groups (each forms them again, at new epochs):
  // nothing a burst used stays held.
  int64_t resident_after[kBursts] = {};
  for (int round = 0; round < kBursts; ++round) {
    SCOPED_TRACE(absl::StrCat("burst ", round + 1));
    const int ended_before = burst.ended();
    const int settled_before =
        MetricValue(metered->metrics_port, kSettledTrims);
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
    ASSERT_TRUE(CallsReleased(*metered));
    ASSERT_TRUE(BurstSettled(*metered, settled_before))
        << "the daemon did not trim its heap after burst " << round + 1;
    resident_after[round] = ResidentKiB(worker->process->pid());
    RecordProperty(absl::StrCat("daemon_rss_kib_after_", round + 1),
                   static_cast<int>(resident_after[round]));
  }
  RecordProperty("daemon_threads_before", threads_before);
  RecordProperty("daemon_rss_kib_before", static_cast<int>(resident_before));
  ExpectMemoryFlat(resident_before, resident_after);
}

// Collectives issued without waiting.
class CallBurst
    : public Burst<v1::LocalCollectiveRequest, v1::LocalCollectiveResponse> {
 public:
  explicit CallBurst(v1::WorkerLocal::Stub* stub) : stub_(stub) {}

  // Starts `rank`'s all_reduce of one u32 1 as its call #`sequence` of
  // `group` at `epoch`; it must sum to `world`.
  void Start(const std::string& group, uint64_t epoch, int rank,
             uint64_t sequence, uint32_t world) {
    Call* call = NewCall();
    call->request = OneU32AllReduce(group, epoch, rank, sequence);
    stub_->async()->Collective(
        &call->context, &call->request, &call->response,
        [this, call, world](grpc::Status status) {
          const std::string expected(reinterpret_cast<const char*>(&world),
                                     sizeof(world));
          if (status.ok() && call->response.data() != expected) {
            status =
                grpc::Status(grpc::StatusCode::DATA_LOSS,
                             absl::StrCat("call #", call->request.sequence(),
                                          " returned a wrong sum"));
          }
          Ended(status);
        });
  }

 private:
  v1::WorkerLocal::Stub* const stub_;
};

// The coordinator's chorus_pending_collectives{phase="matching"}.
int MatchingCollectives(int metrics_port) {
  return MetricValue(metrics_port,
                     "chorus_pending_collectives{phase=\"matching\"}");
}

// The name of pending-collectives group `g`.
std::string CallGroup(int g) { return absl::StrCat("pending-calls-", g); }

TEST(LocalApiPendingTest,
     Collective_ThousandsPendingInBursts_DaemonThreadsFlat) {
  const std::string port_file = NewScratchPath("coordinator-metrics", ".port");
  // A long lease, as in JoinGroup_ThousandsPending_DaemonThreadsFlat.
  absl::StatusOr<Daemon> coordinator = StartCoordinator(
      {"--metrics_listen=127.0.0.1:0",
       absl::StrCat("--metrics_port_file=", port_file), "--lease_timeout=60s"});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  ASSERT_TRUE(WaitUntil([&] { return ReadPort(port_file) > 0; }, kJoinTimeout));
  const int metrics_port = ReadPort(port_file);
  absl::StatusOr<MeteredWorker> metered =
      StartMeteredWorker(coordinator->address, "pending-calls-w");
  ASSERT_TRUE(metered.ok()) << metered.status();
  const Daemon* worker = &metered->daemon;
  auto stub =
      v1::WorkerLocal::NewStub(MakeChannel(worker->address, Role::kWorker));

  // Both ranks of each group join through the daemon.
  std::vector<uint64_t> epochs(kCallGroups);
  {
    std::vector<std::thread> joins;
    std::vector<grpc::Status> joined(2 * kCallGroups);
    for (int g = 0; g < kCallGroups; ++g) {
      for (int rank = 0; rank < 2; ++rank) {
        joins.emplace_back([&, g, rank] {
          grpc::ClientContext context;
          context.set_deadline(DeadlineAfter(kJoinTimeout));
          v1::LocalJoinRequest request;
          request.set_group(CallGroup(g));
          request.set_world_size(2);
          request.set_rank(rank);
          v1::LocalJoinResponse response;
          joined[2 * g + rank] = stub->JoinGroup(&context, request, &response);
          if (rank == 0) epochs[g] = response.epoch();
        });
      }
    }
    for (std::thread& join : joins) join.join();
    for (const grpc::Status& status : joined) {
      ASSERT_TRUE(status.ok()) << status.error_message();
    }
  }

  // Call #1 of both ranks warms the daemon's pools and connections.
  CallBurst burst(stub.get());
  for (int g = 0; g < kCallGroups; ++g) {
    burst.Start(CallGroup(g), epochs[g], 0, 1, 2);
    burst.Start(CallGroup(g), epochs[g], 1, 1, 2);
  }
  const int warm = 2 * kCallGroups;
  ASSERT_TRUE(burst.WaitEnded(warm, kJoinTimeout));
  ASSERT_TRUE(burst.first_error().ok()) << burst.first_error().error_message();
  ASSERT_TRUE(CallsReleased(*metered));
  const int threads_before = ThreadsOf(worker->process->pid());
  ASSERT_GT(threads_before, 0);
  const int64_t resident_before = ResidentKiB(worker->process->pid());
  RecordProperty("daemon_threads_before", threads_before);
  RecordProperty("daemon_rss_kib_before", static_cast<int>(resident_before));

  // Bursts: in each, rank 0 of every group calls its next numbers without
  // waiting, none of which rank 1 has called yet (each group stays within
  // the numbers a rank may have ahead); then rank 1 calls them.
  const int per_group = kPendingCalls / kCallGroups;
  int64_t resident_after[kBursts] = {};
  for (int round = 0; round < kBursts; ++round) {
    SCOPED_TRACE(absl::StrCat("burst ", round + 1));
    const int ended_before = burst.ended();
    const uint64_t first = 2 + static_cast<uint64_t>(round) * per_group;
    const int trims_before = MetricValue(metered->metrics_port, kBurstTrims);
    const int settled_before =
        MetricValue(metered->metrics_port, kSettledTrims);
    for (int i = 0; i < per_group; ++i) {
      for (int g = 0; g < kCallGroups; ++g) {
        burst.Start(CallGroup(g), epochs[g], 0, first + i, 2);
      }
    }
    ASSERT_TRUE(WaitUntil(
        [&] { return MatchingCollectives(metrics_port) == kPendingCalls; },
        kJoinTimeout))
        << MatchingCollectives(metrics_port) << " collectives matching of "
        << kPendingCalls << "; " << burst.ended() - ended_before
        << " ended: " << burst.first_error().error_message();
    const int threads_pending = ThreadsOf(worker->process->pid());
    RecordProperty(absl::StrCat("daemon_threads_pending_", round + 1),
                   threads_pending);
    EXPECT_LE(threads_pending, threads_before + kCallThreadSlack)
        << kPendingCalls << " pending collectives took "
        << threads_pending - threads_before << " threads";
    EXPECT_EQ(burst.ended(), ended_before)
        << "a collective ended before rank 1 called it: "
        << burst.first_error().error_message();

    // The ranks 1 come: every pending call completes with the sum of both.
    for (int i = 0; i < per_group; ++i) {
      for (int g = 0; g < kCallGroups; ++g) {
        burst.Start(CallGroup(g), epochs[g], 1, first + i, 2);
      }
    }
    ASSERT_TRUE(burst.WaitEnded(ended_before + 2 * kPendingCalls, kJoinTimeout))
        << burst.ended() << " calls ended";
    EXPECT_TRUE(burst.first_error().ok())
        << burst.first_error().error_message();
    EXPECT_EQ(MatchingCollectives(metrics_port), 0);
    ASSERT_TRUE(CallsReleased(*metered));
    // The burst's trims ran on the threads of its calls as it ended, and
    // once more after it.
    ASSERT_TRUE(BurstSettled(*metered, settled_before))
        << "the daemon did not trim its heap after burst " << round + 1;
    EXPECT_GE(MetricValue(metered->metrics_port, kBurstTrims),
              trims_before + 2);
    resident_after[round] = ResidentKiB(worker->process->pid());
    RecordProperty(absl::StrCat("daemon_rss_kib_after_", round + 1),
                   static_cast<int>(resident_after[round]));
  }
  // The daemon gave each burst's memory back once it was over.
  EXPECT_GE(MetricValue(metered->metrics_port, kSettledTrims), kBursts);
  ExpectMemoryFlat(resident_before, resident_after);
}

}  // namespace
}  // namespace chorus::test
