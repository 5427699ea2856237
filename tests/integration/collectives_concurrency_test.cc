// Collectives under concurrency: two groups issuing calls at the same time
// on the same workers, ranks arriving in shuffled orders, RunAsync issuing
// several collectives back to back before waiting, a thousand small
// all-reduces in a row (then the coordinator's account of the group), and
// several ranks of one group on one worker. A real coordinator process and
// worker runtimes embedded in the test.

#include <dirent.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "chorus/admin_client.h"
#include "gtest/gtest.h"
#include "tests/testing/collective_harness.h"
#include "tests/testing/process.h"

namespace chorus::test {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

std::unique_ptr<EmbeddedCluster> StartCluster(int workers) {
  absl::StatusOr<std::unique_ptr<EmbeddedCluster>> cluster =
      EmbeddedCluster::Start(workers);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? *std::move(cluster) : nullptr;
}

// The outputs and statuses of a sequence of cases run by every rank.
struct SequenceRun {
  // [case][rank]
  std::vector<std::vector<std::string>> inputs;
  std::vector<std::vector<std::string>> outputs;
  std::vector<std::vector<absl::StatusOr<CallResult>>> results;
};

SequenceRun PrepareRun(const std::vector<CollectiveCase>& cases, int world) {
  SequenceRun run;
  run.inputs.resize(cases.size());
  run.outputs.assign(cases.size(), std::vector<std::string>(world));
  run.results.resize(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    for (int r = 0; r < world; ++r) {
      run.inputs[i].push_back(MakeInput(cases[i], world, r));
      run.results[i].emplace_back(absl::UnknownError("not run"));
    }
  }
  return run;
}

// Checks every case of `run` against the reference.
void ExpectRunMatches(const std::vector<CollectiveCase>& cases,
                      const SequenceRun& run, int world) {
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string what = DescribeCase(cases[i], world);
    const std::vector<Expected> expected =
        Reference(cases[i], world, run.inputs[i]);
    for (int r = 0; r < world; ++r) {
      ASSERT_TRUE(run.results[i][r].ok())
          << what << ": rank " << r << ": " << run.results[i][r].status();
      EXPECT_EQ(run.results[i][r]->algorithm, ExpectedPlan(cases[i], world))
          << what;
      EXPECT_TRUE(MatchesExpected(cases[i], expected[r], run.outputs[i][r]))
          << what << ": rank " << r;
    }
  }
}

CallOptions Options(const CollectiveCase& c) {
  CallOptions options;
  options.algorithm = c.algorithm;
  options.timeout = kCallTimeout;
  return options;
}

// A mix of kinds, plans and sizes, different for each `salt`.
std::vector<CollectiveCase> MixedCases(int n, uint64_t salt) {
  const std::vector<CollectiveKind> kinds = AllKinds();
  std::vector<CollectiveCase> cases;
  for (int i = 0; i < n; ++i) {
    const CollectiveKind kind = kinds[(i + salt) % kinds.size()];
    const std::vector<Algorithm> plans = PlansFor(kind);
    CollectiveCase c;
    const DType dtype = AllDTypes()[(i * 3 + salt) % AllDTypes().size()];
    const ReduceOp op = AllReduceOps()[(i + salt) % AllReduceOps().size()];
    // Counts differ between salts, so crossed messages would not fit.
    c.spec = Spec(kind, dtype, 100 + 37 * i + 1000 * salt, op,
                  static_cast<int>(i % 2));
    c.algorithm = plans[(i / kinds.size() + salt) % plans.size()];
    c.seed = salt * 1000 + i;
    cases.push_back(c);
  }
  return cases;
}

