// Helpers for the collective integration tests: a real chorus-coordinator
// process with WorkerRuntime instances embedded in the test process, groups
// joined from one thread per rank, and the checks that compare each rank's
// output with the reference (collective_reference.h) and with the other
// ranks'.
//
// Lifecycle: an EmbeddedCluster owns its coordinator process and runtimes;
// destroy the communicators joined through it first.
// Thread safety: EmbeddedCluster::Start and JoinGroup are for the test's main
// thread; the runtimes and communicators are thread-safe. The value and
// reference helpers are pure functions.
#ifndef CHORUS_TESTS_TESTING_COLLECTIVE_HARNESS_H_
#define CHORUS_TESTS_TESTING_COLLECTIVE_HARNESS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "chorus/communicator.h"
#include "common/collective.h"
#include "gtest/gtest.h"
#include "server/worker/local/local_worker.h"
#include "server/worker/worker_runtime.h"
#include "tests/testing/collective_reference.h"
#include "tests/testing/daemons.h"

namespace chorus::test {

// Deadline of every join and collective the tests issue: generous, since a
// loaded two-core machine runs several test processes at once. A failing
// call normally answers long before it.
inline constexpr absl::Duration kCallTimeout = absl::Seconds(120);

// The planner's defaults (coordinator flags --inline_max_bytes and
// --recursive_doubling_max_bytes); the automatic plan is predicted with the
// planner itself (ChooseAlgorithm), so a plan the coordinator chose but the
// workers did not run shows up.
inline constexpr uint64_t kDefaultInlineMaxBytes = 128 << 10;

// GPU `index`, Cuda(index), as a JoinOptions or CallOptions names it.
inline Device Gpu(int index) {
  Device d;
  d.kind = DeviceKind::kCuda;
  d.index = index;
  return d;
}
inline constexpr uint64_t kDefaultRecursiveDoublingMaxBytes = 512 << 10;

// A coordinator process and `workers` WorkerRuntime instances in this
// process, each registered under the name "embedded-<i>", serving its
// data plane on 127.0.0.1:0, with RuntimeOptions::check_results on unless
// told otherwise.
class EmbeddedCluster {
 public:
  // How each runtime sends its collective calls, commits and failure
  // reports to the coordinator: on its call port, or as unary gRPC calls.
  enum class CallRoute { kCallPort, kGrpc, kMixed /* even workers: port */ };

  // Starts the coordinator (with `coordinator_flags` added, e.g.
  // "--chunk_bytes=1000") and the runtimes, each registering `devices`
  // (the CPU alone unless told; GPU tests add Cuda(0)), their GPUs from
  // `device_runtime` (not owned; null: this build's, else e.g. an
  // EmulatedDeviceRuntime, shared by every runtime). Returns the harness's
  // errors, or a runtime's own (e.g. UNIMPLEMENTED for a device this
  // machine lacks).
  static absl::StatusOr<std::unique_ptr<EmbeddedCluster>> Start(
      int workers, const std::vector<std::string>& coordinator_flags = {},
      CallRoute calls = CallRoute::kCallPort,
      const std::vector<Device>& devices = {JoinOptions::CpuDevice()},
      DeviceRuntime* device_runtime = nullptr, bool check_results = true);

  ~EmbeddedCluster();

  // Sends the coordinator process `sig` (e.g. SIGSTOP, SIGCONT). Returns
  // Subprocess::Signal's errors.
  absl::Status SignalCoordinator(int sig);

  const std::string& coordinator_address() const {
    return coordinator_.address;
  }
  int workers() const { return static_cast<int>(workers_.size()); }
  LocalWorker* worker(int i) const { return workers_[i].get(); }
  WorkerRuntime* runtime(int i) const { return &workers_[i]->runtime(); }

  // Joins `group` with world size worker_of_rank.size(): rank r joins from
  // its own thread through runtime(worker_of_rank[r]). Returns the
  // communicators by rank, or the first rank's error.
  // Rank r joins on `devices`[r] where given (JoinOptions::device).
  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> JoinGroup(
      const std::string& group, const std::vector<int>& worker_of_rank,
      const std::vector<Device>& devices = {});

  // JoinGroup with rank r on runtime r, for ranks 0 .. world-1.
  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> JoinGroup(
      const std::string& group, int world);

 private:
  EmbeddedCluster() = default;

  Daemon coordinator_;
  std::vector<std::unique_ptr<LocalWorker>> workers_;
};

// Returns the communicators' raw pointers, by rank.
std::vector<Communicator*> Pointers(
    const std::vector<std::unique_ptr<Communicator>>& communicators);

// The plan the coordinator's defaults choose for `c` under forced algorithm
// c.algorithm in a group of `world` (whose workers all run on this host
// unless `same_host` is false, and whose ranks all call on host memory
// unless `host_memory` is false), with --nccl_plan for a group whose ranks
// are on their own GPUs when `nccl`.
Algorithm ExpectedPlan(
    const CollectiveCase& c, int world,
    uint64_t inline_max_bytes = kDefaultInlineMaxBytes,
    uint64_t recursive_doubling_max_bytes = kDefaultRecursiveDoublingMaxBytes,
    bool same_host = true, bool host_memory = true, bool nccl = false);

// What RunAndCheck checks besides the outputs.
struct CheckOptions {
  // Check each rank's plan against ExpectedPlan() with these limits (the
  // coordinator's flags).
  bool check_plan = true;
  uint64_t inline_max_bytes = kDefaultInlineMaxBytes;
  uint64_t recursive_doubling_max_bytes = kDefaultRecursiveDoublingMaxBytes;
  // The coordinator plans same_host for this group (its workers share this
  // host and --same_host_plan is on).
  bool same_host = true;
  // Every rank's call is on host memory; false when one is on a GPU (the
  // group then uses the data plane where it would use same_host).
  bool host_memory = true;
  // The coordinator plans nccl for this group (--nccl_plan, every rank on
  // its own GPU of a worker with NCCL).
  bool nccl = false;
  // The coordinator runs with --leader_calls (a group that is not elastic).
  bool leader_calls = false;
  // Order the rank threads start in (a permutation); empty: ascending.
  std::vector<int> start_order;
  // Per rank: the device its call names (CallOptions.device); ranks beyond
  // the vector's end, or unset, use their member's device.
  std::vector<std::optional<Device>> devices;
  // Runs one rank's call instead of Communicator::Run (e.g. through
  // RunOnDevice on GPU memory); unset: Run.
  std::function<absl::StatusOr<CallResult>(
      int rank, Communicator& communicator, const CollectiveSpec& spec,
      const std::string& input, std::string* output,
      const CallOptions& options)>
      run;
};

// Runs `c` on every rank of `ranks` (one thread per rank), then checks:
// every call OK with the same sequence and the expected plan, every output
// as Reference() says and sized as OutputBytes() says, and the outputs of
// kinds that give every rank the same result bit-identical across ranks.
::testing::AssertionResult RunAndCheck(const std::vector<Communicator*>& ranks,
                                       const CollectiveCase& c,
                                       const CheckOptions& options = {});

}  // namespace chorus::test

#endif  // CHORUS_TESTS_TESTING_COLLECTIVE_HARNESS_H_
