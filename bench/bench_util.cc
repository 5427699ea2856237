#include "bench/bench_util.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace chorus::bench {

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text) {
  const absl::string_view original = text;
  auto invalid = [original] {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad byte size \"", original, "\"; want e.g. 8, 64K, 64M or 1G"));
  };
  size_t digits = 0;
  while (digits < text.size() &&
         absl::ascii_isdigit(static_cast<unsigned char>(text[digits]))) {
    ++digits;
  }
  if (digits == 0) return invalid();
  uint64_t value = 0;
  if (!absl::SimpleAtoi(text.substr(0, digits), &value)) return invalid();
  std::string suffix = absl::AsciiStrToLower(text.substr(digits));
  int shift = 0;
  if (!suffix.empty()) {
    switch (suffix[0]) {
      case 'k':
        shift = 10;
        break;
      case 'm':
        shift = 20;
        break;
      case 'g':
        shift = 30;
        break;
      case 'b':
        break;
      default:
        return invalid();
    }
    const absl::string_view rest =
        absl::string_view(suffix).substr(suffix[0] == 'b' ? 0 : 1);
    if (!(rest.empty() || rest == "b" || (shift > 0 && rest == "ib"))) {
      return invalid();
    }
  }
  if (shift > 0 && value > (std::numeric_limits<uint64_t>::max() >> shift)) {
    return invalid();
  }
  return value << shift;
}

std::string FormatByteSize(uint64_t bytes) {
  if (bytes != 0) {
    for (const auto& [shift, suffix] :
         {std::pair<int, const char*>{30, "G"}, {20, "M"}, {10, "K"}}) {
      if (bytes % (uint64_t{1} << shift) == 0) {
        return absl::StrCat(bytes >> shift, suffix);
      }
    }
  }
  return absl::StrCat(bytes);
}

int BlocksPerSize(CollectiveKind kind, int world_size) {
  switch (kind) {
    case CollectiveKind::kAllGather:
    case CollectiveKind::kGather:
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kScatter:
    case CollectiveKind::kAllToAll:
      return world_size;
    default:
      return 1;
  }
}

absl::StatusOr<std::vector<SweepPoint>> MakeSweep(CollectiveKind kind,
                                                  DType dtype, int world_size,
                                                  uint64_t min_bytes,
                                                  uint64_t max_bytes,
                                                  uint64_t factor) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the world size must be at least 1, not ", world_size));
  }
  if (kind == CollectiveKind::kBarrier) return std::vector<SweepPoint>{{0, 0}};
  const uint64_t element = DTypeSize(dtype);
  if (element == 0) {
    return absl::InvalidArgumentError("invalid dtype for the sweep");
  }
  if (min_bytes > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("--min_bytes (", min_bytes,
                                                   ") is above --max_bytes (",
                                                   max_bytes, ")"));
  }
  if (factor < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("the step factor must be at least 2, not ", factor));
  }
  const uint64_t unit =
      element * static_cast<uint64_t>(BlocksPerSize(kind, world_size));
  std::vector<SweepPoint> points;
  uint64_t size = std::max<uint64_t>(min_bytes, 1);
  while (true) {
    const uint64_t count = size / unit;
    if (count > 0 && (points.empty() || points.back().count != count)) {
      points.push_back({count * unit, count});
    }
    if (size > max_bytes / factor) break;
    size *= factor;
  }
  if (points.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no size between ", min_bytes, " and ", max_bytes,
                     " bytes holds one element per rank (", unit, " bytes)"));
  }
  return points;
}

double BusBandwidthFactor(CollectiveKind kind, int world_size) {
  const double n = world_size;
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return 2.0 * (n - 1) / n;
    case CollectiveKind::kAllGather:
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllToAll:
      return (n - 1) / n;
    default:
      return 1.0;
  }
}

double Median(std::vector<int64_t> values) {
  if (values.empty()) return 0;
  const size_t middle = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + middle, values.end());
  const double upper = static_cast<double>(values[middle]);
  if (values.size() % 2 == 1) return upper;
  const int64_t lower =
      *std::max_element(values.begin(), values.begin() + middle);
  return (static_cast<double>(lower) + upper) / 2;
}

int64_t Percentile(std::vector<int64_t> values, double fraction) {
  if (values.empty()) return 0;
  const double n = static_cast<double>(values.size());
  // The epsilon keeps e.g. 0.9 * 10 from rounding up to the next rank.
  const double wanted = std::ceil(std::clamp(fraction, 0.0, 1.0) * n - 1e-9);
  const size_t index = static_cast<size_t>(std::clamp(wanted, 1.0, n)) - 1;
  std::nth_element(values.begin(), values.begin() + index, values.end());
  return values[index];
}

std::string FormatReport(const RankReport& report) {
  return absl::StrCat(
      "result ", report.point, " ", report.bytes, " ", report.count, " ",
      report.plan, " ", report.wrong, " ", report.times_ns.size(),
      report.times_ns.empty() ? "" : " ", absl::StrJoin(report.times_ns, " "));
}

