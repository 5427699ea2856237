// The coordinator's event stream against real daemons on 127.0.0.1: a
// watcher subscribed before anything happens sees two workers register,
// their group form, a mismatch when the ranks call different collectives,
// and, when one worker daemon is killed (SIGKILL), that worker lost and its
// group aborted, in that order; `chorusctl watch --json --count=N`, run as
// a process, prints the same events and exits after N; and a stream ends
// with UNAVAILABLE when the coordinator shuts down.
#include <grpcpp/client_context.h>
#include <signal.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "common/net.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemons.h"
#include "tests/testing/failure_cluster.h"
#include "tests/testing/process.h"
#include "tests/testing/wait.h"

namespace chorus::test {
namespace {

using ::testing::HasSubstr;

// How long a test waits for an event or for chorusctl: far longer than
// any of them takes (the lost worker's events come a lease after the kill).
constexpr absl::Duration kEventTimeout = absl::Seconds(60);
// The deadline of the watchers' streams, so that a test that goes wrong
// ends before ctest's own timeout (180 s).
constexpr absl::Duration kStreamDeadline = absl::Seconds(150);

constexpr char kWorkerA[] = "watch-a";
constexpr char kWorkerB[] = "watch-b";
constexpr char kGroup[] = "watched";

// Reads a WatchEvents stream on a thread of its own and keeps its events.
class Watcher {
 public:
  // Returns once the coordinator has subscribed the watcher (it sent the
  // stream's initial metadata).
  explicit Watcher(const std::string& coordinator)
      : stub_(NewCoordinatorStub(coordinator)) {
    context_.set_deadline(DeadlineAfter(kStreamDeadline));
    reader_ = stub_->WatchEvents(&context_, v1::WatchEventsRequest());
    reader_->WaitForInitialMetadata();
    thread_ = std::thread([this] { Read(); });
  }

  ~Watcher() {
    context_.TryCancel();
    thread_.join();
  }

  // Waits up to kEventTimeout for the first event after the one at
  // `*position` (0: from the start) of `kind` for which `match` holds, and
  // returns it with `*position` just after it; nullopt if none came.
  std::optional<v1::Event> WaitFor(
      v1::EventKind kind, size_t* position,
      const std::function<bool(const v1::Event&)>& match) {
    // The condition may be evaluated again after it held: once it found
    // the event, it keeps saying so.
    size_t scanned = *position;
    std::optional<size_t> index;
    auto arrived = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (; !index.has_value() && scanned < events_.size(); ++scanned) {
        const v1::Event& event = events_[scanned];
        if (event.kind() == kind && match(event)) index = scanned;
      }
      return index.has_value() || ended_;
    };
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&arrived), kEventTimeout);
    if (!index.has_value()) return std::nullopt;
    *position = *index + 1;
    return events_[*index];
  }

  // Waits up to kEventTimeout for the stream to end and returns its status;
  // nullopt if it did not end.
  std::optional<grpc::Status> WaitForEnd() {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&ended_), kEventTimeout);
    return end_;
  }

  // Every event so far, as text, for failure messages.
  std::string Describe() {
    absl::MutexLock lock(&mu_);
    std::string out;
    for (const v1::Event& event : events_) {
      absl::StrAppend(&out, v1::EventKind_Name(event.kind()), ": ",
                      event.text(), "\n");
    }
    return out;
  }

 private:
  void Read() {
    v1::Event event;
    while (reader_->Read(&event)) {
      absl::MutexLock lock(&mu_);
      events_.push_back(event);
    }
    const grpc::Status status = reader_->Finish();
    absl::MutexLock lock(&mu_);
    end_ = status;
    ended_ = true;
  }

  std::unique_ptr<v1::Coordinator::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<v1::Event>> reader_;
  std::thread thread_;

  absl::Mutex mu_;
  std::vector<v1::Event> events_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> end_ ABSL_GUARDED_BY(mu_);
};

auto Named(const std::string& name) {
  return [name](const v1::Event& e) { return e.worker_name() == name; };
}
auto OfGroup(const std::string& group) {
  return [group](const v1::Event& e) { return e.group() == group; };
}

