// GroupTable's elastic groups: a group joined with a minimum world size
// goes on without the members it loses, and admits newcomers at a sync.
//
// Rules (DESIGN.md, "Elastic groups"):
// - A lost member (its worker, its client process, a data-plane failure
//   naming it, a clean leave, a commit it never sent) revokes the epoch:
//   every pending and later call of it ends with ABORTED and a
//   MEMBERSHIP_CHANGED detail, and the survivors form the next epoch at
//   once, in their order, densely renumbered. Below the minimum they wait
//   for newcomers until their own deadlines.
// - A call of a revoked epoch never succeeds on some ranks and fails on
//   others: a call is decided only once every rank arrived, and an
//   undecided or uncommitted one fails on every rank with the revocation.
// - A rank follows its group into the next epoch by joining with
//   follow_epoch; a rank the revocation dropped is told it was excluded.
// - A newcomer joins without a rank and waits; a sync (a collective every
//   member calls) admits the waiting newcomers, up to the maximum, into the
//   next epoch, after the members.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/metrics.h"
#include "common/rank_list.h"
#include "common/status_detail.h"
#include "server/coordinator/group_table.h"

namespace chorus {
namespace {

// Revoked epochs remembered for their late calls and followers.
constexpr size_t kMaxSuccessions = 4096;

// How long an elastic group below its minimum waits for its survivors to
// follow and newcomers to join when none waits.
constexpr absl::Duration kRefillWait = absl::Minutes(10);

// Counts a membership change of an elastic group under `reason`.
void CountChange(const char* reason) {
  static CounterFamily* const changes = DefaultMetrics().Counters(
      "chorus_membership_changes_total",
      "Epochs of elastic groups that ended in a change of membership, by "
      "reason: worker_lost, rank_gone (a rank's client process went away), "
      "data_plane_failure, left (a clean leave), commit_deadline, joined "
      "(newcomers admitted at a sync).",
      {"reason"});
  changes->With({reason})->Add();
}

// "the group goes on at epoch 8 with 3 ranks" or "the group waits ...".
std::string NextText(const GroupView& old, uint64_t next_epoch,
                     int next_world) {
  if (next_epoch != 0) {
    return absl::StrCat("the group goes on at epoch ", next_epoch, " with ",
                        next_world, next_world == 1 ? " rank" : " ranks",
                        "; call again in the new epoch");
  }
  const int missing = old.min_world_size - next_world;
  return absl::StrCat("the group has ", next_world, " of its minimum of ",
                      old.min_world_size, " ranks and waits for ", missing,
                      missing == 1 ? " newcomer" : " newcomers",
                      " to join (without a rank) before it goes on");
}

// Records how long an elastic group went without an epoch after it lost
// members: from the revocation to the next epoch (0 when the survivors went
// on at once; longer below the minimum).
void ObserveChange(absl::Duration waited) {
  static Histogram* const seconds =
      DefaultMetrics()
          .Histograms("chorus_membership_change_seconds",
                      "Time from the revocation of an elastic group's epoch "
                      "that lost members to its next epoch.",
                      {}, {0.001, 0.01, 0.1, 1, 10, 60, 600})
          ->With({});
  seconds->ObserveDuration(waited);
}

}  // namespace

absl::Status GroupTable::ValidateElasticLocked(
    const JoinRequest& request) const {
  if (request.min_world_size == 0 && request.max_world_size == 0) {
    return absl::OkStatus();
  }
  const int max = request.max_world_size == 0 ? options_.max_world_size
                                              : request.max_world_size;
  if (request.min_world_size < 1 ||
      request.min_world_size > request.world_size || request.world_size > max ||
      max > options_.max_world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group ", request.group, ": min_world_size ", request.min_world_size,
        ", world size ", request.world_size, " and max_world_size ",
        request.max_world_size, " must satisfy 1 <= min <= world size <= max ",
        "<= ", options_.max_world_size, " (max 0: up to that)"));
  }
  return absl::OkStatus();
}

uint64_t GroupTable::NextEpochLocked(const std::string& name) {
  auto [epoch, inserted] = epochs_.try_emplace(name, options_.first_epoch);
  return ++epoch->second;
}

