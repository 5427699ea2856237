// Runs one data-plane algorithm on every rank of a group in this process:
// one thread per rank, each with its own InProcessTransport on a shared
// InProcessHub, inputs from MakeInput() (collective_reference.h). Then
// checks every rank's status and output against the reference. For the
// algorithms' unit tests.
//
// Thread safety: each call uses only its arguments (and the hub, which is
// thread-safe).
#ifndef CHORUS_TESTS_TESTING_IN_PROCESS_GROUP_H_
#define CHORUS_TESTS_TESTING_IN_PROCESS_GROUP_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/collective.h"
#include "gtest/gtest.h"
#include "server/worker/algorithms/algorithm.h"
#include "server/worker/dataplane/in_process_transport.h"
#include "tests/testing/collective_reference.h"

namespace chorus::test {

// One of RunRing, RunRecursiveDoubling, RunSameHost: runs `args` and sets
// *ran to the algorithm that ran.
using AlgorithmFn =
    std::function<absl::Status(const AlgorithmArgs& args, Algorithm* ran)>;
AlgorithmFn RingFn();
AlgorithmFn RecursiveDoublingFn();
AlgorithmFn SameHostFn();

// Runs `fn` on `args`, whose output_place points into `place`, and, when it
// succeeded, copies `place` into *args.output. Returns INTERNAL when `fn`
// wrote the string instead of the place, else what `fn` returned.
absl::Status RunWritingPlace(const AlgorithmFn& fn, const AlgorithmArgs& args,
                             absl::string_view place, Algorithm* ran);

// What one rank's call gave.
struct RankOutcome {
  absl::Status status;
  std::string output;
  Algorithm ran = Algorithm::kUnspecified;
  // The value of the rank's ResultHash (kinds SameForEveryRank only).
  uint64_t hash = 0;
};

struct GroupRunOptions {
  // The plan's chunk size.
  uint64_t chunk_bytes = 1 << 20;
  // How long each rank's waits may take.
  absl::Duration timeout = absl::Seconds(60);
  // Ranks that do not run (their outcome stays default).
  std::vector<int> absent;
  // Collective number, for a hub that runs several.
  uint64_t sequence = 1;
};

// Runs `fn` for case `c` on every rank of `hub` (inputs from MakeInput) and
// returns each rank's outcome, by rank.
std::vector<RankOutcome> RunOnHub(InProcessHub& hub, const AlgorithmFn& fn,
                                  const CollectiveCase& c,
                                  const GroupRunOptions& options = {});

// Runs `c` on a fresh hub of `world` ranks and checks: every rank OK with
// `want` as the algorithm that ran, each output OutputBytes() long and as
// Reference() says, and for kinds SameForEveryRank bit-identical outputs
// and equal result hashes on every rank.
::testing::AssertionResult RunAndCheckInProcess(const AlgorithmFn& fn,
                                                const CollectiveCase& c,
                                                int world, Algorithm want,
                                                uint64_t chunk_bytes);

}  // namespace chorus::test

#endif  // CHORUS_TESTS_TESTING_IN_PROCESS_GROUP_H_
