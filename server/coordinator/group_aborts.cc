// GroupTable's aborts: a lost worker's groups, the notices workers fetch
// in their heartbeats, and the end of everything at shutdown.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/metrics.h"
#include "common/rank_list.h"
#include "common/status_detail.h"
#include "server/coordinator/group_table.h"

namespace chorus {

void GroupTable::AbortWorker(uint64_t worker_id, const std::string& worker_name,
                             const std::string& why) {
  Completions completions;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, group] : groups_) {
      std::vector<int> ranks;
      for (const GroupMember& member : group.view.members) {
        if (member.worker_id == worker_id) ranks.push_back(member.rank);
      }
      if (ranks.empty()) continue;
      if (group.view.min_world_size > 0 && group.aborted.ok()) {
        RevokeLocked(group, ranks, "worker_lost",
                     absl::StrCat("worker \"", worker_name, "\" (id ",
                                  worker_id, ") lost: ", why),
                     Blame{ranks, worker_id, worker_name}, &completions);
        continue;
      }
      v1::ErrorDetail detail =
          MakeErrorDetail("WORKER_LOST", name, group.view.epoch, 0);
      detail.set_lost_worker(worker_name);
      detail.set_lost_worker_id(worker_id);
      for (int rank : ranks) detail.add_lost_ranks(rank);
      const absl::Status status = WithErrorDetail(
          absl::AbortedError(absl::StrCat(
              "group ", name, " (epoch ", group.view.epoch,
              ") aborted: ", FormatRanks(ranks), " on worker \"", worker_name,
              "\" (id ", worker_id, ") lost: ", why, "; join the group again")),
          detail);
      AbortGroupLocked(group, status, "worker_lost",
                       Blame{ranks, worker_id, worker_name}, &completions);
    }
    // Joins the lost worker made can no longer be answered; newcomers it
    // made leave without a trace.
    DropElasticJoinsLocked(
        worker_id,
        absl::AbortedError(absl::StrCat("worker \"", worker_name, "\" (id ",
                                        worker_id, ") lost: ", why)),
        &completions);
    for (auto it = forming_.begin(); it != forming_.end();) {
      Formation& formation = it->second;
      for (std::optional<PendingJoin>& slot : formation.slots) {
        if (!slot || slot->member.worker_id != worker_id) continue;
        v1::ErrorDetail detail =
            MakeErrorDetail("WORKER_LOST", it->first, 0, 0);
        detail.set_lost_worker(worker_name);
        detail.set_lost_worker_id(worker_id);
        const absl::Status status = WithErrorDetail(
            absl::AbortedError(absl::StrCat("worker \"", worker_name, "\" (id ",
                                            worker_id, ") lost: ", why)),
            detail);
        completions.push_back(
            [done = std::move(slot->done), status] { done(status); });
        slot.reset();
        --formation.joined;
      }
      if (FormationEmpty(formation)) {
        forming_.erase(it++);
      } else {
        ++it;
      }
    }
    SaveChangedLocked();
  }
  for (auto& complete : completions) complete();
}

void GroupTable::AbortGroupLocked(Group& group, const absl::Status& status,
                                  const char* reason, const Blame& blame,
                                  Completions* completions) {
  if (!group.aborted.ok()) return;
  static CounterFamily* const aborts = DefaultMetrics().Counters(
      "chorus_aborts_total",
      "Group epochs aborted, by reason: worker_lost (evicted, deregistered or "
      "restarted), data_plane_failure (a rank reported one), rank_gone (a "
      "rank's "
      "client process went away), commit_deadline (a rank never committed), "
      "shutdown.",
      {"reason"});
  aborts->With({reason})->Add();
  group.aborted = status;
  unsaved_.insert(group.view.name);
  recorder_.EndAll(group.view.name, group.view.epoch, status, clock_->Now());
  Event event = GroupEvent(Event::Kind::kGroupAborted, group.view, 0,
                           std::string(status.message()));
  event.ranks = blame.ranks;
  event.worker_id = blame.worker_id;
  event.worker_name = blame.worker_name;
  event.status = status;
  PublishLocked(std::move(event), completions);
  for (auto& [sequence, match] : group.pending) {
    StallEndedLocked(group, sequence, match, status, completions);
    for (std::optional<ArrivedCall>& arrived : match.calls) {
      if (!arrived) continue;
      completions->push_back(
          [done = std::move(arrived->done), status] { done(status); });
    }
  }
  group.pending.clear();
  for (auto& [sequence, commit] : group.commits) {
    for (int rank = 0; rank < group.view.world_size; ++rank) {
      if (!commit.calls[rank]) continue;
      completions->push_back(
          [done = std::move(commit.done[rank]), status] { done(status); });
    }
  }
  group.commits.clear();
  AbortNotice notice;
  notice.id = next_notice_++;
  notice.group = group.view.name;
  notice.epoch = group.view.epoch;
  notice.status = status;
  for (const GroupMember& member : group.view.members) {
    notice.worker_ids.push_back(member.worker_id);
  }
  notices_.push_back(std::move(notice));
  constexpr size_t kMaxNotices = 4096;
  while (notices_.size() > kMaxNotices) notices_.pop_front();
}

std::vector<AbortNotice> GroupTable::AbortsFor(uint64_t worker_id,
                                               uint64_t after,
                                               uint64_t* latest) const {
  absl::MutexLock lock(&mu_);
  std::vector<AbortNotice> out;
  *latest = next_notice_ - 1;
  for (const AbortNotice& notice : notices_) {
    if (notice.id <= after) continue;
    if (std::find(notice.worker_ids.begin(), notice.worker_ids.end(),
                  worker_id) != notice.worker_ids.end()) {
      out.push_back(notice);
    }
  }
  return out;
}

void GroupTable::AbortAll(const absl::Status& status) {
  Completions completions;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, formation] : forming_) {
      for (std::optional<PendingJoin>& slot : formation.slots) {
        if (!slot) continue;
        completions.push_back(
            [done = std::move(slot->done), status] { done(status); });
      }
    }
    forming_.clear();
    for (auto& [name, group] : groups_) {
      group.aborted = absl::OkStatus();
      AbortGroupLocked(group, status, "shutdown", Blame(), &completions);
    }
    groups_.clear();
    notices_.clear();
    // A coordinator that shuts down leaves its groups written for the
    // coordinator that leads next.
    unsaved_.clear();
  }
  for (auto& complete : completions) complete();
}

}  // namespace chorus
