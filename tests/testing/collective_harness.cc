#include "tests/testing/collective_harness.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/coordinator/planner.h"

namespace chorus::test {

// ---------------------------------------------------------------------------
// EmbeddedCluster.

absl::StatusOr<std::unique_ptr<EmbeddedCluster>> EmbeddedCluster::Start(
    int workers, const std::vector<std::string>& coordinator_flags,
    CallRoute calls, const std::vector<Device>& devices,
    DeviceRuntime* device_runtime, bool check_results) {
  std::unique_ptr<EmbeddedCluster> cluster(new EmbeddedCluster());
  absl::StatusOr<Daemon> coordinator = StartCoordinator(coordinator_flags);
  if (!coordinator.ok()) return coordinator.status();
  cluster->coordinator_ = *std::move(coordinator);
  for (int i = 0; i < workers; ++i) {
    RuntimeOptions options;
    options.coordinator = cluster->coordinator_.address;
    options.listen = "127.0.0.1:0";
    options.name = absl::StrCat("embedded-", i);
    options.devices = devices;
    options.device_runtime = device_runtime;
    options.call_port = calls == CallRoute::kCallPort ||
                        (calls == CallRoute::kMixed && i % 2 == 0);
    // Every collective's result is checked at its commit, so the matrix
    // also shows that ranks with equal results always agree on the hash.
    options.check_results = check_results;
    options.register_timeout = kStartTimeout;
    LocalWorkerOptions worker;
    worker.runtime = std::move(options);
    absl::StatusOr<std::unique_ptr<LocalWorker>> started =
        LocalWorker::Start(std::move(worker));
    if (!started.ok()) {
      return absl::Status(started.status().code(),
                          absl::StrCat("starting embedded worker ", i, ": ",
                                       started.status().message()));
    }
    cluster->workers_.push_back(*std::move(started));
  }
  return cluster;
}

absl::Status EmbeddedCluster::SignalCoordinator(int sig) {
  return coordinator_.process->Signal(sig);
}

EmbeddedCluster::~EmbeddedCluster() {
  // Deregister while the coordinator still runs. All at once: a runtime's
  // server waits (up to its grace period) for the streams its still-running
  // peers hold open to it, so shutting them down one by one would wait that
  // long per runtime.
  RunOnRanks(workers(), [&](int i) { workers_[i]->Shutdown(); });
}

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>>
EmbeddedCluster::JoinGroup(const std::string& group,
                           const std::vector<int>& worker_of_rank,
                           const std::vector<Device>& devices) {
  const int world = static_cast<int>(worker_of_rank.size());
  std::vector<absl::StatusOr<std::unique_ptr<Communicator>>> joined;
  for (int rank = 0; rank < world; ++rank) {
    joined.emplace_back(absl::UnknownError("not run"));
  }
  RunOnRanks(world, [&](int rank) {
    JoinOptions options;
    options.timeout = kCallTimeout;
    if (rank < static_cast<int>(devices.size())) options.device = devices[rank];
    joined[rank] = Communicator::JoinEmbedded(
        workers_[worker_of_rank[rank]].get(), group, world, rank, options);
  });
  std::vector<std::unique_ptr<Communicator>> out;
  for (int rank = 0; rank < world; ++rank) {
    if (!joined[rank].ok()) {
      return absl::Status(joined[rank].status().code(),
                          absl::StrCat("rank ", rank, " joining ", group, ": ",
                                       joined[rank].status().message()));
    }
    out.push_back(*std::move(joined[rank]));
  }
  return out;
}

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>>
EmbeddedCluster::JoinGroup(const std::string& group, int world) {
  std::vector<int> workers(world);
  for (int rank = 0; rank < world; ++rank) workers[rank] = rank;
  return JoinGroup(group, workers);
}

std::vector<Communicator*> Pointers(
    const std::vector<std::unique_ptr<Communicator>>& communicators) {
  std::vector<Communicator*> out;
  for (const auto& c : communicators) out.push_back(c.get());
  return out;
}

Algorithm ExpectedPlan(const CollectiveCase& c, int world,
                       uint64_t inline_max_bytes,
                       uint64_t recursive_doubling_max_bytes, bool same_host,
                       bool host_memory, bool nccl) {
  PlannerOptions options;
  options.inline_max_bytes = inline_max_bytes;
  options.recursive_doubling_max_bytes = recursive_doubling_max_bytes;
  options.nccl = nccl;
  absl::StatusOr<Plan> plan = ChooseAlgorithm(
      c.spec, world, c.algorithm, options, same_host, host_memory, nccl);
  return plan.ok() ? plan->algorithm : Algorithm::kUnspecified;
}

::testing::AssertionResult RunAndCheck(const std::vector<Communicator*>& ranks,
                                       const CollectiveCase& c,
                                       const CheckOptions& check) {
  const int world = static_cast<int>(ranks.size());
  std::vector<std::string> inputs(world);
  for (int r = 0; r < world; ++r) inputs[r] = MakeInput(c, world, r);
  // Stale contents the collective must replace.
  std::vector<std::string> outputs(world, std::string("stale"));
  std::vector<absl::StatusOr<CallResult>> results(
      world, absl::UnknownError("not run"));
  RunOnRanks(
      world,
      [&](int r) {
        CallOptions options;
        options.algorithm = c.algorithm;
        options.timeout = kCallTimeout;
        if (r < static_cast<int>(check.devices.size())) {
          options.device = check.devices[r];
        }
        results[r] =
            check.run ? check.run(r, *ranks[r], c.spec, inputs[r], &outputs[r],
                                  options)
                      : ranks[r]->Run(c.spec, inputs[r], &outputs[r], options);
      },
      check.start_order);

  const std::string what = DescribeCase(c, world);
  // Every failed rank, not only the first: a rank that failed on its own
  // leaves the others waiting for it until their deadline.
  std::string failures;
  for (int r = 0; r < world; ++r) {
    if (!results[r].ok()) {
      absl::StrAppend(&failures, failures.empty() ? "" : "; ", "rank ", r,
                      " failed: ", results[r].status().ToString());
    }
  }
  if (!failures.empty()) {
    return ::testing::AssertionFailure() << what << ": " << failures;
  }
  Algorithm plan = ExpectedPlan(c, world, check.inline_max_bytes,
                                check.recursive_doubling_max_bytes,
                                check.same_host, check.host_memory, check.nccl);
  // Under leader calls, what the coordinator would run inline (and every
  // barrier) runs at the leader unless forced.
  if (check.leader_calls && c.algorithm == Algorithm::kUnspecified &&
      (plan == Algorithm::kInline || c.spec.kind == CollectiveKind::kBarrier) &&
      check.host_memory) {
    plan = Algorithm::kLeader;
  }
  for (int r = 0; r < world; ++r) {
    if (results[r]->sequence != results[0]->sequence) {
      return ::testing::AssertionFailure()
             << what << ": rank " << r << " ran #" << results[r]->sequence
             << ", rank 0 #" << results[0]->sequence;
    }
    if (check.check_plan && results[r]->algorithm != plan) {
      return ::testing::AssertionFailure()
             << what << ": rank " << r << " ran plan "
             << AlgorithmName(results[r]->algorithm) << "; expected "
             << AlgorithmName(plan);
    }
  }
  const std::vector<Expected> expected = Reference(c, world, inputs);
  for (int r = 0; r < world; ++r) {
    const uint64_t size = OutputBytes(c.spec, world, r);
    if (outputs[r].size() != size) {
      return ::testing::AssertionFailure()
             << what << ": rank " << r << " output has " << outputs[r].size()
             << " bytes; OutputBytes says " << size;
    }
    ::testing::AssertionResult match =
        MatchesExpected(c, expected[r], outputs[r]);
    if (!match) {
      return ::testing::AssertionFailure()
             << what << ": rank " << r << ": " << match.message();
    }
  }
  if (SameForEveryRank(c.spec.kind)) {
    for (int r = 1; r < world; ++r) {
      if (outputs[r] != outputs[0]) {
        return ::testing::AssertionFailure()
               << what << ": rank " << r
               << "'s output is not bit-identical to rank 0's";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace chorus::test
