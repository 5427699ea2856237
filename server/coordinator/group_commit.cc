// GroupTable's commits: the end of a data-plane collective on every rank,
// its result hashes, and the failures ranks report.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rank_list.h"
#include "common/status_detail.h"
#include "server/coordinator/group_table.h"

namespace chorus {

absl::Status GroupTable::CheckResultHashes(const std::string& group,
                                           uint64_t epoch, uint64_t sequence,
                                           const CommitMatch& commit) {
  // Ranks by the hash they hold, in order of each hash's lowest rank.
  std::vector<std::pair<uint64_t, std::vector<int>>> holders;
  for (int rank = 0; rank < static_cast<int>(commit.calls.size()); ++rank) {
    const std::optional<uint64_t>& hash = commit.calls[rank]->result_hash;
    if (!hash.has_value()) return absl::OkStatus();
    auto it = std::find_if(holders.begin(), holders.end(),
                           [&](const auto& h) { return h.first == *hash; });
    if (it == holders.end()) {
      holders.push_back({*hash, {rank}});
    } else {
      it->second.push_back(rank);
    }
  }
  if (holders.size() <= 1) return absl::OkStatus();
  // The largest set of agreeing ranks (the lowest rank's on a tie) is taken
  // as right; every other rank's result differs from it.
  auto largest = std::max_element(holders.begin(), holders.end(),
                                  [](const auto& a, const auto& b) {
                                    return a.second.size() < b.second.size();
                                  });
  std::vector<int> differing;
  for (const auto& [hash, ranks] : holders) {
    if (&ranks == &largest->second) continue;
    differing.insert(differing.end(), ranks.begin(), ranks.end());
  }
  std::sort(differing.begin(), differing.end());
  const std::string other =
      absl::StrCat("other bytes than ", FormatRanks(largest->second));
  v1::ErrorDetail detail =
      MakeErrorDetail("RESULTS_DIFFER", group, epoch, sequence);
  for (int rank : differing) (*detail.mutable_ranks())[rank] = other;
  return WithErrorDetail(
      absl::DataLossError(absl::StrCat(
          "the results of ", CallName(group, sequence, commit.spec),
          " differ: ", FormatRanks(differing),
          differing.size() == 1 ? " holds " : " hold ", other,
          " (result hashes differ); no rank's output of this call can be "
          "trusted")),
      detail);
}

void GroupTable::Commit(CommitCall call, CommitCallback done) {
  Completions completions;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Group*> found = FindGroupLocked(call.group, call.epoch);
    absl::Status status = found.status();
    CommitMatch* commit = nullptr;
    if (found.ok()) {
      Group& group = **found;
      auto it = group.commits.find(call.sequence);
      const bool in_range = call.rank >= 0 && call.rank < group.view.world_size;
      if (in_range && it == group.commits.end()) {
        it = AdoptCommitLocked(group, call);
      }
      if (!in_range) {
        status = absl::InvalidArgumentError(absl::StrCat(
            "rank ", call.rank, " is out of range for group ", call.group));
      } else if (it == group.commits.end()) {
        status = absl::FailedPreconditionError(absl::StrCat(
            "collective #", call.sequence, " of group ", call.group,
            " has nothing to commit: it ran inline, is not decided yet, or "
            "was committed already"));
      } else if (it->second.calls[call.rank].has_value()) {
        status = absl::FailedPreconditionError(
            absl::StrCat("rank ", call.rank, " already committed #",
                         call.sequence, " of group ", call.group));
      } else {
        commit = &it->second;
      }
      if (commit != nullptr) {
        const int rank = call.rank;
        recorder_.Committed(group.view.name, group.view.epoch, call.sequence,
                            rank, clock_->Now());
        commit->calls[rank] = std::move(call);
        commit->done[rank] = std::move(done);
        if (++commit->arrived == group.view.world_size) {
          const absl::Status verdict = CheckResultHashes(
              group.view.name, group.view.epoch, it->first, *commit);
          recorder_.Ended(group.view.name, group.view.epoch, it->first, verdict,
                          clock_->Now());
          for (CommitCallback& waiter : commit->done) {
            completions.push_back(
                [waiter = std::move(waiter), verdict] { waiter(verdict); });
          }
          const uint64_t sequence = it->first;
          group.commits.erase(it);
          // Every rank had the previous leader's plan: the running calls
          // sent for it (AdoptCommitLocked) match nothing more. Only a
          // restored group takes running calls.
          if (group.restored && OnlyRunningLocked(group, sequence)) {
            group.pending.erase(sequence);
          }
        }
      }
    }
    if (commit == nullptr) {
      completions.push_back([done = std::move(done), status] { done(status); });
    }
    SaveChangedLocked();
  }
  for (auto& complete : completions) complete();
}

