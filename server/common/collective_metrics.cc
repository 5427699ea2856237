#include "server/common/collective_metrics.h"

#include <string>

#include "server/common/collective.h"
#include "server/common/metrics.h"
#include "server/reduce/dtype.h"

namespace chorus {

void RecordCollective(const CollectiveSpec& spec, Algorithm plan,
                      absl::StatusCode code, absl::Duration took) {
  static CounterFamily* const calls = DefaultMetrics().Counters(
      "chorus_collectives_total",
      "Collective calls that ended, by kind, plan and status code.",
      {"kind", "plan", "code"});
  static HistogramFamily* const seconds = DefaultMetrics().Histograms(
      "chorus_collective_seconds",
      "Time from a collective's call to its result, by kind and payload "
      "size (count times the element size, rounded up to a bucket).",
      {"kind", "size"}, LatencyBuckets());
  if (!DefaultMetrics().enabled()) return;
  const std::string kind(CollectiveKindName(spec.kind));
  calls
      ->With({kind, std::string(AlgorithmName(plan)),
              absl::StatusCodeToString(code)})
      ->Add();
  if (took < absl::ZeroDuration() || took == absl::InfiniteDuration()) return;
  const uint64_t bytes = spec.count * DTypeSize(spec.dtype);
  seconds->With({kind, SizeBucket(bytes)})->ObserveDuration(took);
}

Level* DataPlaneConnections(const char* direction) {
  static LevelFamily* const family = DefaultMetrics().Levels(
      "chorus_data_plane_connections",
      "Open TCP data-plane connections, by direction (in: accepted from "
      "peers, out: made to peers).",
      {"direction"});
  return family->With({direction});
}

void RecordReduce(const char* engine, uint64_t bytes, absl::Duration took) {
  static CounterFamily* const reduced = DefaultMetrics().Counters(
      "chorus_reduce_bytes_total",
      "Bytes the reduce engine combined (each input counted once), by engine.",
      {"engine"});
  static CounterFamily* const nanos = DefaultMetrics().Counters(
      "chorus_reduce_seconds_total",
      "Time the reduce engine spent combining, by engine (cpu only).",
      {"engine"}, 1e-9);
  if (!DefaultMetrics().enabled()) return;
  reduced->With({engine})->Add(bytes);
  if (took >= absl::ZeroDuration()) {
    nanos->With({engine})->Add(absl::ToInt64Nanoseconds(took));
  }
}

}  // namespace chorus
