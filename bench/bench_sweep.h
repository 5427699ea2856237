// The rank side of chorus-bench: what every process of one run agrees on
// (Config, from the flags), and a rank's sweep: for every size, warm-up
// calls, an iteration count every rank derives from the same agreed
// estimate, the timed calls, and one report line to the parent on stdout.
//
// Stateless functions; a sweep runs on the calling thread.
#ifndef CHORUS_BENCH_BENCH_SWEEP_H_
#define CHORUS_BENCH_BENCH_SWEEP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "bench/bench_device.h"
#include "bench/bench_util.h"
#include "chorus/communicator.h"
#include "common/adaptive_spin.h"
#include "common/collective.h"

namespace chorus::bench {

// What every process of one run agrees on, from the flags.
struct Config {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  Algorithm algorithm = Algorithm::kUnspecified;
  // Ranks in the group; this invocation runs ranks first_rank ..
  // first_rank + local_ranks - 1.
  int world = 0;
  int local_ranks = 0;
  int first_rank = 0;
  std::vector<SweepPoint> sweep;
  int iters = 0;
  int warmup = -1;
  absl::Duration time_per_size;
  int min_iters = 0;
  int max_iters = 0;
  absl::Duration timeout;
  bool check = true;
};
// OK when c's iteration, warm-up and time settings can run; else
// INVALID_ARGUMENT naming the flags at fault.
absl::Status CheckIterations(const Config& c);

// The spec of one point of the sweep: `count` elements.
CollectiveSpec SpecFor(const Config& c, uint64_t count);

// Writes `line` and a newline to stdout (the pipe to the parent), whole.
// INTERNAL when the parent is gone.
absl::Status ReportLine(const std::string& line);

// Runs every point of c.sweep on `comm` with buffers on `device` and
// reports each; returns the first failed call's status (naming the size)
// or the device's error.
absl::Status RunSweepForDType(Communicator& comm, BenchDevice& device,
                              const Config& c);

// How one rank process runs, from the flags.
struct RankSetup {
  int rank = 0;
  std::string coordinator;
  std::string group;
  // Where its embedded worker listens; --tls_certs' directory (empty:
  // plaintext); --device; the worker's call_port and check_results.
  std::string listen;
  std::string tls_certs;
  std::string device = "cpu";
  bool call_port = true;
  bool check_results = false;
  // How long its waits poll before blocking (the workers' --spin).
  absl::Duration spin = kDefaultSpin;
};

// Starts this rank's embedded worker, joins the group, runs the sweep
// (RunSweepForDType) and shuts the worker down. Returns the first error:
// the device's, the worker's start, the join's or the sweep's.
absl::Status RunRank(const Config& c, const RankSetup& setup);

// A rank process's whole run: RunRank, then "done" or "error <why>" to the
// parent (ReportLine). Returns the process's exit code (0 or 1).
int RunRankProcess(const Config& c, const RankSetup& setup);

}  // namespace chorus::bench

#endif  // CHORUS_BENCH_BENCH_SWEEP_H_
