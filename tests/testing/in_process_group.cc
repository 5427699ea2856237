#include "tests/testing/in_process_group.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/result_hash.h"

namespace chorus::test {

AlgorithmFn RingFn() {
  return [](const AlgorithmArgs& args, Algorithm* ran) {
    *ran = Algorithm::kRing;
    return RunRing(args);
  };
}

AlgorithmFn RecursiveDoublingFn() {
  return [](const AlgorithmArgs& args, Algorithm* ran) {
    *ran = Algorithm::kRecursiveDoubling;
    return RunRecursiveDoubling(args);
  };
}

AlgorithmFn SameHostFn() {
  return [](const AlgorithmArgs& args, Algorithm* ran) {
    // RunSameHost sets *ran only when it falls back to the ring.
    *ran = Algorithm::kSameHost;
    return RunSameHost(args, ran);
  };
}

absl::Status RunWritingPlace(const AlgorithmFn& fn, const AlgorithmArgs& args,
                             absl::string_view place, Algorithm* ran) {
  args.output->clear();
  absl::Status status = fn(args, ran);
  if (status.ok() && !args.output->empty()) {
    return absl::InternalError(absl::StrCat(
        AlgorithmName(*ran), " wrote the output string, not the place"));
  }
  if (status.ok()) args.output->assign(place.data(), place.size());
  return status;
}

std::vector<RankOutcome> RunOnHub(InProcessHub& hub, const AlgorithmFn& fn,
                                  const CollectiveCase& c,
                                  const GroupRunOptions& options) {
  const int world = hub.world_size();
  std::vector<std::string> inputs(world);
  for (int r = 0; r < world; ++r) inputs[r] = MakeInput(c, world, r);
  std::vector<RankOutcome> outcomes(world);
  const absl::Time deadline = absl::Now() + options.timeout;
  RunOnRanks(world, [&](int rank) {
    if (std::find(options.absent.begin(), options.absent.end(), rank) !=
        options.absent.end()) {
      return;
    }
    InProcessTransport transport(&hub, rank, options.sequence, deadline);
    RankOutcome& outcome = outcomes[rank];
    std::optional<ResultHash> hash;
    AlgorithmArgs args;
    args.spec = c.spec;
    args.chunk_bytes = options.chunk_bytes;
    args.input = inputs[rank];
    args.output = &outcome.output;
    args.transport = &transport;
    if (SameForEveryRank(c.spec.kind)) {
      hash.emplace(c.spec.dtype);
      args.hash = &*hash;
    }
    outcome.status = fn(args, &outcome.ran);
    if (hash.has_value()) outcome.hash = hash->value();
  });
  return outcomes;
}

::testing::AssertionResult RunAndCheckInProcess(const AlgorithmFn& fn,
                                                const CollectiveCase& c,
                                                int world, Algorithm want,
                                                uint64_t chunk_bytes) {
  InProcessHub hub("g", world);
  GroupRunOptions options;
  options.chunk_bytes = chunk_bytes;
  const std::vector<RankOutcome> outcomes = RunOnHub(hub, fn, c, options);
  const std::string what =
      absl::StrCat(DescribeCase(c, world), ", chunk ", chunk_bytes);
  std::vector<std::string> inputs(world);
  for (int r = 0; r < world; ++r) inputs[r] = MakeInput(c, world, r);
  const std::vector<Expected> expected = Reference(c, world, inputs);
  for (int r = 0; r < world; ++r) {
    const RankOutcome& o = outcomes[r];
    if (!o.status.ok()) {
      return ::testing::AssertionFailure()
             << what << ": rank " << r << " failed: " << o.status;
    }
    if (o.ran != want) {
      return ::testing::AssertionFailure()
             << what << ": rank " << r << " ran " << AlgorithmName(o.ran);
    }
    const uint64_t size = OutputBytes(c.spec, world, r);
    if (o.output.size() != size) {
      return ::testing::AssertionFailure()
             << what << ": rank " << r << " output has " << o.output.size()
             << " bytes; OutputBytes says " << size;
    }
    ::testing::AssertionResult match =
        MatchesExpected(c, expected[r], o.output);
    if (!match) {
      return ::testing::AssertionFailure()
             << what << ": rank " << r << ": " << match.message();
    }
    if (SameForEveryRank(c.spec.kind) &&
        (o.output != outcomes[0].output || o.hash != outcomes[0].hash)) {
      return ::testing::AssertionFailure()
             << what << ": rank " << r
             << "'s output or result hash differs from rank 0's";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace chorus::test