absl::StatusOr<RankReport> ParseReport(absl::string_view line) {
  const std::vector<absl::string_view> fields =
      absl::StrSplit(line, ' ', absl::SkipEmpty());
  auto invalid = [line] {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed rank report \"", line.substr(0, 80), "\""));
  };
  if (fields.size() < 7 || fields[0] != "result") return invalid();
  RankReport report;
  uint64_t n = 0;
  if (!absl::SimpleAtoi(fields[1], &report.point) ||
      !absl::SimpleAtoi(fields[2], &report.bytes) ||
      !absl::SimpleAtoi(fields[3], &report.count) ||
      !absl::SimpleAtoi(fields[5], &report.wrong) ||
      !absl::SimpleAtoi(fields[6], &n) || fields.size() != 7 + n) {
    return invalid();
  }
  report.plan = std::string(fields[4]);
  report.times_ns.resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    if (!absl::SimpleAtoi(fields[7 + i], &report.times_ns[i])) {
      return invalid();
    }
  }
  return report;
}

absl::StatusOr<Row> CombineReports(const std::vector<RankReport>& reports,
                                   CollectiveKind kind, int world_size) {
  if (reports.empty()) return absl::InvalidArgumentError("no rank reports");
  const RankReport& first = reports.front();
  Row row;
  row.bytes = first.bytes;
  row.count = first.count;
  std::vector<std::string> plans;
  row.iters = static_cast<int>(first.times_ns.size());
  for (const RankReport& r : reports) {
    if (r.point != first.point || r.bytes != first.bytes ||
        r.count != first.count || r.times_ns.size() != first.times_ns.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ranks disagree on point ", first.point, ": ", r.bytes,
                       " bytes x ", r.times_ns.size(), " iterations against ",
                       first.bytes, " x ", first.times_ns.size()));
    }
    if (std::find(plans.begin(), plans.end(), r.plan) == plans.end()) {
      plans.push_back(r.plan);
    }
    row.wrong += r.wrong;
  }
  row.plan = absl::StrJoin(plans, "/");
  // For each iteration the slowest rank's time, then the median of those.
  std::vector<int64_t> slowest(first.times_ns.size(), 0);
  for (const RankReport& r : reports) {
    for (size_t i = 0; i < slowest.size(); ++i) {
      slowest[i] = std::max(slowest[i], r.times_ns[i]);
    }
  }
  SummarizeTimes(slowest, kind, world_size, &row);
  return row;
}

void SummarizeTimes(const std::vector<int64_t>& slowest_ns, CollectiveKind kind,
                    int world_size, Row* row) {
  row->iters = static_cast<int>(slowest_ns.size());
  row->time_us = Median(slowest_ns) / 1e3;
  row->min_us = static_cast<double>(Percentile(slowest_ns, 0)) / 1e3;
  row->p10_us = static_cast<double>(Percentile(slowest_ns, 0.1)) / 1e3;
  row->p90_us = static_cast<double>(Percentile(slowest_ns, 0.9)) / 1e3;
  row->max_us = static_cast<double>(Percentile(slowest_ns, 1)) / 1e3;
  row->algbw_gbps = 0;
  row->busbw_gbps = 0;
  if (row->time_us > 0) {
    // bytes / us / 1e3 = GB/s (1 GB = 1e9 bytes).
    row->algbw_gbps = static_cast<double>(row->bytes) / row->time_us / 1e3;
    row->busbw_gbps = row->algbw_gbps * BusBandwidthFactor(kind, world_size);
  }
}

std::string TableHeader() {
  return absl::StrFormat(
      "#%11s %12s %5s %5s %18s %11s %9s %9s %7s %6s\n"
      "#%11s %12s %5s %5s %18s %11s %9s %9s %7s %6s\n",
      "size", "count", "type", "redop", "plan", "time", "algbw", "busbw",
      "#wrong", "iters", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)",
      "(GB/s)", "", "");
}

std::string FormatRow(const Row& row, absl::string_view dtype,
                      absl::string_view op) {
  return absl::StrFormat("%12d %12d %5s %5s %18s %11.1f %9.3f %9.3f %7d %6d\n",
                         row.bytes, row.count, dtype, op, row.plan, row.time_us,
                         row.algbw_gbps, row.busbw_gbps, row.wrong, row.iters);
}

std::string CsvHeader() {
  return "bytes,count,plan,iters,time_us,min_us,p10_us,p90_us,max_us,"
         "algbw_gbps,busbw_gbps,wrong\n";
}

std::string FormatCsvRow(const Row& row) {
  return absl::StrFormat("%d,%d,%s,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%.6f,%.6f,%d\n",
                         row.bytes, row.count, row.plan, row.iters, row.time_us,
                         row.min_us, row.p10_us, row.p90_us, row.max_us,
                         row.algbw_gbps, row.busbw_gbps, row.wrong);
}

}  // namespace chorus::bench