TEST(ConcurrencyTest, Run_TwoGroupsInterleavedOnSameWorkers_BothCorrect) {
  constexpr int kWorld = 4;
  std::unique_ptr<EmbeddedCluster> cluster = StartCluster(kWorld);
  ASSERT_NE(cluster, nullptr);
  // Group a: rank r on worker r. Group b: rank r on worker (r + 1) % 4, so
  // each worker serves a different rank of each group.
  std::vector<std::unique_ptr<Communicator>> a, b;
  std::vector<int> b_workers(kWorld);
  for (int r = 0; r < kWorld; ++r) b_workers[r] = (r + 1) % kWorld;
  absl::Status joined;
  RunOnRanks(2, [&](int which) {
    auto group = which == 0 ? cluster->JoinGroup("a", kWorld)
                            : cluster->JoinGroup("b", b_workers);
    if (!group.ok()) {
      ADD_FAILURE() << group.status();
      return;
    }
    (which == 0 ? a : b) = *std::move(group);
  });
  ASSERT_EQ(a.size(), kWorld);
  ASSERT_EQ(b.size(), kWorld);

  const std::vector<CollectiveCase> a_cases = MixedCases(30, 1);
  const std::vector<CollectiveCase> b_cases = MixedCases(30, 2);
  SequenceRun a_run = PrepareRun(a_cases, kWorld);
  SequenceRun b_run = PrepareRun(b_cases, kWorld);
  // Eight threads: every rank of both groups issues its calls at once.
  RunOnRanks(2 * kWorld, [&](int t) {
    const int r = t % kWorld;
    const bool in_a = t < kWorld;
    const std::vector<CollectiveCase>& cases = in_a ? a_cases : b_cases;
    SequenceRun& run = in_a ? a_run : b_run;
    Communicator* comm = (in_a ? a : b)[r].get();
    for (size_t i = 0; i < cases.size(); ++i) {
      run.results[i][r] = comm->Run(cases[i].spec, run.inputs[i][r],
                                    &run.outputs[i][r], Options(cases[i]));
    }
  });
  ExpectRunMatches(a_cases, a_run, kWorld);
  ExpectRunMatches(b_cases, b_run, kWorld);
}

TEST(ConcurrencyTest, Run_RanksArriveInShuffledOrder_Correct) {
  constexpr int kWorld = 5;
  std::unique_ptr<EmbeddedCluster> cluster = StartCluster(kWorld);
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("shuffled", kWorld);
  ASSERT_TRUE(group.ok()) << group.status();
  std::mt19937 random(20261130);
  std::vector<int> order(kWorld);
  std::iota(order.begin(), order.end(), 0);
  for (const CollectiveCase& c : MixedCases(40, 3)) {
    std::shuffle(order.begin(), order.end(), random);
    CheckOptions check;
    check.start_order = order;
    ASSERT_TRUE(RunAndCheck(Pointers(*group), c, check));
  }
}

TEST(ConcurrencyTest, RunAsync_OneInFlightAtATime_AllCorrect) {
  constexpr int kWorld = 4;
  std::unique_ptr<EmbeddedCluster> cluster = StartCluster(kWorld);
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("async", kWorld);
  ASSERT_TRUE(group.ok()) << group.status();

  const std::vector<CollectiveCase> cases = MixedCases(18, 4);
  SequenceRun run = PrepareRun(cases, kWorld);
  RunOnRanks(kWorld, [&](int r) {
    for (size_t i = 0; i < cases.size(); ++i) {
      CollectiveHandle handle =
          (*group)[r]->RunAsync(cases[i].spec, run.inputs[i][r],
                                &run.outputs[i][r], Options(cases[i]));
      run.results[i][r] = handle.Wait();
    }
  });
  ExpectRunMatches(cases, run, kWorld);
}

TEST(ConcurrencyTest, Destroy_AsyncCallInFlight_WaitsForIt) {
  constexpr int kWorld = 3;
  std::unique_ptr<EmbeddedCluster> cluster = StartCluster(kWorld);
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("destroy", kWorld);
  ASSERT_TRUE(group.ok()) << group.status();

  const std::vector<CollectiveCase> cases = MixedCases(1, 6);
  SequenceRun run = PrepareRun(cases, kWorld);
  std::vector<std::string> at_destruction(kWorld);
  RunOnRanks(kWorld, [&](int r) {
    CollectiveHandle handle = (*group)[r]->RunAsync(
        cases[0].spec, run.inputs[0][r], &run.outputs[0][r], Options(cases[0]));
    // The destructor waits for the call, so its output is complete once the
    // destructor returns (the handle itself may turn ready a moment later).
    (*group)[r].reset();
    at_destruction[r] = run.outputs[0][r];
    run.results[0][r] = handle.Wait();
  });
  ExpectRunMatches(cases, run, kWorld);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(at_destruction[r], run.outputs[0][r]) << "rank " << r;
  }
}

