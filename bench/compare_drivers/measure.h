// The measurement loop bench/compare runs for every peer system (Gloo, MPI),
// with chorus-bench's rules (bench/README.md, "How each size is measured"):
// one checked warm-up call whose time the ranks agree on (their maximum),
// with --warmup=-1 up to four more that fit in a tenth of --time_per_size,
// iterations clamp(time_per_size / estimate, min_iters, max_iters) unless
// --iters is given, one barrier, back-to-back timed calls, and a check of the
// last result. Each iteration counts with the slowest rank's time; rank 0
// prints one CSV row per size (bench_util's CsvHeader / FormatCsvRow).
//
// Inputs are chorus-bench's for all_reduce f32 sum: rank r holds
// (r+1) * (i%7 + 1) at element i, so every sum is an exact small integer.
//
// A driver implements Collectives for its system and calls RunSizes from
// main; the flags below are shared by every driver.
#ifndef CHORUS_BENCH_COMPARE_DRIVERS_MEASURE_H_
#define CHORUS_BENCH_COMPARE_DRIVERS_MEASURE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

ABSL_DECLARE_FLAG(std::string, sizes);
ABSL_DECLARE_FLAG(int32_t, iters);
ABSL_DECLARE_FLAG(int32_t, warmup);
ABSL_DECLARE_FLAG(absl::Duration, time_per_size);
ABSL_DECLARE_FLAG(int32_t, min_iters);
ABSL_DECLARE_FLAG(int32_t, max_iters);
ABSL_DECLARE_FLAG(bool, check);
ABSL_DECLARE_FLAG(absl::Duration, timeout);

namespace chorus::bench::compare {

// The operations the loop needs from one system, seen from one rank. Each
// call is collective: every rank makes it, in the same order. Failures throw
// (Gloo does; MPI aborts the job), and the driver's main reports them.
class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // The all-reduce under test: f32 sum of `count` elements from `in` to
  // `out` (distinct buffers).
  virtual void AllReduceSum(const float* in, float* out, size_t count) = 0;
  // The largest `value` over the ranks, and the sum, at every rank.
  virtual int64_t AgreeMax(int64_t value) = 0;
  virtual int64_t AgreeSum(int64_t value) = 0;
  // Element-wise maximum of `values` over the ranks, at rank 0 at least.
  virtual void MaxAtRoot(std::vector<int64_t>& values) = 0;
  virtual void Barrier() = 0;
};

// The measurement rules, from the shared flags.
struct Rules {
  std::vector<uint64_t> sizes;  // bytes, each a whole number of f32
  int iters = 0;                // 0: from --time_per_size
  int warmup = -1;              // -1: one, plus up to four that fit
  absl::Duration time_per_size;
  int min_iters = 3;
  int max_iters = 1000;
  bool check = true;
};

// Reads and validates the shared flags.
absl::StatusOr<Rules> RulesFromFlags();

// Rank r's input element i, and the sum of all ranks' (see above).
float InputValue(int rank, size_t index);
float ExpectedSum(int world_size, size_t index);

// Measures every size of `rules` and prints, on rank 0, the CSV header and
// one row per size to stdout; `plan` fills the plan column. Returns the
// number of wrong elements seen over all ranks and sizes (0 on success).
uint64_t RunSizes(Collectives& system, const Rules& rules,
                  const std::string& plan);

}  // namespace chorus::bench::compare

#endif  // CHORUS_BENCH_COMPARE_DRIVERS_MEASURE_H_
