// Helpers for the failure tests: a real chorus-coordinator and chorus-worker
// daemons on 127.0.0.1, whose ranks are driven by in-test clients through
// Communicator::JoinThroughDaemon, so that killing, stopping or signalling a
// daemon process kills, stops or shuts down its rank. Collectives run on
// background threads that record when they ended, so a test can assert an
// upper bound on how long each rank took to get its verdict, and a hang shows
// up as a call still running at that bound rather than as a pass.
//
// Lifecycle: a FailureCluster owns its daemon processes (killed when it is
// destroyed). Destroy BackgroundCalls before the communicators they use, and
// those before the cluster.
// Thread safety: FailureCluster is for the test's main thread. BackgroundCall
// methods may be called from any thread. The free functions are thread-safe.
#ifndef CHORUS_TESTS_TESTING_FAILURE_CLUSTER_H_
#define CHORUS_TESTS_TESTING_FAILURE_CLUSTER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "chorus/communicator.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "common/collective.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemons.h"

namespace chorus::test {

// The lease the failure tests give the coordinator (--lease_timeout).
inline constexpr absl::Duration kFailureLease = absl::Seconds(2);
// Deadline of every join and collective a failure test issues: far longer
// than any bound a test asserts, so that a rank that hangs is seen as a call
// still running at the bound (or ending with the client's own
// DEADLINE_EXCEEDED), never as a pass.
inline constexpr absl::Duration kFailureCallTimeout = absl::Seconds(60);
// Added to every time bound the tests assert. The design's bound for a lost
// worker is the lease plus one second; on top of it a verdict crosses three
// processes (coordinator -> worker daemon -> test client), each of which
// may wait a scheduler slice or two while ctest runs two test programs with
// four or five daemons each on two cores. One second covers that with a wide
// margin: on such a machine, also with two CPU-bound processes running
// alongside, a killed or stopped worker's peers got their verdict 1.97 s to
// 2.3 s after the kill with a 2 s lease, against the bound of 4 s.
inline constexpr absl::Duration kSchedulingSlack = absl::Seconds(1);
// The bound on the verdict for a lost (killed or stopped) worker, from the
// moment it was lost: lease + 1 s + kSchedulingSlack.
inline const absl::Duration kLostWorkerBound =
    kFailureLease + absl::Seconds(1) + kSchedulingSlack;

// A coordinator and named worker daemons (each registering the CPU only).
class FailureCluster {
 public:
  // Starts chorus-coordinator with `coordinator_flags` (e.g.
  // "--lease_timeout=2s") and one chorus-worker per name in `worker_names`.
  // Returns the harness's start errors.
  static absl::StatusOr<std::unique_ptr<FailureCluster>> Start(
      const std::vector<std::string>& coordinator_flags,
      const std::vector<std::string>& worker_names);

  FailureCluster(const FailureCluster&) = delete;
  FailureCluster& operator=(const FailureCluster&) = delete;

  const std::string& coordinator_address() const {
    return coordinator_.address;
  }
  Daemon& coordinator() { return coordinator_; }
  // A stub for the coordinator (shared; thread-safe).
  v1::Coordinator::Stub& stub() { return *stub_; }

  // Starts another worker daemon named `name` with `extra_flags`; returns
  // its index. Errors as StartWorker.
  absl::StatusOr<int> AddWorker(
      const std::string& name,
      const std::vector<std::string>& extra_flags = {});
  int workers() const { return static_cast<int>(workers_.size()); }
  Daemon& worker(int i) { return workers_[i]; }
  const std::string& worker_name(int i) const { return names_[i]; }

  // Starts a new coordinator on the port of the current one, which must
  // have exited, with the flags the cluster was started with. Errors as
  // StartCoordinator.
  absl::Status RestartCoordinator();

  // Joins `group` of world size worker_of_rank.size(): rank r joins through
  // the daemon of worker worker_of_rank[r], each rank from its own thread
  // (an elastic group with min_world_size > 0). Returns the communicators
  // by rank, or the first failed rank's status.
  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> Join(
      const std::string& group, const std::vector<int>& worker_of_rank,
      int min_world_size = 0);

  // Returns the coordinator's view of `group` (ListGroups), NOT_FOUND when
  // it lists no such group, or the call's status.
  absl::StatusOr<v1::GroupInfo> Group(const std::string& group);

  // Waits up to `timeout` until `group`'s oldest pending collective is
  // `sequence` and exactly the ranks `missing` have not called it (so the
  // others wait in matching). Returns whether that happened.
  bool WaitForPending(const std::string& group, uint64_t sequence,
                      const std::vector<int>& missing,
                      absl::Duration timeout = absl::Seconds(30));

  // Waits up to `timeout` until ListWorkers names exactly `names` (sorted).
  bool WaitForWorkers(std::vector<std::string> names,
                      absl::Duration timeout = absl::Seconds(30));