// Calls issued back to back race to the coordinator (each RunAsync sends
// from its own thread); it must match them by sequence whatever order they
// arrive in.
TEST(ConcurrencyTest, RunAsync_SeveralBackToBack_AllCorrect) {
  constexpr int kWorld = 4;
  std::unique_ptr<EmbeddedCluster> cluster = StartCluster(kWorld);
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("async", kWorld);
  ASSERT_TRUE(group.ok()) << group.status();

  const std::vector<CollectiveCase> cases = MixedCases(18, 4);
  SequenceRun run = PrepareRun(cases, kWorld);
  RunOnRanks(kWorld, [&](int r) {
    std::vector<CollectiveHandle> handles;
    for (size_t i = 0; i < cases.size(); ++i) {
      handles.push_back((*group)[r]->RunAsync(cases[i].spec, run.inputs[i][r],
                                              &run.outputs[i][r],
                                              Options(cases[i])));
    }
    // Odd ranks wait newest first.
    for (size_t k = 0; k < handles.size(); ++k) {
      const size_t i = r % 2 == 0 ? k : handles.size() - 1 - k;
      run.results[i][r] = handles[i].Wait();
    }
  });
  ExpectRunMatches(cases, run, kWorld);
  // The calls were numbered in the order they were issued.
  for (size_t i = 0; i < cases.size(); ++i) {
    for (int r = 0; r < kWorld; ++r) {
      if (run.results[i][r].ok()) {
        EXPECT_EQ(run.results[i][r]->sequence, i + 1);
      }
    }
  }
}

TEST(ConcurrencyTest, RunAsync_SixtyFourSmallInFlight_AllCorrectInOrder) {
  constexpr int kWorld = 4;
  constexpr int kCalls = 64;
  std::unique_ptr<EmbeddedCluster> cluster = StartCluster(kWorld);
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("many-async", kWorld);
  ASSERT_TRUE(group.ok()) << group.status();

  std::vector<CollectiveCase> cases;
  for (int i = 0; i < kCalls; ++i) {
    CollectiveCase c;
    // Counts grow with i, so a result matched to the wrong call would not
    // even have the right size.
    c.spec =
        Spec(CollectiveKind::kAllReduce, DType::kI64, 1 + i, ReduceOp::kSum);
    c.seed = 7000 + i;
    cases.push_back(c);
  }
  SequenceRun run = PrepareRun(cases, kWorld);
  RunOnRanks(kWorld, [&](int r) {
    std::vector<CollectiveHandle> handles;
    for (int i = 0; i < kCalls; ++i) {
      handles.push_back((*group)[r]->RunAsync(cases[i].spec, run.inputs[i][r],
                                              &run.outputs[i][r],
                                              Options(cases[i])));
    }
    for (int i = 0; i < kCalls; ++i) run.results[i][r] = handles[i].Wait();
  });
  ExpectRunMatches(cases, run, kWorld);
}

// The blocking #2 may overtake the asynchronous #1 on its way to the
// coordinator.
TEST(ConcurrencyTest, RunAsync_MixedWithBlockingRun_NumberedInIssueOrder) {
  constexpr int kWorld = 3;
  std::unique_ptr<EmbeddedCluster> cluster = StartCluster(kWorld);
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("mixed", kWorld);
  ASSERT_TRUE(group.ok()) << group.status();

  // Case 0 asynchronous, case 1 blocking while 0 runs, case 2 asynchronous.
  const std::vector<CollectiveCase> cases = MixedCases(3, 5);
  SequenceRun run = PrepareRun(cases, kWorld);
  RunOnRanks(kWorld, [&](int r) {
    Communicator* comm = (*group)[r].get();
    CollectiveHandle first = comm->RunAsync(
        cases[0].spec, run.inputs[0][r], &run.outputs[0][r], Options(cases[0]));
    run.results[1][r] = comm->Run(cases[1].spec, run.inputs[1][r],
                                  &run.outputs[1][r], Options(cases[1]));
    CollectiveHandle third = comm->RunAsync(
        cases[2].spec, run.inputs[2][r], &run.outputs[2][r], Options(cases[2]));
    run.results[0][r] = first.Wait();
    run.results[2][r] = third.Wait();
  });
  ExpectRunMatches(cases, run, kWorld);
}

// Number of threads of this process.
int ThreadCount() {
  int count = 0;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (dirent* entry = readdir(dir)) {
      if (entry->d_name[0] != '.') ++count;
    }
    closedir(dir);
  }
  return count;
}