void GroupTable::RecordSuccessionLocked(const std::string& name, uint64_t epoch,
                                        Succession succession) {
  successions_[{name, epoch}] = std::move(succession);
  succession_order_.push_back({name, epoch});
  while (succession_order_.size() > kMaxSuccessions) {
    successions_.erase(succession_order_.front());
    succession_order_.pop_front();
  }
}

void GroupTable::NewcomerLocked(JoinRequest request, JoinCallback done,
                                Completions* completions) {
  auto fail = [&](absl::Status status) {
    completions->push_back([done = std::move(done), status] { done(status); });
  };
  absl::StatusOr<WorkerRecord> worker =
      registry_->ResolveMember(request.worker_id, request.device);
  if (!worker.ok()) return fail(worker.status());
  auto refill = refills_.find(request.group);
  auto group = groups_.find(request.group);
  if (refill == refills_.end() &&
      (group == groups_.end() || group->second.view.min_world_size == 0)) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
        "group ", request.group,
        " is not a formed elastic group: a newcomer joins a group whose ranks "
        "joined with min_world_size; to form a group, join with a rank")));
  }
  PendingJoin joiner{request, MemberOf(request, *worker), std::move(done)};
  if (refill != refills_.end()) {
    refill->second.joiners.push_back(std::move(joiner));
    TryFormRefillLocked(request.group, completions);
    return;
  }
  Group& formed = group->second;
  formed.joiners.push_back(std::move(joiner));
  PublishLocked(
      GroupEvent(
          Event::Kind::kJoinerWaiting, formed.view, 0,
          absl::StrCat("a newcomer on worker \"", worker->registration.name,
                       "\" waits to join group ", request.group, " (",
                       formed.joiners.size(), " waiting)")),
      completions);
}

void GroupTable::FollowLocked(JoinRequest request, JoinCallback done,
                              Completions* completions) {
  auto answer = [&](absl::StatusOr<GroupView> view) {
    completions->push_back(
        [done = std::move(done), view = std::move(view)] { done(view); });
  };
  const std::string& name = request.group;
  uint64_t epoch = request.follow_epoch;
  int rank = request.rank;
  for (;;) {
    auto group = groups_.find(name);
    if (group != groups_.end() && group->second.view.epoch == epoch &&
        group->second.aborted.ok()) {
      const GroupView& view = group->second.view;
      if (rank < 0 || rank >= view.world_size ||
          view.members[rank].worker_id != request.worker_id) {
        return answer(absl::PermissionDeniedError(absl::StrCat(
            "rank ", request.rank, " of group ", name, " at epoch ",
            request.follow_epoch, " is not held by this worker")));
      }
      GroupView mine = view;
      mine.rank = rank;
      return answer(std::move(mine));
    }
    auto succession = successions_.find({name, epoch});
    if (succession == successions_.end()) {
      return answer(WithErrorDetail(
          absl::FailedPreconditionError(absl::StrCat(
              "group ", name, " has no record of epoch ", epoch,
              " that this rank could follow; join the group again")),
          MakeErrorDetail("STALE_EPOCH", name, epoch, 0)));
    }
    const Succession& next = succession->second;
    if (rank < 0 || rank >= static_cast<int>(next.next_ranks.size())) {
      return answer(absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, " is out of range for group ", name,
                       " at epoch ", epoch)));
    }
    if (next.next_ranks[rank] < 0) {
      v1::ErrorDetail detail = MakeErrorDetail("RANK_EXCLUDED", name, epoch, 0);
      detail.add_lost_ranks(rank);
      return answer(WithErrorDetail(
          absl::FailedPreconditionError(absl::StrCat(
              "rank ", rank, " of group ", name, " was declared lost at epoch ",
              epoch, " and is no longer a member (", next.revoked.message(),
              "); join the group again as a newcomer")),
          detail));
    }
    if (next.next_epoch == 0) {
      auto refill = refills_.find(name);
      if (refill == refills_.end() || refill->second.previous.epoch != epoch) {
        return answer(absl::AbortedError(absl::StrCat(
            "group ", name, " stayed below its minimum after epoch ", epoch,
            " and was given up; join it again")));
      }
      request.rank = rank;
      refill->second.followers.push_back(
          PendingJoin{std::move(request), GroupMember{}, std::move(done)});
      return;
    }
    epoch = next.next_epoch;
    rank = next.next_ranks[rank];
  }
}

