// GroupTable: what spans every concept (see group_table.h): construction,
// events, deadlines, stall reports and the listing of groups.
#include "server/coordinator/group_table.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rank_list.h"
#include "common/status_detail.h"

namespace chorus {

GroupTable::GroupTable(Clock* clock, Registry* registry,
                       GroupTableOptions options, EventHub* events)
    : clock_(clock),
      registry_(registry),
      options_(std::move(options)),
      events_(events),
      recorder_(options_.trace_entries, options_.trace_groups,
                options_.trace_rank_records) {}

GroupTable::~GroupTable() = default;

std::string GroupTable::CallName(const std::string& group, uint64_t sequence,
                                 const CollectiveSpec& spec) {
  return absl::StrCat(CollectiveKindName(spec.kind), " #", sequence,
                      " of group ", group);
}

void GroupTable::PublishLocked(Event event, Completions* completions) {
  if (events_ == nullptr) return;
  event.time = clock_->Now();
  event.job = options_.job;
  if (events_->Publish(event)) {
    completions->push_back([events = events_] { events->Wake(); });
  }
}

Event GroupTable::GroupEvent(Event::Kind kind, const GroupView& group,
                             uint64_t sequence, std::string text) {
  Event event;
  event.kind = kind;
  event.group = group.name;
  event.epoch = group.epoch;
  event.sequence = sequence;
  event.text = std::move(text);
  return event;
}

void GroupTable::StallEndedLocked(const Group& group, uint64_t sequence,
                                  const Match& match,
                                  const absl::Status& verdict,
                                  Completions* completions) {
  if (!match.stall_reported) return;
  const CollectiveSpec* spec = nullptr;
  for (const std::optional<ArrivedCall>& arrived : match.calls) {
    if (arrived) spec = &arrived->call.spec;
  }
  const std::string call = spec == nullptr
                               ? absl::StrCat("collective #", sequence,
                                              " of group ", group.view.name)
                               : CallName(group.view.name, sequence, *spec);
  Event event = GroupEvent(
      Event::Kind::kStallEnded, group.view, sequence,
      absl::StrCat(
          call, " stopped waiting after ",
          absl::FormatDuration(clock_->Now() - match.first_arrival),
          verdict.ok()
              ? ": every rank called it"
              : absl::StrCat(": ",
                             verdict.ToString(
                                 absl::StatusToStringMode::kWithNoExtraData))));
  event.status = verdict;
  PublishLocked(std::move(event), completions);
}

absl::StatusOr<GroupTable::Group*> GroupTable::FindGroupLocked(
    const std::string& name, uint64_t epoch) {
  auto it = groups_.find(name);
  if (it == groups_.end()) {
    return absl::NotFoundError(
        absl::StrCat("unknown group \"", name, "\"; join it first"));
  }
  Group& group = it->second;
  if (epoch != group.view.epoch) {
    // A late call of a revoked elastic epoch gets the revocation.
    auto revoked = successions_.find({name, epoch});
    if (revoked != successions_.end()) return revoked->second.revoked;
    return WithErrorDetail(
        absl::FailedPreconditionError(absl::StrCat(
            "stale epoch ", epoch, " for group ", name, ", which is at epoch ",
            group.view.epoch, "; join again")),
        MakeErrorDetail("STALE_EPOCH", name, epoch, 0));
  }
  if (!group.aborted.ok()) return group.aborted;
  return &group;
}

void GroupTable::ExpireDeadlines() {
  Completions completions;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_->Now();
    ExpireJoinsLocked(now, &completions);
    ExpireElasticJoinsLocked(now, &completions);
    for (auto& [name, group] : groups_) {
      ExpireMatchesLocked(group, now, &completions);
      ExpireCommitsLocked(group, now, &completions);
    }
    SaveChangedLocked();
  }
  for (auto& complete : completions) complete();
}

absl::Time GroupTable::NextDeadline() const {
  absl::MutexLock lock(&mu_);
  absl::Time next = absl::InfiniteFuture();
  for (const auto& [name, formation] : forming_) {
    for (const std::optional<PendingJoin>& slot : formation.slots) {
      if (slot) next = std::min(next, slot->request.deadline);
    }
    if (!formation.refused.empty()) {
      next = std::min(next, formation.refused_until);
    }
  }
  for (const auto& [name, group] : groups_) {
    for (const auto& [sequence, match] : group.pending) {
      for (const std::optional<ArrivedCall>& arrived : match.calls) {
        if (arrived) next = std::min(next, arrived->call.deadline);
      }
    }
    for (const auto& [sequence, commit] : group.commits) {
      for (const std::optional<CommitCall>& call : commit.calls) {
        if (call) next = std::min(next, call->deadline);
      }
    }
  }
  return std::min(next, NextElasticDeadlineLocked());
}

