// Deterministic inputs for every collective kind and dtype, and a simple
// reference for what every rank must get, shared by the collective
// integration tests (collective_harness.h) and the algorithms' unit tests
// (which run every rank in one process over InProcessTransport).
//
// The reference is deliberately naive (one loop per kind, reductions in
// long double or in wrapping unsigned arithmetic); it shares no code with the
// reduce engines beyond the spec's buffer-size table.
//
// Thread safety: pure functions, except RunOnRanks, which runs its function
// on threads of its own.
#ifndef CHORUS_TESTS_TESTING_COLLECTIVE_REFERENCE_H_
#define CHORUS_TESTS_TESTING_COLLECTIVE_REFERENCE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/collective.h"
#include "gtest/gtest.h"

namespace chorus::test {

// Every dtype, reduce op and collective kind, in enum order.
std::vector<DType> AllDTypes();
std::vector<ReduceOp> AllReduceOps();
std::vector<CollectiveKind> AllKinds();

bool IsFloatDType(DType dtype);

// The algorithms a test may force for `kind`: kUnspecified (auto), inline,
// ring, and recursive doubling for all_reduce.
std::vector<Algorithm> PlansFor(CollectiveKind kind);

// Runs fn(rank) for rank 0 .. ranks-1, each on its own thread, started in
// `start_order` (a permutation; empty means ascending), and returns once all
// returned.
void RunOnRanks(int ranks, const std::function<void(int rank)>& fn,
                const std::vector<int>& start_order = {});

// True for kinds whose output is the same on every rank (all_reduce,
// broadcast, all_gather).
bool SameForEveryRank(CollectiveKind kind);

// How inputs are chosen.
enum class Values {
  // Floats: small integers (sum, avg, min, max) or +-1/2, +-1, +-2 (prod),
  // so that sums and products are exact in every float type, plus signed
  // zeros, an infinity and a NaN for min and max. Integers: full-range
  // values, and in the first elements of each block values whose sum
  // (every rank at the maximum) or product (every rank at 2^(bits/2), or
  // all ones) wraps.
  kExact,
  // Floats: full-precision values whose sums and products round; the check
  // allows an error that grows with the world size. Integers as kExact.
  kRounding,
};

// One collective run by every rank of a group.
struct CollectiveCase {
  CollectiveSpec spec;
  Algorithm algorithm = Algorithm::kUnspecified;
  Values values = Values::kExact;
  // Mixed into every input value, so two cases give different data.
  uint64_t seed = 1;
};

// "all_reduce f32[7] sum, plan ring, world 3, exact values, seed 1".
std::string DescribeCase(const CollectiveCase& c, int world);

// Rank `rank`'s input for `c` in a group of `world`. Off-root ranks of
// broadcast and scatter pass an empty buffer (even ranks) or a full-size one
// of junk the collective must ignore (odd ranks).
std::string MakeInput(const CollectiveCase& c, int world, int rank);

// What rank `rank` must get. Integer results and data movement are exact;
// float min and max are exact (bits, signed zeros included; any NaN for a
// NaN); float sum, prod and avg allow `tolerance[i]` around `values[i]`.
struct Expected {
  bool numeric = false;
  // When !numeric: the exact output bytes.
  std::string bytes;
  // When numeric: one reference value and allowed error per element (0:
  // exact, and for min and max the sign of a zero too).
  std::vector<long double> values;
  std::vector<long double> tolerance;
};

// Computes every rank's expected output from all ranks' inputs.
std::vector<Expected> Reference(const CollectiveCase& c, int world,
                                const std::vector<std::string>& inputs);

// Compares one rank's output with its expectation; the failure message
// names the first mismatching elements.
::testing::AssertionResult MatchesExpected(const CollectiveCase& c,
                                           const Expected& expected,
                                           const std::string& output);

// Returns a spec; the op only for kinds that reduce, the root only for kinds
// that have one, nothing but the kind for barrier.
CollectiveSpec Spec(CollectiveKind kind, DType dtype, uint64_t count,
                    ReduceOp op = ReduceOp::kUnspecified, int root = 0);

}  // namespace chorus::test

#endif  // CHORUS_TESTS_TESTING_COLLECTIVE_REFERENCE_H_
