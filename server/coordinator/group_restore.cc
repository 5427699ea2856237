// GroupTable's part in failover (state_log.h): writing each group's epoch
// when it changes, and taking groups over from the coordinator that led
// before.
//
// Why a collective decided by the old leader is never decided differently
// by the new one: the old leader wrote the group's epoch (members,
// devices) before any rank could call on it, and a verdict depends only on
// that epoch and the ranks' calls (agreement, the plan and an inline result
// are pure functions of them; the planner reads nothing else). Sequences
// and matches are not written; a restored group learns each rank's
// sequence from its first call here. A rank whose answer was lost sends the
// same call again; a rank that got its answer and moved on sends its
// answered calls along with its next call (CollectiveCall::replays), so the
// new leader matches the same calls of the same epoch and reaches the same
// verdict, which it tells only the ranks that still wait for it. The only
// verdicts that could differ are those a deadline or an abort gave; an
// abort is written before it is told, and a deadline the old leader gave is
// given here too, as the ranks that met it do not call again. A collective
// that every rank saw planned is committed here as it was planned
// (AdoptCommitLocked). One that only some ranks saw planned is planned
// here again: the ranks running it send it again as running calls
// (CollectiveCall::running) when they move, the others send it again as
// they would any unanswered call, and the plan is a pure function of the
// same calls; should every rank turn out to have had the plan, their
// commits are taken as the old leader's. A rank counts as running until
// its commit's verdict and sends its running call before a commit it sends
// again, so a commit that arrives while ranks that lost the plan have yet
// to call waits in its commit match, and the match stays pending for them.
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/coordinator/group_table.h"

namespace chorus {

void GroupTable::SaveChangedLocked() {
  if (unsaved_.empty()) return;
  if (options_.log != nullptr) {
    for (const std::string& name : unsaved_) {
      auto it = groups_.find(name);
      if (it == groups_.end()) {
        options_.log->DropGroup(options_.job, name);
        continue;
      }
      options_.log->SaveGroup(StoredGroup{options_.job, it->second.view,
                                          it->second.aborted,
                                          it->second.request_ids});
    }
  }
  unsaved_.clear();
}

void GroupTable::Restore(const std::vector<StoredGroup>& stored) {
  absl::MutexLock lock(&mu_);
  for (const StoredGroup& from : stored) {
    const GroupView& view = from.view;
    Group& group = groups_[view.name];
    group = Group{};
    group.view = view;
    group.view.rank = -1;
    group.aborted = from.aborted;
    group.restored = true;
    group.first_here.assign(view.world_size, 0);
    unlearned_ranks_ += view.world_size;
    group.next_sequence.assign(view.world_size, 1);
    group.called_ahead.resize(view.world_size);
    group.last_outcome.resize(view.world_size);
    group.request_ids = from.request_ids;
    group.request_ids.resize(view.world_size);
    uint64_t& last = epochs_[view.name];
    last = std::max(last, view.epoch);
  }
}

void GroupTable::TakeReplaysLocked(CollectiveCall& call,
                                   Completions* completions) {
  // The common case, off the matcher's path: no restored rank waits to be
  // learned, and the call carries nothing.
  if (unlearned_ranks_ == 0 && call.replays.empty()) return;
  std::vector<CollectiveCall> replays = std::move(call.replays);
  call.replays.clear();
  auto it = groups_.find(call.group);
  if (it == groups_.end()) return;
  Group& group = it->second;
  if (!group.restored || call.epoch != group.view.epoch || call.rank < 0 ||
      call.rank >= group.view.world_size || call.sequence == 0 ||
      group.first_here[call.rank] != 0) {
    return;
  }
  // Only the rank's own earlier calls of this epoch count.
  replays.erase(std::remove_if(replays.begin(), replays.end(),
                               [&](const CollectiveCall& replay) {
                                 return replay.sequence == 0 ||
                                        replay.sequence >= call.sequence;
                               }),
                replays.end());
  std::sort(replays.begin(), replays.end(),
            [](const CollectiveCall& a, const CollectiveCall& b) {
              return a.sequence < b.sequence;
            });
  const uint64_t first =
      replays.empty() ? call.sequence : replays.front().sequence;
  group.first_here[call.rank] = first;
  --unlearned_ranks_;
  group.next_sequence[call.rank] = first;
  for (CollectiveCall& replay : replays) {
    if (CalledLocked(group, call.rank, replay.sequence)) continue;
    replay.job = call.job;
    replay.group = call.group;
    replay.epoch = call.epoch;
    replay.rank = call.rank;
    replay.deadline = call.deadline;
    replay.replays.clear();
    CollectiveLocked(
        std::move(replay), [](const absl::StatusOr<CollectiveOutcome>&) {},
        completions);
  }
}

bool GroupTable::TakeRunningLocked(const CollectiveCall& call,
                                   CollectiveCallback& done,
                                   Completions* completions) {
  auto it = groups_.find(call.group);
  const bool taken = it != groups_.end() && it->second.restored &&
                     it->second.view.epoch == call.epoch;
  absl::StatusOr<CollectiveOutcome> answer = absl::FailedPreconditionError(
      absl::StrCat("collective #", call.sequence, " of group ", call.group,
                   ": a running call is taken only for a group epoch this "
                   "coordinator took over from the leader before it"));
  if (taken) {
    CollectiveOutcome nothing;
    nothing.sequence = call.sequence;
    answer = std::move(nothing);
  }
  completions->push_back(
      [answer = std::move(done), outcome = std::move(answer)]() mutable {
        answer(std::move(outcome));
      });
  done = [](const absl::StatusOr<CollectiveOutcome>&) {};
  return taken;
}

bool GroupTable::RunningHereLocked(const Group& group, uint64_t sequence,
                                   int rank) {
  auto it = group.pending.find(sequence);
  if (it == group.pending.end()) return false;
  const std::optional<ArrivedCall>& arrived = it->second.calls[rank];
  return arrived.has_value() && arrived->call.running;
}

bool GroupTable::OnlyRunningLocked(const Group& group, uint64_t sequence) {
  auto it = group.pending.find(sequence);
  if (it == group.pending.end()) return false;
  for (const std::optional<ArrivedCall>& arrived : it->second.calls) {
    if (arrived.has_value() && !arrived->call.running) return false;
  }
  return true;
}

std::map<uint64_t, GroupTable::CommitMatch>::iterator
GroupTable::AdoptCommitLocked(Group& group, const CommitCall& call) {
  if (!group.restored) return group.commits.end();
  const int rank = call.rank;
  const uint64_t first = group.first_here[rank];
  // Only a collective this coordinator never decided: one the old leader
  // planned, which no rank called here, only ranks running that plan did,
  // or this rank did as a running call (it sends that before its commit).
  // The pending match stays: a rank that lost the plan may still call.
  const bool taken_over = OnlyRunningLocked(group, call.sequence) ||
                          RunningHereLocked(group, call.sequence, rank);
  if (!group.aborted.ok() || call.sequence == 0 ||
      (first != 0 && call.sequence >= first &&
       !(taken_over && call.sequence == first)) ||
      (group.pending.count(call.sequence) > 0 && !taken_over)) {
    return group.commits.end();
  }
  if (first == 0) {
    --unlearned_ranks_;
    group.first_here[rank] = call.sequence;
    group.next_sequence[rank] = call.sequence + 1;
  }
  CommitMatch& commit = group.commits[call.sequence];
  if (commit.calls.empty()) {
    commit.calls.resize(group.view.world_size);
    commit.done.resize(group.view.world_size);
  }
  return group.commits.find(call.sequence);
}

}  // namespace chorus
