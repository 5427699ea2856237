#include "client/cli/trace_report.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "client/cli/json_string.h"
#include "common/collective.h"
#include "common/rank_list.h"

namespace chorus {
namespace {

bool Called(absl::Time t) { return t != absl::InfinitePast(); }

// The earliest arrival of `entry`; InfinitePast() when nobody called.
absl::Time FirstArrival(const TraceEntry& entry) {
  absl::Time first = absl::InfiniteFuture();
  for (absl::Time t : entry.arrived) {
    if (Called(t)) first = std::min(first, t);
  }
  return first == absl::InfiniteFuture() ? absl::InfinitePast() : first;
}

std::vector<int> Missing(const std::vector<absl::Time>& times) {
  std::vector<int> missing;
  for (size_t r = 0; r < times.size(); ++r) {
    if (!Called(times[r])) missing.push_back(static_cast<int>(r));
  }
  return missing;
}

std::string Micros(absl::Duration d) {
  return absl::StrCat(absl::ToInt64Microseconds(d), "us");
}

int64_t Nanos(absl::Time t) { return Called(t) ? absl::ToUnixNanos(t) : 0; }

// The straggler finding over the last `recent` calls every rank made.
std::string Stragglers(const std::vector<TraceEntry>& entries, int recent) {
  std::map<int, int> last_count;
  std::map<int, absl::Duration> lag;
  int looked = 0;
  for (auto e = entries.rbegin(); e != entries.rend() && looked < recent; ++e) {
    if (e->arrived.size() < 2 || !Missing(e->arrived).empty()) continue;
    ++looked;
    const absl::Time first = FirstArrival(*e);
    const auto last = std::max_element(e->arrived.begin(), e->arrived.end());
    const int rank = static_cast<int>(last - e->arrived.begin());
    ++last_count[rank];
    lag[rank] += *last - first;
  }
  if (looked < 2) return "";
  const auto worst = std::max_element(
      last_count.begin(), last_count.end(),
      [](const auto& a, const auto& b) { return a.second < b.second; });
  // A rank that is last no more often than chance says nothing.
  if (worst->second * 2 <= looked) return "";
  return absl::StrCat(
      "straggler: rank ", worst->first, " arrived last in ", worst->second,
      " of the last ", looked, " calls, on average ",
      Micros(lag[worst->first] / worst->second), " after the first rank");
}

}  // namespace

std::string FormatTrace(const std::vector<TraceEntry>& entries) {
  std::string out;
  for (const TraceEntry& e : entries) {
    if (e.state == TraceEntry::State::kMembershipChanged) {
      absl::StrAppend(&out, "e", e.epoch,
                      " membership changed: ", e.verdict.message(), "\n");
      continue;
    }
    absl::StrAppend(&out, "#", e.sequence, " e", e.epoch, " ",
                    DescribeSpec(e.spec), "  ", TraceStateName(e.state));
    if (e.state != TraceEntry::State::kWaiting &&
        e.plan != Algorithm::kUnspecified) {
      absl::StrAppend(&out, " ", AlgorithmName(e.plan));
    }
    const absl::Time first = FirstArrival(e);
    absl::StrAppend(&out, "  ranks");
    for (size_t r = 0; r < e.arrived.size(); ++r) {
      absl::StrAppend(&out, " ", r, " ",
                      Called(e.arrived[r])
                          ? absl::StrCat("+", Micros(e.arrived[r] - first))
                          : std::string("-"));
    }
    if (e.state == TraceEntry::State::kFailed) {
      absl::StrAppend(
          &out, "  ",
          e.verdict.ToString(absl::StatusToStringMode::kWithNoExtraData));
    }
    out += "\n";
  }
  return out;
}

std::vector<std::string> AnalyzeTrace(const std::vector<TraceEntry>& entries,
                                      int recent, absl::Time now) {
  std::vector<std::string> findings;
  for (const TraceEntry& e : entries) {
    if (e.state == TraceEntry::State::kMembershipChanged) {
      findings.push_back(
          absl::StrCat("epoch ", e.epoch, ": ", e.verdict.message()));
      continue;
    }
    const std::string name = absl::StrCat(CollectiveKindName(e.spec.kind), " #",
                                          e.sequence, " (epoch ", e.epoch, ")");
    const std::vector<int> missing = Missing(e.arrived);
    if (!missing.empty() && e.state == TraceEntry::State::kWaiting) {
      findings.push_back(absl::StrCat(
          name, ": ", FormatRanks(missing), " never called it; the others ",
          "have waited ", absl::FormatDuration(now - FirstArrival(e))));
    } else if (!missing.empty() && e.state == TraceEntry::State::kFailed) {
      findings.push_back(absl::StrCat(
          name, ": ", FormatRanks(missing), " never called it; it ended with ",
          e.verdict.ToString(absl::StatusToStringMode::kWithNoExtraData)));
    }
    std::set<std::string> asked;
    for (const std::string& a : e.asked) {
      if (!a.empty()) asked.insert(a);
    }
    if (asked.size() > 1) {
      std::vector<std::string> account;
      for (size_t r = 0; r < e.asked.size(); ++r) {
        if (!e.asked[r].empty()) {
          account.push_back(absl::StrCat("rank ", r, " ", e.asked[r]));
        }
      }
      findings.push_back(absl::StrCat(
          name, ": ranks disagree: ", absl::StrJoin(account, "; ")));
    }
    if (e.state == TraceEntry::State::kDecided) {
      const std::vector<int> uncommitted = Missing(e.committed);
      if (!uncommitted.empty()) {
        findings.push_back(absl::StrCat(
            name, " (", AlgorithmName(e.plan), "): ", FormatRanks(uncommitted),
            " did not finish it yet; decided ",
            absl::FormatDuration(now - e.decided), " ago"));
      }
    }
  }
  if (!entries.empty() && entries.back().state == TraceEntry::State::kFailed &&
      Missing(entries.back().arrived).empty()) {
    const TraceEntry& e = entries.back();
    findings.push_back(absl::StrCat(
        "last call ", CollectiveKindName(e.spec.kind), " #", e.sequence,
        " failed: ",
        e.verdict.ToString(absl::StatusToStringMode::kWithNoExtraData)));
  }
  if (std::string s = Stragglers(entries, recent); !s.empty()) {
    findings.push_back(s);
  }
  return findings;
}

std::string TraceJson(const std::string& group,
                      const std::vector<TraceEntry>& entries) {
  std::string out =
      absl::StrCat("{\"pg_name\": ", JsonString(group), ", \"entries\": [");
  for (size_t i = 0; i < entries.size(); ++i) {
    const TraceEntry& e = entries[i];
    const std::string dtype(DTypeName(e.spec.dtype));
    absl::StrAppend(
        &out, i == 0 ? "" : ", ", "{\"record_id\": ", e.record_id,
        ", \"pg_name\": ", JsonString(group), ", \"epoch\": ", e.epoch,
        ", \"collective_seq_id\": ", e.sequence, ", \"profiling_name\": ",
        JsonString(
            e.state == TraceEntry::State::kMembershipChanged
                ? std::string("chorus:membership_changed")
                : absl::StrCat("chorus:", CollectiveKindName(e.spec.kind))),
        ", \"time_created_ns\": ", Nanos(FirstArrival(e)),
        ", \"time_discovered_started_ns\": ", Nanos(e.decided),
        ", \"time_discovered_completed_ns\": ", Nanos(e.ended),
        ", \"state\": ", JsonString(TraceStateName(e.state)),
        ", \"input_sizes\": [[", e.spec.count, "]], \"input_dtypes\": [",
        JsonString(dtype), "], \"plan\": ", JsonString(AlgorithmName(e.plan)),
        ", \"code\": ", static_cast<int>(e.verdict.code()),
        ", \"message\": ", JsonString(std::string(e.verdict.message())),
        ", \"ranks\": [");
    for (size_t r = 0; r < e.arrived.size(); ++r) {
      absl::StrAppend(&out, r == 0 ? "" : ", ", "{\"rank\": ", r,
                      ", \"time_called_ns\": ", Nanos(e.arrived[r]),
                      ", \"asked\": ", JsonString(e.asked[r]),
                      ", \"time_committed_ns\": ", Nanos(e.committed[r]), "}");
    }
    out += "]}";
  }
  return out + "]}\n";
}

}  // namespace chorus