// What the tests make happen, with the watcher already subscribed: workers
// A and B start, join kGroup (rank 0 on A, rank 1 on B), call collectives
// of different sizes (a mismatch), and B's daemon is killed.
void LiveAndLoseAGroup(FailureCluster& cluster) {
  ASSERT_TRUE(cluster.AddWorker(kWorkerA).ok());
  ASSERT_TRUE(cluster.AddWorker(kWorkerB).ok());
  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> ranks =
      cluster.Join(kGroup, {0, 1});
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  {
    BackgroundCall sixteen((*ranks)[0].get(), AllReduceU32(16),
                           RankInputU32(0, 16), FailureCallOptions());
    BackgroundCall eight((*ranks)[1].get(), AllReduceU32(8), RankInputU32(1, 8),
                         FailureCallOptions());
    ASSERT_TRUE(sixteen.WaitFor(kEventTimeout));
    ASSERT_TRUE(eight.WaitFor(kEventTimeout));
    EXPECT_TRUE(absl::IsInvalidArgument(sixteen.status())) << sixteen.status();
    EXPECT_TRUE(absl::IsInvalidArgument(eight.status())) << eight.status();
  }
  ASSERT_TRUE(cluster.worker(1).process->Kill().ok());
}

std::vector<std::string> LeaseFlags() {
  return {absl::StrCat("--lease_timeout=", absl::ToInt64Seconds(kFailureLease),
                       "s")};
}

