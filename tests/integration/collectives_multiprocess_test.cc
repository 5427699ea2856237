// Collectives across processes: a chorus-coordinator and four chorus-worker
// daemons, with the test joining through each worker's local API
// (Communicator::JoinThroughDaemon on the port the worker wrote, where it
// also serves its peers), and the same group through four concurrent
// chorusctl processes, their tensors given as values, files (--input,
// --output) or one value repeated (--fill).

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/collective_harness.h"
#include "tests/testing/daemons.h"
#include "tests/testing/process.h"

namespace chorus::test {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int kWorld = 4;

// Writes `bytes` to a new file at `path`; false when it could not.
bool WriteScratchFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(out);
}

class MultiProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<Daemon> coordinator = StartCoordinator();
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    for (int i = 0; i < kWorld; ++i) {
      absl::StatusOr<Daemon> worker = StartWorker(
          coordinator_.address, {absl::StrCat("--name=worker-", i)});
      ASSERT_TRUE(worker.ok()) << worker.status();
      workers_.push_back(*std::move(worker));
    }
  }

  // Joins group `name` with rank r through worker r's local API.
  std::vector<std::unique_ptr<Communicator>> JoinThroughDaemons(
      const std::string& name) {
    std::vector<absl::StatusOr<std::unique_ptr<Communicator>>> joined;
    for (int r = 0; r < kWorld; ++r) {
      joined.emplace_back(absl::UnknownError("not run"));
    }
    RunOnRanks(kWorld, [&](int r) {
      JoinOptions options;
      options.timeout = kCallTimeout;
      joined[r] = Communicator::JoinThroughDaemon(workers_[r].address, name,
                                                  kWorld, r, options);
    });
    std::vector<std::unique_ptr<Communicator>> out;
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_TRUE(joined[r].ok()) << "rank " << r << ": " << joined[r].status();
      if (!joined[r].ok()) return {};
      out.push_back(*std::move(joined[r]));
    }
    return out;
  }

  // Runs chorusctl for every rank at once, rank r through worker r with
  // `flags`, then `command` and `values[r]` (after "--", so negative values
  // are not taken for flags). Returns each rank's stdout; failures are
  // reported through gtest.
  // `rank_flags[r]`, when given, go after `flags` for rank r.
  std::vector<std::string> RunChorusctlRanks(
      const std::vector<std::string>& flags, const std::string& command,
      const std::vector<std::vector<std::string>>& values,
      const std::vector<std::vector<std::string>>& rank_flags = {}) {
    std::vector<std::unique_ptr<Subprocess>> processes;
    for (int r = 0; r < kWorld; ++r) {
      SubprocessOptions options;
      options.binary = ChorusctlBinary();
      options.args = {absl::StrCat("--coordinator=", coordinator_.address),
                      absl::StrCat("--worker=", workers_[r].address),
                      "--group=g",
                      absl::StrCat("--world=", kWorld),
                      absl::StrCat("--rank=", r),
                      "--timeout=60s"};
      options.args.insert(options.args.end(), flags.begin(), flags.end());
      if (!rank_flags.empty()) {
        options.args.insert(options.args.end(), rank_flags[r].begin(),
                            rank_flags[r].end());
      }
      options.args.push_back("--");
      options.args.push_back(command);
      options.args.insert(options.args.end(), values[r].begin(),
                          values[r].end());
      options.stdout_path =
          NewScratchPath(absl::StrCat("chorusctl-", r), ".out");
      options.stderr_path =
          NewScratchPath(absl::StrCat("chorusctl-", r), ".err");
      absl::StatusOr<std::unique_ptr<Subprocess>> process =
          Subprocess::Start(options);
      if (!process.ok()) {
        ADD_FAILURE() << process.status();
        return {};
      }
      processes.push_back(*std::move(process));
    }
    std::vector<std::string> outputs;
    for (int r = 0; r < kWorld; ++r) {
      absl::StatusOr<int> code = processes[r]->WaitForExit(absl::Seconds(90));
      EXPECT_TRUE(code.ok()) << "rank " << r << ": " << code.status();
      EXPECT_EQ(code.value_or(-1), 0)
          << "rank " << r << ": " << processes[r]->ReadStderr();
      outputs.push_back(processes[r]->ReadLog());
    }
    return outputs;
  }

  Daemon coordinator_;
  std::vector<Daemon> workers_;
};