void GroupTable::EndEpochLocked(Group& group, const absl::Status& status,
                                Completions* completions) {
  recorder_.EndAll(group.view.name, group.view.epoch, status, clock_->Now());
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
    for (size_t rank = 0; rank < commit.calls.size(); ++rank) {
      if (!commit.calls[rank]) continue;
      completions->push_back(
          [done = std::move(commit.done[rank]), status] { done(status); });
    }
  }
  group.commits.clear();
  group.aborted = status;
  unsaved_.insert(group.view.name);
}

void GroupTable::RevokeLocked(Group& group, std::vector<int> lost,
                              const char* reason, const std::string& why,
                              const Blame& blame, Completions* completions) {
  if (!group.aborted.ok()) return;
  const GroupView old = group.view;
  std::sort(lost.begin(), lost.end());
  lost.erase(std::unique(lost.begin(), lost.end()), lost.end());
  std::vector<int> survivors;
  std::vector<int> next_ranks(old.world_size, -1);
  for (int rank = 0; rank < old.world_size; ++rank) {
    if (std::binary_search(lost.begin(), lost.end(), rank)) continue;
    next_ranks[rank] = static_cast<int>(survivors.size());
    survivors.push_back(rank);
  }
  const int next_world = static_cast<int>(survivors.size());
  const bool refill = next_world < old.min_world_size;
  const uint64_t next_epoch = refill ? 0 : NextEpochLocked(old.name);
  v1::ErrorDetail detail =
      MakeErrorDetail("MEMBERSHIP_CHANGED", old.name, old.epoch, 0);
  for (int rank : lost) {
    detail.add_lost_ranks(rank);
    (*detail.mutable_ranks())[rank] = why;
  }
  if (blame.worker_id != 0) {
    detail.set_lost_worker(blame.worker_name);
    detail.set_lost_worker_id(blame.worker_id);
  }
  detail.set_next_epoch(next_epoch);
  detail.set_next_world_size(next_world);
  for (int next : next_ranks) detail.add_next_ranks(next);
  detail.set_joiners_waiting(static_cast<int>(group.joiners.size()));
  const std::string left =
      lost.empty() ? std::string("no rank left")
                   : absl::StrCat(FormatRanks(lost),
                                  lost.size() == 1 ? " left" : " left");
  const absl::Status status = WithErrorDetail(
      absl::AbortedError(absl::StrCat(
          "the membership of group ", old.name, " changed at epoch ", old.epoch,
          ": ", left, " (", why, "); ", NextText(old, next_epoch, next_world))),
      detail);
  std::vector<PendingJoin> joiners = std::move(group.joiners);
  AbortGroupLocked(group, status, reason, blame, completions);
  recorder_.MembershipChanged(old.name, old.epoch, status, clock_->Now());
  CountChange(reason);
  RecordSuccessionLocked(old.name, old.epoch,
                         Succession{status, next_epoch, next_ranks});
  Event event = GroupEvent(Event::Kind::kMembershipChanged, old, 0,
                           std::string(status.message()));
  event.ranks = lost;
  PublishLocked(std::move(event), completions);
  if (!refill) {
    FormNextEpochLocked(old, survivors, next_epoch, {}, std::move(joiners),
                        completions);
    ObserveChange(absl::ZeroDuration());
    return;
  }
  Refill& waiting = refills_[old.name];
  waiting = Refill{};
  waiting.previous = old;
  waiting.survivors = std::move(survivors);
  waiting.joiners = std::move(joiners);
  waiting.revoked_at = clock_->Now();
  waiting.give_up_at = waiting.revoked_at + kRefillWait;
  TryFormRefillLocked(old.name, completions);
}

