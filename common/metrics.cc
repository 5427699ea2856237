#include "common/metrics.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace chorus {
namespace {

// Label values escape backslash, double quote and newline; help text
// backslash and newline.
std::string Escape(const std::string& text, bool quotes) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quotes) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatValue(double value) {
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (std::isnan(value)) return "NaN";
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  return absl::StrCat(value);
}

// `{a="x",b="y"}` for these names and values, plus an optional extra pair
// (a histogram's `le`); empty when there are none.
std::string LabelSet(const std::vector<std::string>& names,
                     const LabelValues& values, const std::string& extra_name,
                     const std::string& extra_value) {
  std::string out;
  const size_t n = std::min(names.size(), values.size());
  for (size_t i = 0; i < n; ++i) {
    absl::StrAppend(&out, out.empty() ? "" : ",", names[i], "=\"",
                    Escape(values[i], true), "\"");
  }
  if (!extra_name.empty()) {
    absl::StrAppend(&out, out.empty() ? "" : ",", extra_name, "=\"",
                    extra_value, "\"");
  }
  return out.empty() ? out : absl::StrCat("{", out, "}");
}

void Header(std::string* out, const std::string& name, const std::string& help,
            const char* type) {
  absl::StrAppend(out, "# HELP ", name, " ", Escape(help, false), "\n",
                  "# TYPE ", name, " ", type, "\n");
}

}  // namespace

Histogram::Histogram(const std::vector<double>* bounds)
    : bounds_(bounds), buckets_(new std::atomic<uint64_t>[bounds->size() + 1]) {
  for (size_t i = 0; i <= bounds_->size(); ++i) buckets_[i] = 0;
}

void Histogram::Observe(double value) {
  const size_t bucket =
      std::lower_bound(bounds_->begin(), bounds_->end(), value) -
      bounds_->begin();
  buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  double sum = sum_.load(std::memory_order_relaxed);
  while (!sum_.compare_exchange_weak(sum, sum + value,
                                     std::memory_order_relaxed)) {
  }
}

std::vector<uint64_t> Histogram::BucketCounts() const {
  std::vector<uint64_t> counts(bounds_->size() + 1);
  for (size_t i = 0; i < counts.size(); ++i) {
    counts[i] = buckets_[i].load(std::memory_order_relaxed);
  }
  return counts;
}

CounterFamily* MetricsRegistry::Counters(const std::string& name,
                                         const std::string& help,
                                         std::vector<std::string> labels,
                                         double scale) {
  absl::MutexLock lock(&mu_);
  CounterEntry& entry = counters_[name];
  if (entry.family == nullptr) {
    entry.family = std::make_unique<CounterFamily>(
        name, help, std::move(labels),
        [] { return std::make_unique<Counter>(); });
    entry.scale = scale;
  }
  return entry.family.get();
}

HistogramFamily* MetricsRegistry::Histograms(const std::string& name,
                                             const std::string& help,
                                             std::vector<std::string> labels,
                                             std::vector<double> bounds) {
  absl::MutexLock lock(&mu_);
  HistogramEntry& entry = histograms_[name];
  if (entry.family == nullptr) {
    entry.bounds = std::make_unique<std::vector<double>>(std::move(bounds));
    std::sort(entry.bounds->begin(), entry.bounds->end());
    const std::vector<double>* kept = entry.bounds.get();
    entry.family = std::make_unique<HistogramFamily>(
        name, help, std::move(labels),
        [kept] { return std::make_unique<Histogram>(kept); });
  }
  return entry.family.get();
}

LevelFamily* MetricsRegistry::Levels(const std::string& name,
                                     const std::string& help,
                                     std::vector<std::string> labels) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<LevelFamily>& family = levels_[name];
  if (family == nullptr) {
    family = std::make_unique<LevelFamily>(name, help, std::move(labels), [] {
      return std::make_unique<Level>();
    });
  }
  return family.get();
}

void MetricsRegistry::Gauge(const std::string& name, const std::string& help,
                            std::vector<std::string> labels,
                            std::function<GaugeSample()> sample) {
  absl::MutexLock lock(&mu_);
  gauges_[name] = GaugeEntry{help, std::move(labels), std::move(sample)};
}