 private:
  FailureCluster() = default;

  std::vector<std::string> coordinator_flags_;
  Daemon coordinator_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::vector<Daemon> workers_;
  std::vector<std::string> names_;
};

// One collective run by one rank on a thread of its own.
class BackgroundCall {
 public:
  // Starts communicator->Run(spec, input, &output, options) on a new thread.
  // `communicator` is not owned and must outlive this object.
  BackgroundCall(Communicator* communicator, const CollectiveSpec& spec,
                 std::string input, const CallOptions& options = {});
  // Waits for the call to end (at the latest at its own deadline).
  ~BackgroundCall();

  BackgroundCall(const BackgroundCall&) = delete;
  BackgroundCall& operator=(const BackgroundCall&) = delete;

  // Waits up to `timeout` for the call to end; returns whether it ended.
  bool WaitFor(absl::Duration timeout);
  // Waits until `deadline` for the call to end; returns whether it ended.
  bool WaitUntilTime(absl::Time deadline);
  bool done() const { return done_.HasBeenNotified(); }

  // Valid once done(): the call's result, its output and when it ended.
  const absl::StatusOr<CallResult>& result() const { return result_; }
  absl::Status status() const { return result_.status(); }
  const std::string& output() const { return output_; }
  absl::Time ended_at() const { return ended_at_; }
  absl::Time started_at() const { return started_at_; }

 private:
  const absl::Time started_at_;
  std::string input_;
  std::string output_;
  absl::StatusOr<CallResult> result_ = absl::UnknownError("not run");
  absl::Time ended_at_;
  absl::Notification done_;
  std::thread thread_;
};

// An all_reduce of `count` u32 elements with op sum.
CollectiveSpec AllReduceU32(uint64_t count);

// Rank `rank`'s input for AllReduceU32(count): element i is
// (rank + 1) * 1000003 + i, wrapping.
std::string RankInputU32(int rank, uint64_t count);

// The sum over ranks 0 .. world-1 of RankInputU32(rank, count).
std::string SumOfInputsU32(int world, uint64_t count);

// Options for a call: forced `algorithm` and kFailureCallTimeout.
CallOptions FailureCallOptions(Algorithm algorithm = Algorithm::kUnspecified);

// Runs AllReduceU32(count) (plan forced to `algorithm`) on every
// communicator, one thread each, and checks that every rank got OK and the
// sum of all inputs.
::testing::AssertionResult AllReduceWorks(
    const std::vector<std::unique_ptr<Communicator>>& ranks, uint64_t count,
    Algorithm algorithm = Algorithm::kUnspecified);

// Returns how many bytes the TCP connections that process `pid` opened to
// 127.0.0.1:`port` have delivered (the kernel's tcpi_bytes_acked, summed
// over them; 0 while there is none), read through the sock_diag netlink
// interface. Returns nullopt where that interface or /proc/<pid>/fd cannot
// be read.
std::optional<uint64_t> BytesDeliveredTo(pid_t pid, int port);

// Returns the port of the TCP data plane of the worker whose gRPC port is
// `port` on 127.0.0.1 (asked through Peer.DataPlane), or `port` itself when
// it takes data only through gRPC or cannot be asked.
int DataPlanePort(int port);

// Waits (polling every millisecond) until the process has delivered at least
// `bytes` to the worker whose gRPC port is `port`, on its gRPC and TCP data
// plane ports together: for example until a worker's ring has sent that
// much to its successor. Returns OK then; FAILED_PRECONDITION naming the call
// when one of `calls` ended first; UNAVAILABLE when the statistics cannot be
// read; DEADLINE_EXCEEDED after `timeout`.
absl::Status WaitForBytesDelivered(
    pid_t pid, int port, uint64_t bytes,
    const std::vector<std::unique_ptr<BackgroundCall>>& calls,
    absl::Duration timeout = absl::Seconds(60));

namespace failure_internal {
inline absl::Status ToStatus(const absl::Status& status) { return status; }
template <typename T>
absl::Status ToStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}
}  // namespace failure_internal

// Matches an absl::Status (or the status of an absl::StatusOr) whose code is
// `code` and whose message matches `message_matcher`.
MATCHER_P2(StatusIs, code, message_matcher,
           absl::StrCat("has code ", absl::StatusCodeToString(code),
                        " and a message that ",
                        ::testing::DescribeMatcher<std::string>(message_matcher,
                                                                negation))) {
  const absl::Status status = ::chorus::test::failure_internal::ToStatus(arg);
  if (status.code() != code) {
    *result_listener << "whose status is " << status;
    return false;
  }
  return ::testing::ExplainMatchResult(
      message_matcher, std::string(status.message()), result_listener);
}

}  // namespace chorus::test

#endif  // CHORUS_TESTS_TESTING_FAILURE_CLUSTER_H_