TEST(WatchEventsTest, WatchEvents_GroupLivesAndLosesAWorker_EventsInOrder) {
  absl::StatusOr<std::unique_ptr<FailureCluster>> cluster =
      FailureCluster::Start(LeaseFlags(), {});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Watcher watcher((*cluster)->coordinator_address());
  LiveAndLoseAGroup(**cluster);
  if (HasFatalFailure()) return;

  size_t at = 0;
  std::optional<v1::Event> a =
      watcher.WaitFor(v1::EVENT_KIND_WORKER_REGISTERED, &at, Named(kWorkerA));
  ASSERT_TRUE(a.has_value()) << watcher.Describe();
  std::optional<v1::Event> b =
      watcher.WaitFor(v1::EVENT_KIND_WORKER_REGISTERED, &at, Named(kWorkerB));
  ASSERT_TRUE(b.has_value()) << watcher.Describe();
  EXPECT_NE(a->worker_id(), b->worker_id());
  EXPECT_GT(b->time_ns(), 0);

  std::optional<v1::Event> formed =
      watcher.WaitFor(v1::EVENT_KIND_GROUP_FORMED, &at, OfGroup(kGroup));
  ASSERT_TRUE(formed.has_value()) << watcher.Describe();
  EXPECT_GT(formed->epoch(), 0u);

  std::optional<v1::Event> mismatch =
      watcher.WaitFor(v1::EVENT_KIND_MISMATCH, &at, OfGroup(kGroup));
  ASSERT_TRUE(mismatch.has_value()) << watcher.Describe();
  EXPECT_EQ(mismatch->epoch(), formed->epoch());
  EXPECT_EQ(mismatch->sequence(), 1u);
  EXPECT_EQ(mismatch->code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(mismatch->ranks(), ::testing::ElementsAre(1));
  EXPECT_THAT(mismatch->text(), HasSubstr("does not match across ranks"));

  std::optional<v1::Event> lost =
      watcher.WaitFor(v1::EVENT_KIND_WORKER_LOST, &at, Named(kWorkerB));
  ASSERT_TRUE(lost.has_value()) << watcher.Describe();
  EXPECT_EQ(lost->worker_id(), b->worker_id());
  EXPECT_EQ(lost->reason(), "evicted");

  std::optional<v1::Event> aborted =
      watcher.WaitFor(v1::EVENT_KIND_GROUP_ABORTED, &at, OfGroup(kGroup));
  ASSERT_TRUE(aborted.has_value()) << watcher.Describe();
  EXPECT_EQ(aborted->epoch(), formed->epoch());
  EXPECT_EQ(aborted->worker_name(), kWorkerB);
  EXPECT_THAT(aborted->ranks(), ::testing::ElementsAre(1));
  EXPECT_EQ(aborted->code(), static_cast<int>(absl::StatusCode::kAborted));
  EXPECT_THAT(aborted->message(), HasSubstr("no heartbeat within the lease"));
}

TEST(WatchEventsTest, ChorusctlWatch_JsonCount_PrintsEventsAndExits) {
  absl::StatusOr<std::unique_ptr<FailureCluster>> cluster =
      FailureCluster::Start(LeaseFlags(), {});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  SubprocessOptions options;
  options.binary = ChorusctlBinary();
  // Two workers registered, the group formed, the mismatch, the worker lost
  // and the group aborted.
  options.args = {
      absl::StrCat("--coordinator=", (*cluster)->coordinator_address()),
      "--json", "--count=6", "watch"};
  options.stdout_path = NewScratchPath("chorusctl-watch", ".out");
  options.stderr_path = NewScratchPath("chorusctl-watch", ".err");
  absl::StatusOr<std::unique_ptr<Subprocess>> chorusctl =
      Subprocess::Start(options);
  ASSERT_TRUE(chorusctl.ok()) << chorusctl.status();
  // It says so on stderr once the coordinator subscribed it.
  ASSERT_TRUE(WaitUntil(
      [&] {
        return absl::StrContains((*chorusctl)->ReadStderr(), "watching") ||
               !(*chorusctl)->IsRunning();
      },
      kEventTimeout));
  ASSERT_TRUE((*chorusctl)->IsRunning()) << (*chorusctl)->ReadStderr();

  LiveAndLoseAGroup(**cluster);
  if (HasFatalFailure()) return;
  absl::StatusOr<int> exit_code = (*chorusctl)->WaitForExit(kEventTimeout);
  ASSERT_TRUE(exit_code.ok()) << exit_code.status() << "\n"
                              << (*chorusctl)->ReadLog();
  EXPECT_EQ(*exit_code, 0) << (*chorusctl)->ReadStderr();

  const std::string out = (*chorusctl)->ReadLog();
  std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 6u) << out;
  for (const std::string& line : lines) {
    EXPECT_TRUE(absl::StartsWith(line, "{\"time_ns\": ") &&
                absl::EndsWith(line, "}"))
        << line;
  }
  const std::vector<std::string> expected = {
      "\"kind\": \"WORKER_REGISTERED\", \"worker_id\": 1, "
      "\"worker_name\": \"watch-a\"",
      "\"kind\": \"WORKER_REGISTERED\", \"worker_id\": 2, "
      "\"worker_name\": \"watch-b\"",
      "\"kind\": \"GROUP_FORMED\"",
      "\"kind\": \"MISMATCH\"",
      "\"kind\": \"WORKER_LOST\", \"worker_id\": 2, "
      "\"worker_name\": \"watch-b\"",
      "\"kind\": \"GROUP_ABORTED\"",
  };
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_THAT(lines[i], HasSubstr(expected[i])) << "line " << i;
  }
  EXPECT_THAT(lines[2], HasSubstr("\"group\": \"watched\""));
  EXPECT_THAT(lines[3], HasSubstr("\"code\": \"INVALID_ARGUMENT\""));
  EXPECT_THAT(lines[4], HasSubstr("\"reason\": \"evicted\""));
  EXPECT_THAT(lines[5], HasSubstr("\"code\": \"ABORTED\""));
}

TEST(WatchEventsTest, WatchEvents_CoordinatorShutsDown_EndsUnavailable) {
  absl::StatusOr<std::unique_ptr<FailureCluster>> cluster =
      FailureCluster::Start(LeaseFlags(), {});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Watcher watcher((*cluster)->coordinator_address());
  ASSERT_TRUE((*cluster)->coordinator().process->Signal(SIGTERM).ok());
  const std::optional<grpc::Status> end = watcher.WaitForEnd();
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->error_code(), grpc::StatusCode::UNAVAILABLE)
      << end->error_message();
  EXPECT_THAT(end->error_message(), HasSubstr("shutting down"));
  absl::StatusOr<int> exit_code =
      (*cluster)->coordinator().process->WaitForExit(kEventTimeout);
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0);
}

}  // namespace
}  // namespace chorus::test