std::string MetricsRegistry::Render() const {
  // Families are never removed, so their pointers outlive the lock; gauge
  // functions are copied so that none runs under it.
  std::map<std::string, std::pair<const CounterFamily*, double>> counters;
  std::map<std::string,
           std::pair<const HistogramFamily*, const std::vector<double>*>>
      histograms;
  std::map<std::string, const LevelFamily*> levels;
  std::map<std::string, GaugeEntry> gauges;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, entry] : counters_) {
      counters[name] = {entry.family.get(), entry.scale};
    }
    for (const auto& [name, entry] : histograms_) {
      histograms[name] = {entry.family.get(), entry.bounds.get()};
    }
    for (const auto& [name, family] : levels_) levels[name] = family.get();
    gauges = gauges_;
  }
  // One text, ordered by name across kinds.
  std::map<std::string, std::string> blocks;
  for (const auto& [name, entry] : counters) {
    const auto& [family, scale] = entry;
    std::string& out = blocks[name];
    Header(&out, name, family->help(), "counter");
    for (const auto& [values, counter] : family->Series()) {
      absl::StrAppend(&out, name, LabelSet(family->labels(), values, "", ""),
                      " ", FormatValue(counter->value() * scale), "\n");
    }
  }
  for (const auto& [name, entry] : histograms) {
    const auto& [family, bounds] = entry;
    std::string& out = blocks[name];
    Header(&out, name, family->help(), "histogram");
    for (const auto& [values, histogram] : family->Series()) {
      const std::vector<uint64_t> counts = histogram->BucketCounts();
      uint64_t cumulative = 0;
      for (size_t i = 0; i < counts.size(); ++i) {
        cumulative += counts[i];
        const std::string le =
            i < bounds->size() ? FormatValue((*bounds)[i]) : "+Inf";
        absl::StrAppend(&out, name, "_bucket",
                        LabelSet(family->labels(), values, "le", le), " ",
                        cumulative, "\n");
      }
      const std::string labels = LabelSet(family->labels(), values, "", "");
      absl::StrAppend(&out, name, "_sum", labels, " ",
                      FormatValue(histogram->sum()), "\n", name, "_count",
                      labels, " ", cumulative, "\n");
    }
  }
  for (const auto& [name, family] : levels) {
    std::string& out = blocks[name];
    Header(&out, name, family->help(), "gauge");
    for (const auto& [values, level] : family->Series()) {
      absl::StrAppend(&out, name, LabelSet(family->labels(), values, "", ""),
                      " ", level->value(), "\n");
    }
  }
  for (const auto& [name, entry] : gauges) {
    std::string& out = blocks[name];
    Header(&out, name, entry.help, "gauge");
    for (const auto& [values, value] : entry.sample()) {
      absl::StrAppend(&out, name, LabelSet(entry.labels, values, "", ""), " ",
                      FormatValue(value), "\n");
    }
  }
  std::string text;
  for (const auto& [name, block] : blocks) text += block;
  return text;
}

MetricsRegistry& DefaultMetrics() {
  static MetricsRegistry* const registry = new MetricsRegistry();
  return *registry;
}

const std::vector<double>& LatencyBuckets() {
  static const std::vector<double>* const bounds = new std::vector<double>{
      25e-6, 50e-6,  100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
      50e-3, 100e-3, 250e-3, 500e-3, 1,      2.5,  5,      10,   30,    60};
  return *bounds;
}

int SizeBucketIndex(uint64_t bytes) {
  static constexpr uint64_t kBounds[kSizeBuckets - 1] = {
      uint64_t{1} << 10, uint64_t{64} << 10, uint64_t{1} << 20,
      uint64_t{16} << 20, uint64_t{256} << 20};
  int index = 0;
  while (index < kSizeBuckets - 1 && bytes > kBounds[index]) ++index;
  return index;
}

const char* SizeBucket(uint64_t bytes) {
  static constexpr const char* kNames[kSizeBuckets] = {
      "1KiB", "64KiB", "1MiB", "16MiB", "256MiB", "larger"};
  return kNames[SizeBucketIndex(bytes)];
}

}  // namespace chorus
