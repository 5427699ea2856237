#include "common/collective_metrics.h"

#include <atomic>
#include <string>

#include "common/collective.h"
#include "common/dtype.h"
#include "common/metrics.h"

namespace chorus {

namespace {

// Every series a call can land in, by enum value, so that counting a call
// costs two atomic loads and adds instead of label lookups.
constexpr int kKinds = 10;  // CollectiveKind 0..9
constexpr int kPlans = 8;   // Algorithm 0..7
constexpr int kCodes = 17;  // absl::StatusCode 0..16

struct CollectiveSeries {
  CounterFamily* calls = DefaultMetrics().Counters(
      "chorus_collectives_total",
      "Collective calls that ended, by kind, plan and status code.",
      {"kind", "plan", "code"});
  HistogramFamily* seconds = DefaultMetrics().Histograms(
      "chorus_collective_seconds",
      "Time from a collective's call to its result, by kind and payload "
      "size (count times the element size, rounded up to a bucket).",
      {"kind", "size"}, LatencyBuckets());
  std::atomic<Counter*> call_slots[kKinds][kPlans][kCodes] = {};
  std::atomic<Histogram*> time_slots[kKinds][kSizeBuckets] = {};
};

CollectiveSeries& Series() {
  static CollectiveSeries* const series = new CollectiveSeries();
  return *series;
}

// The series in `*slot` (null: none, for values outside the enums), made
// with `make` on first use; every thread that races here gets the same one.
template <typename Metric, typename Make>
Metric* Cached(std::atomic<Metric*>* slot, const Make& make) {
  if (slot == nullptr) return make();
  Metric* metric = slot->load(std::memory_order_acquire);
  if (metric == nullptr) {
    metric = make();
    slot->store(metric, std::memory_order_release);
  }
  return metric;
}

}  // namespace

void RecordCollective(const CollectiveSpec& spec, Algorithm plan,
                      absl::StatusCode code, absl::Duration took) {
  CollectiveSeries& series = Series();
  if (!DefaultMetrics().enabled()) return;
  const int kind = static_cast<int>(spec.kind);
  const int algorithm = static_cast<int>(plan);
  const int status = static_cast<int>(code);
  const bool known = kind >= 0 && kind < kKinds && algorithm >= 0 &&
                     algorithm < kPlans && status >= 0 && status < kCodes;
  Cached(known ? &series.call_slots[kind][algorithm][status] : nullptr, [&] {
    return series.calls->With({std::string(CollectiveKindName(spec.kind)),
                               std::string(AlgorithmName(plan)),
                               absl::StatusCodeToString(code)});
  })->Add();
  if (took < absl::ZeroDuration() || took == absl::InfiniteDuration()) return;
  const uint64_t bytes = spec.count * DTypeSize(spec.dtype);
  Cached(known ? &series.time_slots[kind][SizeBucketIndex(bytes)] : nullptr,
         [&] {
           return series.seconds->With(
               {std::string(CollectiveKindName(spec.kind)), SizeBucket(bytes)});
         })
      ->ObserveDuration(took);
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