TEST_F(MultiProcessTest,
       JoinThroughDaemon_AllReduceEveryPlanAndAllGather_Correct) {
  std::vector<std::unique_ptr<Communicator>> group = JoinThroughDaemons("g");
  ASSERT_EQ(group.size(), kWorld);
  const std::vector<Communicator*> ranks = Pointers(group);

  uint64_t seed = 1;
  std::vector<CollectiveCase> cases;
  for (Algorithm plan : PlansFor(CollectiveKind::kAllReduce)) {
    for (DType dtype : {DType::kF32, DType::kI64}) {
      CollectiveCase c;
      c.spec = Spec(CollectiveKind::kAllReduce, dtype, 5000, ReduceOp::kSum);
      c.algorithm = plan;
      c.seed = seed++;
      cases.push_back(c);
    }
  }
  // Sizes at which the planner itself picks recursive doubling and the
  // ring; all_gather inline and under the ring.
  for (uint64_t count : {uint64_t{50000}, uint64_t{300000}}) {
    CollectiveCase c;
    c.spec =
        Spec(CollectiveKind::kAllReduce, DType::kF32, count, ReduceOp::kAvg);
    c.values = Values::kRounding;
    c.seed = seed++;
    cases.push_back(c);
  }
  for (Algorithm plan : {Algorithm::kUnspecified, Algorithm::kRing}) {
    CollectiveCase c;
    c.spec = Spec(CollectiveKind::kAllGather, DType::kI32, 3001);
    c.algorithm = plan;
    c.seed = seed++;
    cases.push_back(c);
  }
  for (const CollectiveCase& c : cases) {
    EXPECT_TRUE(RunAndCheck(ranks, c));
  }
}

TEST_F(MultiProcessTest,
       JoinThroughDaemon_OneRankOnVulkan_RefusedOthersNameIt) {
  std::vector<std::unique_ptr<Communicator>> group = JoinThroughDaemons("g");
  ASSERT_EQ(group.size(), kWorld);

  const CollectiveSpec spec =
      Spec(CollectiveKind::kAllReduce, DType::kF32, 16, ReduceOp::kSum);
  std::vector<absl::Status> statuses(kWorld);
  RunOnRanks(kWorld, [&](int r) {
    CallOptions options;
    options.timeout = kCallTimeout;
    if (r == 2) {
      Device vulkan;
      vulkan.kind = DeviceKind::kVulkan;
      vulkan.index = 0;
      options.device = vulkan;
    }
    std::string output;
    statuses[r] =
        group[r]
            ->Run(spec, std::string(16 * sizeof(float), '\0'), &output, options)
            .status();
  });
  EXPECT_EQ(statuses[2].code(), absl::StatusCode::kUnimplemented)
      << statuses[2];
  EXPECT_THAT(
      std::string(statuses[2].message()),
      StartsWith(
          "Distributed operations are not supported for device Vulkan(0)"));
  for (int r : {0, 1, 3}) {
    EXPECT_EQ(statuses[r].code(), absl::StatusCode::kFailedPrecondition)
        << statuses[r];
    EXPECT_THAT(std::string(statuses[r].message()),
                HasSubstr("rank 2: Distributed operations are not supported "
                          "for device Vulkan(0)"));
  }
  // The group still works.
  CollectiveCase c;
  c.spec = spec;
  EXPECT_TRUE(RunAndCheck(Pointers(group), c));
}

TEST_F(MultiProcessTest,
       JoinThroughDaemon_InputOverMessageLimit_RefusedNextCallTakesItsNumber) {
  std::vector<std::unique_ptr<Communicator>> group = JoinThroughDaemons("over");
  ASSERT_EQ(group.size(), kWorld);

  // One element more than the daemon's 64 MiB message takes: refused before
  // the call takes its number, so it leaves no gap.
  constexpr uint64_t kOver = (uint64_t{64} << 20) / sizeof(float) + 1;
  CallOptions options;
  options.timeout = kCallTimeout;
  std::string output;
  const absl::Status refused =
      group[0]
          ->Run(Spec(CollectiveKind::kAllReduce, DType::kF32, kOver,
                     ReduceOp::kSum),
                std::string(kOver * sizeof(float), '\0'), &output, options)
          .status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;

  // Every rank's next call is its #1, rank 0's too.
  CollectiveCase c;
  c.spec = Spec(CollectiveKind::kAllReduce, DType::kF32, 16, ReduceOp::kSum);
  EXPECT_TRUE(RunAndCheck(Pointers(group), c));
}

TEST_F(MultiProcessTest, Chorusctl_AllReduceThroughWorkers_PrintsWrappedSums) {
  // Rank r gives {r + 1, -3r, 10^9}: the sums are 10, -18 and 4 * 10^9,
  // which wraps in i32 to -294967296.
  std::vector<std::vector<std::string>> values;
  for (int r = 0; r < kWorld; ++r) {
    values.push_back({absl::StrCat(r + 1), absl::StrCat(-3 * r), "1000000000"});
  }
  for (const std::string plan : {"auto", "recursive_doubling", "ring"}) {
    SCOPED_TRACE(plan);
    const std::vector<std::string> outputs = RunChorusctlRanks(
        {"--dtype=i32", "--op=sum", absl::StrCat("--algorithm=", plan)},
        "allreduce", values);
    ASSERT_EQ(outputs.size(), kWorld);
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ(outputs[r], "10 -18 -294967296\n") << "rank " << r;
    }
  }
}

