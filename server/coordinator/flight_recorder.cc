#include "server/coordinator/flight_recorder.h"

#include <algorithm>
#include <utility>

#include "common/collective.h"
#include "common/collective_metrics.h"

namespace chorus {
namespace {

// Counts the entry's call as ended now (chorus_collectives_total and
// chorus_collective_seconds, from its first rank's arrival).
void CountEnded(const TraceEntry& entry) {
  absl::Time first = absl::InfiniteFuture();
  for (absl::Time arrived : entry.arrived) {
    if (arrived != absl::InfinitePast()) first = std::min(first, arrived);
  }
  RecordCollective(entry.spec, entry.plan, entry.verdict.code(),
                   entry.ended - first);
}

bool HasEnded(const TraceEntry& entry) {
  return entry.state == TraceEntry::State::kCompleted ||
         entry.state == TraceEntry::State::kFailed ||
         entry.state == TraceEntry::State::kMembershipChanged;
}

}  // namespace

FlightRecorder::FlightRecorder(size_t per_group, size_t groups,
                               size_t rank_records)
    : per_group_(per_group), groups_(groups), rank_records_(rank_records) {}

TraceEntry* FlightRecorder::Find(const std::string& group, uint64_t epoch,
                                 uint64_t sequence) {
  auto it = traces_.find(group);
  if (it == traces_.end()) return nullptr;
  auto found = it->second.index.find({epoch, sequence});
  return found == it->second.index.end() ? nullptr : found->second;
}

TraceEntry* FlightRecorder::Add(const std::string& group, uint64_t epoch,
                                int world, uint64_t sequence,
                                const CollectiveSpec& spec) {
  GroupTrace& trace = traces_[group];
  trace.last_used = next_record_;
  TraceEntry fresh;
  fresh.record_id = next_record_++;
  fresh.epoch = epoch;
  fresh.sequence = sequence;
  fresh.spec = spec;
  fresh.arrived.assign(world, absl::InfinitePast());
  fresh.asked.assign(world, "");
  fresh.committed.assign(world, absl::InfinitePast());
  trace.entries.push_back(std::move(fresh));
  trace.rank_records += world;
  TraceEntry* entry = &trace.entries.back();
  trace.index[{epoch, sequence}] = entry;
  while (trace.entries.size() > per_group_ ||
         (trace.entries.size() > 1 && trace.rank_records > rank_records_)) {
    const TraceEntry& oldest = trace.entries.front();
    trace.rank_records -= oldest.arrived.size();
    trace.index.erase({oldest.epoch, oldest.sequence});
    trace.entries.pop_front();
  }
  // Forget the group used longest ago when over the limit.
  while (traces_.size() > groups_) {
    auto oldest = traces_.begin();
    for (auto it = traces_.begin(); it != traces_.end(); ++it) {
      if (it->second.last_used < oldest->second.last_used) oldest = it;
    }
    if (oldest->first == group) break;
    traces_.erase(oldest);
  }
  return entry;
}

void FlightRecorder::Arrived(const std::string& group, uint64_t epoch,
                             int world, uint64_t sequence, int rank,
                             const CollectiveSpec& spec, absl::Time now) {
  if (per_group_ == 0) return;
  TraceEntry* entry = Find(group, epoch, sequence);
  if (entry == nullptr) entry = Add(group, epoch, world, sequence, spec);
  if (rank < 0 || rank >= static_cast<int>(entry->arrived.size())) return;
  entry->arrived[rank] = now;
  // Described when read (Entries), unless it differs from the first
  // caller's: no formatting on the matcher's path for agreeing calls.
  if (!SpecsAgree(spec, entry->spec)) entry->asked[rank] = DescribeSpec(spec);
}

void FlightRecorder::Decided(const std::string& group, uint64_t epoch,
                             uint64_t sequence, Algorithm plan,
                             absl::Time now) {
  TraceEntry* entry = Find(group, epoch, sequence);
  if (entry == nullptr) return;
  entry->state = TraceEntry::State::kDecided;
  entry->decided = now;
  entry->plan = plan;
  if (plan == Algorithm::kInline) {
    entry->state = TraceEntry::State::kCompleted;
    entry->ended = now;
    CountEnded(*entry);
  }
}

void FlightRecorder::Committed(const std::string& group, uint64_t epoch,
                               uint64_t sequence, int rank, absl::Time now) {
  TraceEntry* entry = Find(group, epoch, sequence);
  if (entry == nullptr || rank < 0 ||
      rank >= static_cast<int>(entry->committed.size())) {
    return;
  }
  entry->committed[rank] = now;
}

void FlightRecorder::Ended(const std::string& group, uint64_t epoch,
                           uint64_t sequence, const absl::Status& verdict,
                           absl::Time now) {
  TraceEntry* entry = Find(group, epoch, sequence);
  if (entry == nullptr || HasEnded(*entry)) return;
  entry->state =
      verdict.ok() ? TraceEntry::State::kCompleted : TraceEntry::State::kFailed;
  entry->ended = now;
  entry->verdict = verdict;
  CountEnded(*entry);
}

void FlightRecorder::EndAll(const std::string& group, uint64_t epoch,
                            const absl::Status& verdict, absl::Time now) {
  auto it = traces_.find(group);
  if (it == traces_.end()) return;
  for (TraceEntry& entry : it->second.entries) {
    if (entry.epoch != epoch || HasEnded(entry)) continue;
    entry.state = TraceEntry::State::kFailed;
    entry.ended = now;
    entry.verdict = verdict;
    CountEnded(entry);
  }
}

void FlightRecorder::MembershipChanged(const std::string& group, uint64_t epoch,
                                       const absl::Status& change,
                                       absl::Time now) {
  if (per_group_ == 0) return;
  // Sequence 0 is no collective's: one such entry per epoch.
  TraceEntry* entry = Add(group, epoch, 0, 0, CollectiveSpec{});
  entry->state = TraceEntry::State::kMembershipChanged;
  entry->ended = now;
  entry->verdict = change;
}

std::vector<TraceEntry> FlightRecorder::Entries(
    const std::string& group) const {
  auto it = traces_.find(group);
  if (it == traces_.end()) return {};
  std::vector<TraceEntry> entries(it->second.entries.begin(),
                                  it->second.entries.end());
  for (TraceEntry& entry : entries) {
    const std::string agreed = DescribeSpec(entry.spec);
    for (size_t r = 0; r < entry.asked.size(); ++r) {
      if (entry.arrived[r] != absl::InfinitePast() && entry.asked[r].empty()) {
        entry.asked[r] = agreed;
      }
    }
  }
  return entries;
}

}  // namespace chorus
