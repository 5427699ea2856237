// chorus-compare-memcpy: single-thread memcpy bandwidth, one of the machine
// limits bench/compare prints next to the collectives. Copies one buffer of
// --bytes (64 MiB) into another, back to back for --seconds, and prints the
// median rate of the copies as "memcpy_gbps,<GB/s>" (bytes copied per
// second, 1 GB = 1e9 bytes; reads and writes are not counted twice).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/bench_util.h"

ABSL_FLAG(std::string, bytes, "64M", "Size of each buffer, e.g. 64M.");
ABSL_FLAG(absl::Duration, seconds, absl::Seconds(1),
          "How long to keep copying (at least 5 copies).");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "chorus-compare-memcpy: single-thread memcpy bandwidth.\n"
      "Usage: chorus-compare-memcpy [--bytes=64M] [--seconds=1s]");
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<uint64_t> bytes =
      chorus::bench::ParseByteSize(absl::GetFlag(FLAGS_bytes));
  if (!bytes.ok() || *bytes == 0) {
    std::fprintf(stderr, "chorus-compare-memcpy: bad --bytes\n");
    return 2;
  }
  // Touch every page first so page faults stay out of the timing.
  std::vector<char> from(*bytes, 1);
  std::vector<char> to(*bytes, 0);
  using Clock = std::chrono::steady_clock;
  const Clock::time_point end =
      Clock::now() + std::chrono::nanoseconds(absl::ToInt64Nanoseconds(
                         absl::GetFlag(FLAGS_seconds)));
  std::vector<int64_t> times_ns;
  while (times_ns.size() < 5 || Clock::now() < end) {
    from[times_ns.size() % from.size()] = static_cast<char>(times_ns.size());
    const Clock::time_point start = Clock::now();
    std::memcpy(to.data(), from.data(), to.size());
    times_ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(
                           Clock::now() - start)
                           .count());
  }
  // Read the destination so the copies cannot be optimized away.
  if (to[(times_ns.size() - 1) % to.size()] !=
      static_cast<char>(times_ns.size() - 1)) {
    std::fprintf(stderr, "chorus-compare-memcpy: copy check failed\n");
    return 1;
  }
  const double median_ns = chorus::bench::Median(times_ns);
  std::printf("memcpy_gbps,%.3f\n", static_cast<double>(*bytes) / median_ns);
  return 0;
}