TEST_F(MultiProcessTest, Chorusctl_AllGatherThroughWorkers_PrintsEveryBlock) {
  std::vector<std::vector<std::string>> values;
  for (int r = 0; r < kWorld; ++r) {
    values.push_back({absl::StrCat(r, ".5"), absl::StrCat(-r)});
  }
  const std::vector<std::string> outputs =
      RunChorusctlRanks({"--dtype=f64"}, "allgather", values);
  ASSERT_EQ(outputs.size(), kWorld);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(outputs[r], "0.5 0 1.5 -1 2.5 -2 3.5 -3\n") << "rank " << r;
  }
}

// A tensor of 4 MiB per rank, more than a command line holds: each rank
// reads its input from a file of raw f32 elements and writes its output to
// another; every output file holds the exact sums.
TEST_F(MultiProcessTest, Chorusctl_InputAndOutputFiles_FourMiBExactSums) {
  constexpr uint32_t kElements = 1 << 20;
  std::vector<std::vector<std::string>> rank_flags;
  std::vector<std::string> outputs;
  std::vector<float> sums(kElements, 0);
  for (int r = 0; r < kWorld; ++r) {
    std::vector<float> input(kElements);
    for (uint32_t i = 0; i < kElements; ++i) {
      input[i] = static_cast<float>((i % 4096) * (r + 1));
      sums[i] += input[i];
    }
    const std::string in = NewScratchPath(absl::StrCat("input-", r), ".bin");
    ASSERT_TRUE(WriteScratchFile(
        in, std::string(reinterpret_cast<const char*>(input.data()),
                        kElements * sizeof(float))));
    outputs.push_back(NewScratchPath(absl::StrCat("output-", r), ".bin"));
    rank_flags.push_back(
        {absl::StrCat("--input=", in), absl::StrCat("--output=", outputs[r])});
  }
  const std::vector<std::string> printed = RunChorusctlRanks(
      {"--dtype=f32"}, "allreduce",
      std::vector<std::vector<std::string>>(kWorld), rank_flags);
  ASSERT_EQ(printed.size(), kWorld);
  const std::string want(reinterpret_cast<const char*>(sums.data()),
                         kElements * sizeof(float));
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(printed[r], "") << "rank " << r;
    absl::StatusOr<std::string> got = ReadFileToString(outputs[r]);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(*got == want) << "rank " << r << " wrote " << got->size()
                              << " bytes, not the sums' " << want.size();
  }
}

// --fill: every element of rank r's input is r + 1, as many as --count.
TEST_F(MultiProcessTest, Chorusctl_Fill_EveryElementTheRankValue) {
  std::vector<std::vector<std::string>> rank_flags;
  for (int r = 0; r < kWorld; ++r) {
    rank_flags.push_back({absl::StrCat("--fill=", r + 1)});
  }
  const std::vector<std::string> outputs = RunChorusctlRanks(
      {"--dtype=i32", "--count=3"}, "allreduce",
      std::vector<std::vector<std::string>>(kWorld), rank_flags);
  ASSERT_EQ(outputs.size(), kWorld);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(outputs[r], "10 10 10\n") << "rank " << r;
  }
}

// An input given twice, a --fill without --count, a file of part of an
// element: refused before the join, saying why.
TEST_F(MultiProcessTest, Chorusctl_BadInputFlags_RefusedSayingWhy) {
  const std::string odd = NewScratchPath("odd", ".bin");
  ASSERT_TRUE(WriteScratchFile(odd, "1234567"));
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--fill=1", "--count=2", "allreduce", "3", "4"},
       "INVALID_ARGUMENT: give this rank's input once"},
      {{"--fill=1", "allreduce"}, "INVALID_ARGUMENT: --fill needs --count"},
      {{"--fill=x", "--count=2", "allreduce"},
       "INVALID_ARGUMENT: \"x\" is not a f32 value"},
      {{absl::StrCat("--input=", odd), "allreduce"},
       "holds 7 bytes, not a whole number of f32 elements of 4 bytes"}};
  for (const auto& [args, want] : cases) {
    std::vector<std::string> command = {
        absl::StrCat("--worker=", workers_[0].address), "--group=bad"};
    command.insert(command.end(), args.begin(), args.end());
    absl::StatusOr<CommandResult> ran = RunChorusctl(command);
    ASSERT_TRUE(ran.ok()) << ran.status();
    EXPECT_EQ(ran->exit_code, 1) << args[0];
    EXPECT_THAT(ran->err, HasSubstr(want)) << args[0];
  }
}

}  // namespace
}  // namespace chorus::test