// Resident set size of this process in KiB; 0 when unknown.
int64_t RssKiB() {
  absl::StatusOr<std::string> status = ReadFileToString("/proc/self/status");
  if (!status.ok()) return 0;
  for (absl::string_view line : absl::StrSplit(*status, '\n')) {
    if (absl::ConsumePrefix(&line, "VmRSS:")) {
      int64_t kib = 0;
      line = absl::StripSuffix(absl::StripAsciiWhitespace(line), "kB");
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kib)) return kib;
    }
  }
  return 0;
}

TEST(ConcurrencyTest, AllReduce_ThousandBackToBack_AllCountedNothingPending) {
  constexpr int kWorld = 4;
  constexpr int kCalls = 1000;
  std::unique_ptr<EmbeddedCluster> cluster = StartCluster(kWorld);
  ASSERT_NE(cluster, nullptr);
  auto group = cluster->JoinGroup("thousand", kWorld);
  ASSERT_TRUE(group.ok()) << group.status();

  // Warm up (connections, thread pools), then measure growth.
  std::vector<int> failures(kWorld, 0);
  auto run_calls = [&](int first, int calls) {
    RunOnRanks(kWorld, [&](int r) {
      for (int i = first; i < first + calls; ++i) {
        const std::vector<int64_t> input = {r + i, int64_t{1} << r, -i};
        std::vector<int64_t> output;
        CallOptions options;
        options.timeout = kCallTimeout;
        absl::Status status =
            (*group)[r]->AllReduce(input, &output, ReduceOp::kSum, options);
        // Sum over ranks 0..3: {6 + 4i, 15, -4i}.
        const std::vector<int64_t> want = {6 + 4 * int64_t{i}, 15,
                                           -4 * int64_t{i}};
        if (!status.ok() || output != want) {
          if (++failures[r] <= 3) {
            ADD_FAILURE() << "rank " << r << " call " << i << ": " << status;
          }
          if (!status.ok()) return;  // The group is broken; stop early.
        }
      }
    });
  };
  run_calls(0, 50);
  const int threads_before = ThreadCount();
  const int64_t rss_before = RssKiB();
  run_calls(50, kCalls - 50);
  const int threads_after = ThreadCount();
  const int64_t rss_after = RssKiB();
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(failures[r], 0) << "rank " << r;

  std::unique_ptr<AdminClient> admin =
      AdminClient::Connect(cluster->coordinator_address(), kRpcTimeout);
  absl::StatusOr<std::vector<GroupInfo>> groups = admin->ListGroups();
  ASSERT_TRUE(groups.ok()) << groups.status();
  ASSERT_EQ(groups->size(), 1u);
  const GroupInfo& info = (*groups)[0];
  EXPECT_EQ(info.name, "thousand");
  EXPECT_EQ(info.world_size, kWorld);
  EXPECT_EQ(info.completed, static_cast<uint64_t>(kCalls));
  EXPECT_EQ(info.pending_sequence, 0u);
  EXPECT_TRUE(info.missing_ranks.empty());

  // Nothing per call is kept: no thread or memory grows with the count.
  EXPECT_LE(threads_after, threads_before + 32)
      << "threads " << threads_before << " -> " << threads_after;
  // AddressSanitizer keeps freed memory in quarantine, so RSS says nothing
  // about leaks there (LeakSanitizer checks those at exit instead).
  if (rss_before > 0 && rss_after > 0 && !kAddressSanitizer) {
    EXPECT_LE(rss_after, rss_before + 64 * 1024)
        << "RSS " << rss_before << " KiB -> " << rss_after << " KiB";
  }
}

TEST(ConcurrencyTest, Run_SeveralRanksPerWorker_Correct) {
  std::unique_ptr<EmbeddedCluster> cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  // Ranks 0, 1, 4 on worker 0 and ranks 2, 3 on worker 1: some ring and
  // recursive doubling partners share a worker, some do not.
  auto group = cluster->JoinGroup("shared", {0, 0, 1, 1, 0});
  ASSERT_TRUE(group.ok()) << group.status();
  uint64_t seed = 500;
  for (CollectiveKind kind : AllKinds()) {
    for (Algorithm plan : PlansFor(kind)) {
      if (plan == Algorithm::kInline) continue;
      CollectiveCase c;
      c.spec = Spec(kind, DType::kF32, 20000, ReduceOp::kSum, 3);
      c.algorithm = plan;
      c.seed = seed++;
      ASSERT_TRUE(RunAndCheck(Pointers(*group), c));
    }
  }
}

}  // namespace
}  // namespace chorus::test