std::shared_ptr<const GroupView> GroupTable::FormNextEpochLocked(
    const GroupView& previous, const std::vector<int>& survivors,
    uint64_t epoch, std::vector<PendingJoin> admitted,
    std::vector<PendingJoin> waiting, Completions* completions) {
  GroupView view;
  view.name = previous.name;
  view.epoch = epoch;
  view.min_world_size = previous.min_world_size;
  view.max_world_size = previous.max_world_size;
  for (int old_rank : survivors) {
    view.members.push_back(previous.members[old_rank]);
  }
  for (PendingJoin& joiner : admitted) view.members.push_back(joiner.member);
  view.world_size = static_cast<int>(view.members.size());
  for (int rank = 0; rank < view.world_size; ++rank) {
    view.members[rank].rank = rank;
  }
  view.same_host = SameHost(view.members);
  view.nccl = AllHaveNccl(view.members);
  Group& group = groups_[view.name];
  group = Group{};
  group.view = view;
  unsaved_.insert(view.name);
  group.next_sequence.assign(view.world_size, 1);
  group.called_ahead.resize(view.world_size);
  group.last_outcome.resize(view.world_size);
  group.request_ids.assign(view.world_size, "");
  group.joiners = std::move(waiting);
  auto formed = std::make_shared<const GroupView>(view);
  const int first_newcomer = static_cast<int>(survivors.size());
  for (size_t i = 0; i < admitted.size(); ++i) {
    const int rank = first_newcomer + static_cast<int>(i);
    group.request_ids[rank] = admitted[i].request.request_id;
    GroupView mine = view;
    mine.rank = rank;
    completions->push_back([done = std::move(admitted[i].done),
                            mine = std::move(mine)] { done(mine); });
  }
  PublishLocked(
      GroupEvent(Event::Kind::kGroupFormed, view, 0,
                 absl::StrCat("group ", view.name, " went on at epoch ",
                              view.epoch, " with ", view.world_size, " ranks (",
                              survivors.size(), " from epoch ", previous.epoch,
                              ", ", admitted.size(), " newcomers)")),
      completions);
  return formed;
}

bool GroupTable::TryFormRefillLocked(const std::string& name,
                                     Completions* completions) {
  auto it = refills_.find(name);
  if (it == refills_.end()) return false;
  Refill& refill = it->second;
  DropWithdrawnLocked(refill.joiners, completions);
  const int have = static_cast<int>(refill.survivors.size());
  if (have + static_cast<int>(refill.joiners.size()) <
      refill.previous.min_world_size) {
    return false;
  }
  const size_t room =
      static_cast<size_t>(std::max(0, refill.previous.max_world_size - have));
  std::vector<PendingJoin> admitted;
  std::vector<PendingJoin> waiting;
  for (PendingJoin& joiner : refill.joiners) {
    (admitted.size() < room ? admitted : waiting).push_back(std::move(joiner));
  }
  const uint64_t epoch = NextEpochLocked(name);
  auto succession = successions_.find({name, refill.previous.epoch});
  if (succession != successions_.end()) {
    succession->second.next_epoch = epoch;
  }
  std::shared_ptr<const GroupView> formed =
      FormNextEpochLocked(refill.previous, refill.survivors, epoch,
                          std::move(admitted), std::move(waiting), completions);
  ObserveChange(clock_->Now() - refill.revoked_at);
  for (PendingJoin& follower : refill.followers) {
    const int old_rank = follower.request.rank;
    auto pos =
        std::find(refill.survivors.begin(), refill.survivors.end(), old_rank);
    GroupView mine = *formed;
    mine.rank = static_cast<int>(pos - refill.survivors.begin());
    completions->push_back([done = std::move(follower.done),
                            mine = std::move(mine)] { done(mine); });
  }
  refills_.erase(it);
  return true;
}

void GroupTable::AdmitJoinersLocked(Group& group,
                                    std::shared_ptr<const GroupView>* next,
                                    Completions* completions) {
  const GroupView old = group.view;
  const size_t room =
      static_cast<size_t>(std::max(0, old.max_world_size - old.world_size));
  DropWithdrawnLocked(group.joiners, completions);
  if (group.joiners.empty() || room == 0) return;
  std::vector<PendingJoin> admitted;
  std::vector<PendingJoin> waiting;
  for (PendingJoin& joiner : group.joiners) {
    (admitted.size() < room ? admitted : waiting).push_back(std::move(joiner));
  }
  group.joiners.clear();
  const uint64_t epoch = NextEpochLocked(old.name);
  std::vector<int> ranks(old.world_size);
  for (int rank = 0; rank < old.world_size; ++rank) ranks[rank] = rank;
  v1::ErrorDetail detail =
      MakeErrorDetail("MEMBERSHIP_CHANGED", old.name, old.epoch, 0);
  detail.set_next_epoch(epoch);
  detail.set_next_world_size(old.world_size +
                             static_cast<int>(admitted.size()));
  for (int rank : ranks) detail.add_next_ranks(rank);
  const absl::Status status = WithErrorDetail(
      absl::AbortedError(absl::StrCat(
          "the membership of group ", old.name, " changed at epoch ", old.epoch,
          ": a sync admitted ", admitted.size(),
          admitted.size() == 1 ? " newcomer" : " newcomers", "; ",
          NextText(old, epoch, detail.next_world_size()))),
      detail);
  // Calls issued after the sync belong to the old epoch: they end here.
  EndEpochLocked(group, status, completions);
  recorder_.MembershipChanged(old.name, old.epoch, status, clock_->Now());
  CountChange("joined");
  RecordSuccessionLocked(old.name, old.epoch, Succession{status, epoch, ranks});
  PublishLocked(GroupEvent(Event::Kind::kMembershipChanged, old, 0,
                           std::string(status.message())),
                completions);
  *next = FormNextEpochLocked(old, ranks, epoch, std::move(admitted),
                              std::move(waiting), completions);
}

