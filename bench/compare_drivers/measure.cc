#include "bench/compare_drivers/measure.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "bench/bench_util.h"
#include "common/collective.h"

ABSL_FLAG(std::string, sizes, "8,64K,1M,64M",
          "Comma-separated sizes in bytes, e.g. 8,64K,1M,64M (whole f32s).");
ABSL_FLAG(int32_t, iters, 0,
          "Timed iterations per size; 0 adapts them to --time_per_size.");
ABSL_FLAG(int32_t, warmup, -1,
          "Warm-up calls per size; -1: one, plus up to four more that fit "
          "in a tenth of --time_per_size.");
ABSL_FLAG(absl::Duration, time_per_size, absl::Seconds(1),
          "With --iters=0: the timed iterations of one size aim at this.");
ABSL_FLAG(int32_t, min_iters, 3, "With --iters=0: at least this many.");
ABSL_FLAG(int32_t, max_iters, 1000, "With --iters=0: at most this many.");
ABSL_FLAG(bool, check, true,
          "Check the first warm-up and the last timed result of each size.");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(60),
          "Deadline of connecting and of every collective, where the system "
          "has one (Gloo).");

namespace chorus::bench::compare {
namespace {

using SteadyClock = std::chrono::steady_clock;

// Wrong elements of `out` against the expected sums.
int64_t CountWrong(const std::vector<float>& out, size_t count, int world) {
  int64_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    if (out[i] != ExpectedSum(world, i)) ++wrong;
  }
  return wrong;
}

}  // namespace

absl::StatusOr<Rules> RulesFromFlags() {
  Rules rules;
  for (absl::string_view text :
       absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',', absl::SkipEmpty())) {
    absl::StatusOr<uint64_t> bytes = ParseByteSize(text);
    if (!bytes.ok()) return bytes.status();
    if (*bytes < sizeof(float) || *bytes % sizeof(float) != 0 ||
        *bytes / sizeof(float) > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat("size ", text, " is not a whole number of f32"));
    }
    rules.sizes.push_back(*bytes);
  }
  if (rules.sizes.empty()) return absl::InvalidArgumentError("no --sizes");
  rules.iters = absl::GetFlag(FLAGS_iters);
  rules.warmup = absl::GetFlag(FLAGS_warmup);
  rules.time_per_size = absl::GetFlag(FLAGS_time_per_size);
  rules.min_iters = absl::GetFlag(FLAGS_min_iters);
  rules.max_iters = absl::GetFlag(FLAGS_max_iters);
  rules.check = absl::GetFlag(FLAGS_check);
  if (rules.iters < 0 || rules.warmup < -1 || rules.min_iters < 1 ||
      rules.max_iters < rules.min_iters ||
      (rules.iters == 0 && rules.warmup == 0) ||
      rules.time_per_size <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "want --iters >= 0, --warmup >= -1 (>= 1 with --iters=0), "
        "1 <= --min_iters <= --max_iters and a positive --time_per_size");
  }
  return rules;
}

float InputValue(int rank, size_t index) {
  return static_cast<float>((rank + 1) * static_cast<int>(index % 7 + 1));
}

float ExpectedSum(int world_size, size_t index) {
  return static_cast<float>(world_size * (world_size + 1) / 2 *
                            static_cast<int>(index % 7 + 1));
}

uint64_t RunSizes(Collectives& system, const Rules& rules,
                  const std::string& plan) {
  const int rank = system.rank();
  const int world = system.world_size();
  const size_t max_count =
      *std::max_element(rules.sizes.begin(), rules.sizes.end()) / sizeof(float);
  // Inputs never change: fill the largest once and use prefixes.
  std::vector<float> input(max_count);
  for (size_t i = 0; i < max_count; ++i) input[i] = InputValue(rank, i);
  std::vector<float> output(max_count);
  if (rank == 0) {
    std::fputs(CsvHeader().c_str(), stdout);
    std::fflush(stdout);
  }
  uint64_t wrong_total = 0;
  for (uint64_t bytes : rules.sizes) {
    const size_t count = bytes / sizeof(float);
    auto run_once = [&]() -> int64_t {
      const SteadyClock::time_point start = SteadyClock::now();
      system.AllReduceSum(input.data(), output.data(), count);
      const SteadyClock::time_point end = SteadyClock::now();
      return std::chrono::duration_cast<std::chrono::nanoseconds>(end - start)
          .count();
    };
    // A result left from an earlier size or call must not pass the check.
    auto poison = [&] {
      if (rules.check) {
        std::fill(output.begin(), output.begin() + count, std::nanf(""));
      }
    };
    auto count_wrong = [&]() -> int64_t {
      return rules.check ? CountWrong(output, count, world) : 0;
    };

    int64_t wrong = 0;
    int64_t estimate_ns = 0;
    if (rules.warmup != 0) {
      poison();
      const int64_t first = run_once();
      wrong += count_wrong();
      estimate_ns = std::max<int64_t>(1, system.AgreeMax(first));
      const int extra =
          rules.warmup > 0
              ? rules.warmup - 1
              : static_cast<int>(std::min<int64_t>(
                    4, absl::ToInt64Nanoseconds(rules.time_per_size / 10) /
                           estimate_ns));
      if (extra > 0) {
        int64_t total = 0;
        for (int i = 0; i < extra; ++i) total += run_once();
        estimate_ns = std::max<int64_t>(1, system.AgreeMax(total / extra));
      }
    }
    // Every rank computes the same count from the agreed estimate.
    const int iters =
        rules.iters > 0
            ? rules.iters
            : static_cast<int>(std::clamp<int64_t>(
                  absl::ToInt64Nanoseconds(rules.time_per_size) / estimate_ns,
                  rules.min_iters, rules.max_iters));
    poison();
    system.Barrier();
    std::vector<int64_t> times_ns(iters);
    for (int i = 0; i < iters; ++i) times_ns[i] = run_once();
    wrong += count_wrong();

    // For each iteration the slowest rank's time, as chorus-bench counts.
    system.MaxAtRoot(times_ns);
    wrong = system.AgreeSum(wrong);
    wrong_total += static_cast<uint64_t>(wrong);
    if (rank == 0) {
      Row row;
      row.bytes = bytes;
      row.count = count;
      row.plan = plan;
      row.wrong = static_cast<uint64_t>(wrong);
      SummarizeTimes(times_ns, CollectiveKind::kAllReduce, world, &row);
      std::fputs(FormatCsvRow(row).c_str(), stdout);
      std::fflush(stdout);
    }
  }
  return wrong_total;
}

}  // namespace chorus::bench::compare