absl::Status GroupTable::ReportFailure(
    const std::string& group_name, uint64_t epoch, int rank, uint64_t sequence,
    const absl::Status& failure, const std::vector<int>& lost, bool leaving) {
  Completions completions;
  absl::Status verdict;
  {
    absl::MutexLock lock(&mu_);
    auto it = groups_.find(group_name);
    if (it == groups_.end()) {
      return absl::NotFoundError(
          absl::StrCat("unknown group \"", group_name, "\""));
    }
    Group& group = it->second;
    if (group.view.epoch != epoch) {
      auto revoked = successions_.find({group_name, epoch});
      if (revoked != successions_.end()) return revoked->second.revoked;
      return WithErrorDetail(
          absl::FailedPreconditionError(
              absl::StrCat("stale epoch ", epoch, " for group ", group_name)),
          MakeErrorDetail("STALE_EPOCH", group_name, epoch, 0));
    }
    if (group.view.min_world_size > 0 && group.aborted.ok()) {
      verdict = ReportElasticLocked(group, rank, sequence, failure, lost,
                                    leaving, &completions);
    } else {
      verdict =
          AbortForFailureLocked(group, rank, sequence, failure, &completions);
    }
    SaveChangedLocked();
  }
  for (auto& complete : completions) complete();
  return verdict;
}

absl::Status GroupTable::AbortForFailureLocked(Group& group, int rank,
                                               uint64_t sequence,
                                               const absl::Status& failure,
                                               Completions* completions) {
  const std::string& group_name = group.view.name;
  const uint64_t epoch = group.view.epoch;
  // Sequence 0: no collective failed; the rank itself is gone (its worker
  // saw its client process go away).
  const std::string what = sequence == 0
                               ? std::string(" is gone")
                               : absl::StrCat(" failed collective #", sequence);
  const std::string why =
      failure.ToString(absl::StatusToStringMode::kWithNoExtraData);
  v1::ErrorDetail detail = MakeErrorDetail(
      sequence == 0 ? "RANK_GONE" : "RANK_FAILED", group_name, epoch, sequence);
  if (sequence == 0) {
    detail.add_lost_ranks(rank);
  } else {
    (*detail.mutable_ranks())[rank] = why;
  }
  AbortGroupLocked(
      group,
      WithErrorDetail(absl::AbortedError(absl::StrCat(
                          "group ", group_name, " (epoch ", epoch,
                          ") aborted: rank ", rank, what, ": ", why)),
                      detail),
      sequence == 0 ? "rank_gone" : "data_plane_failure", Blame{{rank}, 0, ""},
      completions);
  return group.aborted;
}

absl::Status GroupTable::ReportElasticLocked(
    Group& group, int rank, uint64_t sequence, const absl::Status& failure,
    const std::vector<int>& lost, bool leaving, Completions* completions) {
  const GroupView view = group.view;
  if (rank < 0 || rank >= view.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is out of range for group ", view.name));
  }
  // Who goes: the rank itself when it is gone or leaves, and the ranks the
  // failure names as gone.
  std::vector<int> gone;
  if (leaving || sequence == 0) gone.push_back(rank);
  for (int r : lost) {
    if (r >= 0 && r < view.world_size) gone.push_back(r);
  }
  const char* reason = leaving         ? "left"
                       : sequence == 0 ? "rank_gone"
                                       : "data_plane_failure";
  const std::string status_text =
      failure.ToString(absl::StatusToStringMode::kWithNoExtraData);
  const std::string why =
      leaving         ? absl::StrCat("rank ", rank, " left the group")
      : sequence == 0 ? absl::StrCat("rank ", rank, " is gone: ", status_text)
                      : absl::StrCat("rank ", rank, " failed collective #",
                                     sequence, ": ", status_text);
  RevokeLocked(group, std::move(gone), reason, why, Blame{{rank}, 0, ""},
               completions);
  return successions_.at({view.name, view.epoch}).revoked;
}

// Commits: ranks that never commit leave the outcome unknown, so the group is
// aborted; the ranks that did commit learn who is missing.
void GroupTable::ExpireCommitsLocked(Group& group, absl::Time now,
                                     Completions* completions) {
  for (auto& [sequence, commit] : group.commits) {
    std::vector<int> missing;
    bool expired = false;
    for (int rank = 0; rank < group.view.world_size; ++rank) {
      if (!commit.calls[rank]) {
        missing.push_back(rank);
      } else {
        expired = expired || commit.calls[rank]->deadline <= now;
      }
    }
    if (!expired) continue;
    v1::ErrorDetail detail = MakeErrorDetail("COMMIT_MISSING", group.view.name,
                                             group.view.epoch, sequence);
    for (int rank : missing) detail.add_missing_ranks(rank);
    const absl::Status status =
        WithErrorDetail(absl::DeadlineExceededError(absl::StrCat(
                            FormatRanks(missing), " of group ", group.view.name,
                            " did not finish #", sequence,
                            " within the deadline; the group is aborted")),
                        detail);
    Event event = GroupEvent(Event::Kind::kDeadline, group.view, sequence,
                             std::string(status.message()));
    event.ranks = missing;
    event.status = status;
    PublishLocked(std::move(event), completions);
    if (group.view.min_world_size > 0) {
      // The ranks that never committed leave; the others go on, and every
      // call of the epoch, this commit included, ends with the revocation.
      RevokeLocked(group, missing, "commit_deadline",
                   std::string(status.message()), Blame{missing, 0, ""},
                   completions);
      return;
    }
    for (int rank = 0; rank < group.view.world_size; ++rank) {
      if (!commit.calls[rank]) continue;
      completions->push_back(
          [done = std::move(commit.done[rank]), status] { done(status); });
      commit.calls[rank].reset();
    }
    AbortGroupLocked(
        group,
        RewordedStatus(status, absl::StatusCode::kAborted, status.message()),
        "commit_deadline", Blame{missing, 0, ""}, completions);
    return;  // the abort cleared the commits
  }
}

}  // namespace chorus