std::vector<std::string> GroupTable::NewStalls(absl::Duration threshold) {
  Completions completions;
  std::vector<std::string> stalls;
  {
    absl::MutexLock lock(&mu_);
    NewStallsLocked(threshold, &stalls, &completions);
  }
  for (auto& complete : completions) complete();
  return stalls;
}

void GroupTable::NewStallsLocked(absl::Duration threshold,
                                 std::vector<std::string>* stalls,
                                 Completions* completions) {
  const absl::Time now = clock_->Now();
  for (auto& [name, group] : groups_) {
    for (auto& [sequence, match] : group.pending) {
      if (match.stall_reported || now - match.first_arrival < threshold) {
        continue;
      }
      match.stall_reported = true;
      std::vector<int> missing;
      const CollectiveSpec* spec = nullptr;
      for (int rank = 0; rank < group.view.world_size; ++rank) {
        if (!match.calls[rank]) {
          missing.push_back(rank);
        } else {
          spec = &match.calls[rank]->call.spec;
        }
      }
      std::string line =
          absl::StrCat(CallName(name, sequence, *spec), " has waited ",
                       absl::FormatDuration(now - match.first_arrival), " for ",
                       FormatRanks(missing));
      Event event =
          GroupEvent(Event::Kind::kStallStarted, group.view, sequence, line);
      event.ranks = std::move(missing);
      PublishLocked(std::move(event), completions);
      stalls->push_back(std::move(line));
    }
  }
}

std::vector<GroupSummary> GroupTable::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<GroupSummary> out;
  for (const auto& [name, group] : groups_) {
    GroupSummary summary;
    summary.job = options_.job;
    summary.view = group.view;
    summary.completed = group.completed;
    summary.aborted = group.aborted;
    for (const PendingJoin& joiner : group.joiners) {
      // A withdrawn newcomer leaves at the next sync: it waits no more.
      if (!joiner.request.withdrawn || !joiner.request.withdrawn()) {
        ++summary.joiners_waiting;
      }
    }
    summary.matching = group.pending.size();
    summary.committing = group.commits.size();
    if (!group.pending.empty()) {
      const auto& [sequence, match] = *group.pending.begin();
      summary.pending_sequence = sequence;
      summary.pending_since = match.first_arrival;
      for (int rank = 0; rank < group.view.world_size; ++rank) {
        if (!match.calls[rank]) summary.missing_ranks.push_back(rank);
      }
    }
    out.push_back(std::move(summary));
  }
  return out;
}

std::vector<FormingSummary> GroupTable::Forming() const {
  absl::MutexLock lock(&mu_);
  std::vector<FormingSummary> out;
  for (const auto& [name, formation] : forming_) {
    if (formation.joined == 0) continue;
    FormingSummary summary;
    summary.job = options_.job;
    summary.name = name;
    summary.world_size = formation.world_size;
    summary.since = formation.first_join;
    for (int rank = 0; rank < formation.world_size; ++rank) {
      const std::optional<PendingJoin>& slot = formation.slots[rank];
      if (slot) {
        summary.joined.push_back(slot->member);
      } else {
        summary.missing_ranks.push_back(rank);
      }
    }
    out.push_back(std::move(summary));
  }
  std::sort(out.begin(), out.end(),
            [](const FormingSummary& a, const FormingSummary& b) {
              return a.name < b.name;
            });
  return out;
}

absl::StatusOr<std::string> GroupTable::MemberWorkerName(
    const std::string& group, uint64_t epoch, int rank) const {
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(group);
  if (it == groups_.end() || it->second.view.epoch != epoch || rank < 0 ||
      rank >= static_cast<int>(it->second.view.members.size())) {
    return absl::NotFoundError(absl::StrCat("no rank ", rank, " of group ",
                                            group, " at epoch ", epoch));
  }
  return it->second.view.members[rank].worker_name;
}

absl::StatusOr<std::vector<GroupMember>> GroupTable::Members(
    const std::string& group, uint64_t epoch, absl::Span<const int> ranks) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Group*> found = FindGroupLocked(group, epoch);
  if (!found.ok()) return found.status();
  const std::vector<GroupMember>& members = (*found)->view.members;
  if (ranks.size() > members.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ranks.size(), " ranks asked of group ", group,
                     ", which has ", members.size()));
  }
  std::vector<GroupMember> asked;
  asked.reserve(ranks.size());
  for (int rank : ranks) {
    if (rank < 0 || rank >= static_cast<int>(members.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, " out of range for group ", group, " of ",
                       members.size(), " ranks"));
    }
    asked.push_back(members[rank]);
  }
  return asked;
}

std::vector<TraceEntry> GroupTable::Trace(const std::string& group) const {
  absl::MutexLock lock(&mu_);
  return recorder_.Entries(group);
}

}  // namespace chorus
