// Pure helpers of chorus-bench: byte sizes on the command line ("64M"), the
// sweep of sizes and the element count each size gives per collective, the
// bus-bandwidth factor, medians and percentiles, the text protocol rank
// processes use to report to the parent, and the table and CSV rows.
//
// Plain values and pure functions; thread-safe.
#ifndef CHORUS_BENCH_BENCH_UTIL_H_
#define CHORUS_BENCH_BENCH_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/collective.h"

namespace chorus::bench {

// Parses a byte count: digits with an optional binary suffix K, M or G
// (case-insensitive, optionally followed by "B" or "iB"), e.g. "8", "64K",
// "64M", "1GiB". Returns INVALID_ARGUMENT for anything else or an overflow.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);

// Formats a byte count the way ParseByteSize reads it, e.g. "64M", "8".
std::string FormatByteSize(uint64_t bytes);

// One point of the sweep.
struct SweepPoint {
  // Bytes the size column shows: count * element size, times the world size
  // for kinds whose largest buffer holds one block per rank.
  uint64_t bytes = 0;
  // CollectiveSpec::count: elements in one rank's block.
  uint64_t count = 0;
};

// How many blocks of `count` elements the size column counts for `kind`:
// world_size for all_gather, gather, reduce_scatter, scatter and all_to_all
// (their largest buffer), 1 otherwise.
int BlocksPerSize(CollectiveKind kind, int world_size);

// The sizes from min_bytes to max_bytes, multiplying by `factor` (>= 2) each
// step, turned into element counts (rounded down); sizes that give no element
// or the same count as the previous point are dropped. Barrier gives one
// point with count 0. Returns INVALID_ARGUMENT for min > max, factor < 2, an
// invalid dtype or a world size below 1, or when no size gives an element.
absl::StatusOr<std::vector<SweepPoint>> MakeSweep(CollectiveKind kind,
                                                  DType dtype, int world_size,
                                                  uint64_t min_bytes,
                                                  uint64_t max_bytes,
                                                  uint64_t factor);

// busbw / algbw, as nccl-tests defines it: 2(n-1)/n for all_reduce;
// (n-1)/n for all_gather, reduce_scatter and all_to_all; 1 otherwise.
double BusBandwidthFactor(CollectiveKind kind, int world_size);

// Returns the median of `values` (the mean of the middle two for an even
// count); 0 for an empty vector.
double Median(std::vector<int64_t> values);

// Returns the nearest-rank percentile of `values`: the smallest value with at
// least `fraction` (0..1) of them at or below it; 0 for an empty vector.
// Percentile(v, 0) is the minimum and Percentile(v, 1) the maximum.
int64_t Percentile(std::vector<int64_t> values, double fraction);

// What one rank reports for one sweep point.
struct RankReport {
  int point = 0;  // index into the sweep
  uint64_t bytes = 0;
  uint64_t count = 0;
  std::string plan;    // AlgorithmName of the plan of the timed calls
  uint64_t wrong = 0;  // elements that differed from the expected values
  // Wall time of each timed iteration, in nanoseconds.
  std::vector<int64_t> times_ns;
};

// The report as one protocol line, "result <point> <bytes> <count> <plan>
// <wrong> <n> <t1> ... <tn>" (no newline).
std::string FormatReport(const RankReport& report);

// Parses a line FormatReport wrote. Returns INVALID_ARGUMENT otherwise.
absl::StatusOr<RankReport> ParseReport(absl::string_view line);

// The table row of one sweep point, combined from every rank's report.
struct Row {
  uint64_t bytes = 0;
  uint64_t count = 0;
  std::string plan;  // the ranks' plan, or "a/b" when they disagree
  int iters = 0;
  // Median over iterations of the slowest rank's time for that iteration.
  double time_us = 0;
  // The spread of the same per-iteration times: minimum, 10th and 90th
  // percentiles (Percentile) and maximum.
  double min_us = 0;
  double p10_us = 0;
  double p90_us = 0;
  double max_us = 0;
  double algbw_gbps = 0;
  double busbw_gbps = 0;
  uint64_t wrong = 0;  // summed over ranks
};

// Fills the time and bandwidth fields of `row` (whose bytes are set) from
// the per-iteration times of the slowest rank, in nanoseconds.
void SummarizeTimes(const std::vector<int64_t>& slowest_ns, CollectiveKind kind,
                    int world_size, Row* row);

// Combines the reports of every rank for one point. Returns INVALID_ARGUMENT
// when they disagree on the point, the size or the number of iterations.
absl::StatusOr<Row> CombineReports(const std::vector<RankReport>& reports,
                                   CollectiveKind kind, int world_size);

// The two header lines of the table and one row, nccl-tests style.
std::string TableHeader();
std::string FormatRow(const Row& row, absl::string_view dtype,
                      absl::string_view op);

// The same rows as comma-separated values, for other programs (bench/compare):
// a header line naming the fields and one line per row, times in us.
std::string CsvHeader();
std::string FormatCsvRow(const Row& row);

}  // namespace chorus::bench

#endif  // CHORUS_BENCH_BENCH_UTIL_H_