void GroupTable::DropWithdrawnLocked(std::vector<PendingJoin>& joiners,
                                     Completions* completions) {
  for (auto it = joiners.begin(); it != joiners.end();) {
    if (!it->request.withdrawn || !it->request.withdrawn()) {
      ++it;
      continue;
    }
    completions->push_back([done = std::move(it->done)] {
      done(absl::CancelledError("the newcomer went away while it waited"));
    });
    it = joiners.erase(it);
  }
}

void GroupTable::DropElasticJoinsLocked(uint64_t worker_id,
                                        const absl::Status& why,
                                        Completions* completions) {
  auto drop = [&](std::vector<PendingJoin>& joins) {
    for (auto it = joins.begin(); it != joins.end();) {
      if (it->request.worker_id != worker_id) {
        ++it;
        continue;
      }
      completions->push_back([done = std::move(it->done), why] { done(why); });
      it = joins.erase(it);
    }
  };
  for (auto& [name, group] : groups_) drop(group.joiners);
  for (auto& [name, refill] : refills_) {
    drop(refill.joiners);
    drop(refill.followers);
  }
}

void GroupTable::ExpireElasticJoinsLocked(absl::Time now,
                                          Completions* completions) {
  auto expire = [&](std::vector<PendingJoin>& joins,
                    const absl::Status& status) {
    for (auto it = joins.begin(); it != joins.end();) {
      if (it->request.deadline > now) {
        ++it;
        continue;
      }
      completions->push_back(
          [done = std::move(it->done), status] { done(status); });
      it = joins.erase(it);
    }
  };
  for (auto& [name, group] : groups_) {
    expire(group.joiners,
           absl::DeadlineExceededError(absl::StrCat(
               "this newcomer was not admitted to group ", name,
               " within its deadline: the members did not call sync")));
  }
  for (auto it = refills_.begin(); it != refills_.end();) {
    Refill& refill = it->second;
    const int missing =
        refill.previous.min_world_size -
        static_cast<int>(refill.survivors.size() + refill.joiners.size());
    v1::ErrorDetail detail =
        MakeErrorDetail("RANKS_MISSING", it->first, refill.previous.epoch, 0);
    const absl::Status status = WithErrorDetail(
        absl::DeadlineExceededError(
            absl::StrCat("group ", it->first, " stayed below its minimum of ",
                         refill.previous.min_world_size, " ranks: ", missing,
                         missing == 1 ? " newcomer" : " newcomers",
                         " missing within the deadline")),
        detail);
    expire(refill.followers, status);
    expire(refill.joiners, status);
    if (refill.followers.empty() && refill.joiners.empty() &&
        refill.give_up_at <= now) {
      it = refills_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::Time GroupTable::NextElasticDeadlineLocked() const {
  absl::Time next = absl::InfiniteFuture();
  auto earliest = [&](const std::vector<PendingJoin>& joins) {
    for (const PendingJoin& join : joins) {
      next = std::min(next, join.request.deadline);
    }
  };
  for (const auto& [name, group] : groups_) earliest(group.joiners);
  for (const auto& [name, refill] : refills_) {
    earliest(refill.joiners);
    earliest(refill.followers);
    next = std::min(next, refill.give_up_at);
  }
  return next;
}

}  // namespace chorus
