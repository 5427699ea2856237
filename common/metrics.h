// Metrics: the counters, histograms and gauges a daemon exports to
// Prometheus, and their rendering in Prometheus's text exposition format
// (version 0.0.4). A family is one metric name with a fixed list of label
// names; each distinct list of label values is one series, made on first use
// and kept for the life of the registry.
//
// The hot paths only add to atomics: a caller that updates the same series
// often keeps the pointer With() returned (stable for the registry's life).
// Gauges are not stored: each is a function the registry calls when it
// renders, so it reads the daemon's state as it is at scrape time.
//
// Lifecycle: a daemon uses the process's registry (DefaultMetrics()), whose
// families are made on first use and never removed. Tests may make their own.
// Thread safety: every method is thread-safe; gauge functions run on the
// thread that renders, with no registry lock held.
#ifndef CHORUS_COMMON_METRICS_H_
#define CHORUS_COMMON_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace chorus {

using LabelValues = std::vector<std::string>;

// A monotonically increasing count (events, bytes, nanoseconds).
class Counter {
 public:
  void Add(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A value that goes up and down (open connections), exported as a gauge.
class Level {
 public:
  void Add(int64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  void Sub(int64_t n = 1) { value_.fetch_sub(n, std::memory_order_relaxed); }
  int64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> value_{0};
};

// Observations counted into fixed buckets (upper bounds, ascending), with
// their count and sum.
class Histogram {
 public:
  explicit Histogram(const std::vector<double>* bounds);

  void Observe(double value);
  void ObserveDuration(absl::Duration d) { Observe(absl::ToDoubleSeconds(d)); }

  // Observations at or below each bound (not cumulative), then above all.
  std::vector<uint64_t> BucketCounts() const;
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  const std::vector<double>* const bounds_;  // owned by the family
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0};
};

// One metric name's series, by label values.
template <typename Metric>
class MetricFamily {
 public:
  MetricFamily(std::string name, std::string help,
               std::vector<std::string> labels,
               std::function<std::unique_ptr<Metric>()> make)
      : name_(std::move(name)),
        help_(std::move(help)),
        labels_(std::move(labels)),
        make_(std::move(make)) {}

  // The series with these label values (one per label name, in order),
  // made on first use. The pointer stays valid for the family's life.
  Metric* With(const LabelValues& values) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<Metric>& metric = series_[values];
    if (metric == nullptr) metric = make_();
    return metric.get();
  }

  // Every series made so far, ordered by label values.
  std::vector<std::pair<LabelValues, const Metric*>> Series() const
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    std::vector<std::pair<LabelValues, const Metric*>> out;
    out.reserve(series_.size());
    for (const auto& [values, metric] : series_) {
      out.emplace_back(values, metric.get());
    }
    return out;
  }

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  const std::vector<std::string>& labels() const { return labels_; }

 private:
  const std::string name_;
  const std::string help_;
  const std::vector<std::string> labels_;
  const std::function<std::unique_ptr<Metric>()> make_;
  mutable absl::Mutex mu_;
  std::map<LabelValues, std::unique_ptr<Metric>> series_ ABSL_GUARDED_BY(mu_);
};

using CounterFamily = MetricFamily<Counter>;
using HistogramFamily = MetricFamily<Histogram>;
using LevelFamily = MetricFamily<Level>;

// A gauge's values at one moment, by label values.
using GaugeSample = std::vector<std::pair<LabelValues, double>>;

class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // The counter family `name` (it should end in `_total`), made on the
  // first call; later calls with the same name return the same family.
  // Rendered values are the counts times `scale` (1e-9 for a count of
  // nanoseconds exported as `_seconds_total`).
  CounterFamily* Counters(const std::string& name, const std::string& help,
                          std::vector<std::string> labels, double scale = 1);

  // The histogram family `name` with these bucket upper bounds (ascending;
  // +Inf is implied), made on the first call as Counters().
  HistogramFamily* Histograms(const std::string& name, const std::string& help,
                              std::vector<std::string> labels,
                              std::vector<double> bounds);

  // The family of stored gauges `name` (Level), made on the first call as
  // Counters().
  LevelFamily* Levels(const std::string& name, const std::string& help,
                      std::vector<std::string> labels);

  // Adds gauge `name`, whose series `sample` returns at every render.
  // A second gauge of the same name replaces the first.
  void Gauge(const std::string& name, const std::string& help,
             std::vector<std::string> labels,
             std::function<GaugeSample()> sample);

  // Every family in the text exposition format, ordered by name.
  std::string Render() const;

  // Whether the daemon's record functions (collective_metrics.h) count;
  // true by default. Off only to measure what counting costs.
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  void set_enabled(bool on) { enabled_.store(on, std::memory_order_relaxed); }

 private:
  struct CounterEntry {
    std::unique_ptr<CounterFamily> family;
    double scale = 1;
  };
  struct HistogramEntry {
    std::unique_ptr<HistogramFamily> family;
    std::unique_ptr<std::vector<double>> bounds;
  };
  struct GaugeEntry {
    std::string help;
    std::vector<std::string> labels;
    std::function<GaugeSample()> sample;
  };

  std::atomic<bool> enabled_{true};
  mutable absl::Mutex mu_;
  std::map<std::string, CounterEntry> counters_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, HistogramEntry> histograms_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<LevelFamily>> levels_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, GaugeEntry> gauges_ ABSL_GUARDED_BY(mu_);
};

// The process's registry, which the daemons export.
MetricsRegistry& DefaultMetrics();

// Bucket bounds, in seconds, for the latency of a collective or an RPC:
// 25 us to 60 s.
const std::vector<double>& LatencyBuckets();

// The payload-size label of a collective of `bytes` per rank: "1KiB",
// "64KiB", "1MiB", "16MiB", "256MiB" (the smallest bound at or above it), or
// "larger".
const char* SizeBucket(uint64_t bytes);

// How many size buckets there are, and the index of SizeBucket(bytes) among
// them (0 for "1KiB" ... kSizeBuckets - 1 for "larger").
inline constexpr int kSizeBuckets = 6;
int SizeBucketIndex(uint64_t bytes);

}  // namespace chorus

#endif  // CHORUS_COMMON_METRICS_H_
