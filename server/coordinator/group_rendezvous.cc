// GroupTable's rendezvous: joins, retried joins, refused devices and the
// forming of a group epoch.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rank_list.h"
#include "common/status_detail.h"
#include "server/coordinator/group_table.h"

namespace chorus {
namespace {

// "group g formed at epoch 7 with 2 ranks: rank 0 on worker 1 "w0" Cpu, ..."
// (the members of groups up to 8 ranks).
std::string FormedText(const GroupView& view) {
  std::string text = absl::StrCat("group ", view.name, " formed at epoch ",
                                  view.epoch, " with ", view.world_size,
                                  view.world_size == 1 ? " rank" : " ranks");
  constexpr int kMembersShown = 8;
  if (view.world_size > kMembersShown) return text;
  absl::StrAppend(&text, ": ",
                  absl::StrJoin(view.members, ", ",
                                [](std::string* out, const GroupMember& m) {
                                  absl::StrAppend(out, "rank ", m.rank,
                                                  " on worker ", m.worker_id,
                                                  " \"", m.worker_name, "\" ",
                                                  CanonicalName(m.device));
                                }));
  return text;
}

// True when `b` repeats the join `a` (a retried join).
bool SameJoin(const JoinRequest& a, const JoinRequest& b) {
  return a.worker_id == b.worker_id && a.world_size == b.world_size &&
         SameDevice(a.device, b.device);
}

}  // namespace

absl::Status GroupTable::ValidateJoinLocked(const JoinRequest& request) const {
  if (request.group.empty()) {
    return absl::InvalidArgumentError("group name must not be empty");
  }
  if (request.world_size <= 0 || request.world_size > options_.max_world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "world size ", request.world_size, " of group ", request.group,
        " is out of range [1, ", options_.max_world_size, "]"));
  }
  if (request.rank < 0 || request.rank >= request.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", request.rank, " is out of range for group ",
                     request.group, " of world size ", request.world_size));
  }
  if (absl::Status elastic = ValidateElasticLocked(request); !elastic.ok()) {
    return elastic;
  }
  auto forming = forming_.find(request.group);
  if (forming != forming_.end()) {
    const Formation& formation = forming->second;
    if (formation.world_size != request.world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("group ", request.group, " is forming with world size ",
                       formation.world_size, "; rank ", request.rank,
                       " asked for ", request.world_size));
    }
    if (formation.joined > 0 &&
        (formation.min_world_size != request.min_world_size ||
         formation.max_world_size != request.max_world_size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "group ", request.group, " is forming with min_world_size ",
          formation.min_world_size, " and max_world_size ",
          formation.max_world_size, "; rank ", request.rank, " asked for ",
          request.min_world_size, " and ", request.max_world_size));
    }
    const std::optional<PendingJoin>& slot = formation.slots[request.rank];
    if (slot.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", request.rank, " of group ", request.group,
          " was already joined by worker \"", slot->member.worker_name,
          "\" (id ", slot->member.worker_id, ")"));
    }
  }
  return absl::OkStatus();
}

bool GroupTable::AnswerRetriedJoinLocked(JoinRequest& request,
                                         JoinCallback& done,
                                         Completions* completions) {
  if (request.request_id.empty()) return false;
  auto forming = forming_.find(request.group);
  if (forming != forming_.end() && request.rank >= 0 &&
      request.rank < forming->second.world_size) {
    std::optional<PendingJoin>& slot = forming->second.slots[request.rank];
    if (slot && slot->request.request_id == request.request_id &&
        SameJoin(slot->request, request)) {
      // The first attempt's caller is gone; the retry takes its place.
      completions->push_back([old = std::move(slot->done)] {
        old(absl::AbortedError("superseded by a retry of the same join"));
      });
      slot->done = std::move(done);
      slot->request.deadline = request.deadline;
      return true;
    }
  }
  auto formed = groups_.find(request.group);
  if (formed != groups_.end() && request.rank >= 0 &&
      request.rank < formed->second.view.world_size &&
      formed->second.request_ids[request.rank] == request.request_id &&
      formed->second.view.world_size == request.world_size &&
      formed->second.view.members[request.rank].worker_id ==
          request.worker_id &&
      SameDevice(formed->second.view.members[request.rank].device,
                 request.device)) {
    completions->push_back(
        [done = std::move(done), view = formed->second.view] { done(view); });
    return true;
  }
  return false;
}

void GroupTable::Join(JoinRequest request, JoinCallback done) {
  Completions completions;
  {
    absl::MutexLock lock(&mu_);
    if (!AnswerRetriedJoinLocked(request, done, &completions)) {
      JoinLocked(std::move(request), std::move(done), &completions);
    }
    SaveChangedLocked();
  }
  for (auto& complete : completions) complete();
}

bool GroupTable::FormationEmpty(const Formation& formation) {
  return formation.joined == 0 && formation.refused.empty();
}

absl::Status GroupTable::RefusedFormationStatus(const std::string& group,
                                                const Formation& formation) {
  std::vector<std::string> parts;
  for (const auto& [rank, refusal] : formation.refused) {
    parts.push_back(absl::StrCat("rank ", rank, " of group ", group,
                                 " was refused: ", refusal));
  }
  v1::ErrorDetail detail = MakeErrorDetail("DEVICE_REFUSED", group, 0, 0);
  for (const auto& [rank, refusal] : formation.refused) {
    (*detail.mutable_ranks())[rank] = refusal;
  }
  return WithErrorDetail(
      absl::FailedPreconditionError(
          absl::StrCat(absl::StrJoin(parts, "; "),
                       "; the group cannot form until that rank joins on a "
                       "device with distributed support")),
      detail);
}

void GroupTable::RefuseJoinLocked(const JoinRequest& request,
                                  const absl::Status& refusal,
                                  Completions* completions) {
  Formation& formation = forming_[request.group];
  if (formation.slots.empty()) {
    formation.world_size = request.world_size;
    formation.slots.resize(request.world_size);
  }
  formation.refused[request.rank] = std::string(refusal.message());
  formation.refused_until =
      std::max(formation.refused_until,
               std::min(request.deadline, clock_->Now() + kRefusalMemory));
  const absl::Status failed = RefusedFormationStatus(request.group, formation);
  for (std::optional<PendingJoin>& slot : formation.slots) {
    if (!slot || slot->request.rank == request.rank) continue;
    completions->push_back(
        [done = std::move(slot->done), failed] { done(failed); });
    slot.reset();
    --formation.joined;
  }
}

GroupMember GroupTable::MemberOf(const JoinRequest& request,
                                 const WorkerRecord& worker) {
  GroupMember member;
  member.rank = request.rank;
  member.worker_id = worker.id;
  member.worker_name = worker.registration.name;
  member.host = worker.registration.host;
  member.machine = worker.registration.machine;
  member.address = worker.registration.address;
  member.data_port = worker.registration.data_port;
  member.incarnation = worker.registration.incarnation;
  member.nccl_version = worker.registration.nccl_version;
  member.device = request.device;
  for (const Device& d : worker.registration.devices) {
    if (SameDevice(d, request.device)) member.device = d;
  }
  return member;
}

namespace {

// One host: the same machine and network namespace where workers said (a
// host name alone where one did not).
std::string HostKey(const GroupMember& m) {
  return m.machine.empty() ? absl::StrCat("name:", m.host)
                           : absl::StrCat("machine:", m.machine);
}

}  // namespace

bool GroupTable::SameHost(const std::vector<GroupMember>& members) {
  return !members.empty() && !members[0].host.empty() &&
         std::all_of(members.begin(), members.end(), [&](const GroupMember& m) {
           return HostKey(m) == HostKey(members[0]);
         });
}

bool GroupTable::AllHaveNccl(const std::vector<GroupMember>& members) {
  absl::flat_hash_set<std::string> gpus;
  for (const GroupMember& m : members) {
    if (m.nccl_version == 0 || m.nccl_version != members[0].nccl_version ||
        m.device.kind != DeviceKind::kCuda ||
        !gpus.insert(absl::StrCat(HostKey(m), "/", m.device.index)).second) {
      return false;
    }
  }
  return !members.empty();
}

void GroupTable::JoinLocked(JoinRequest request, JoinCallback done,
                            Completions* completions) {
  if (request.follow_epoch != 0) {
    FollowLocked(std::move(request), std::move(done), completions);
    return;
  }
  if (request.newcomer) {
    NewcomerLocked(std::move(request), std::move(done), completions);
    return;
  }
  absl::Status valid = ValidateJoinLocked(request);
  absl::StatusOr<WorkerRecord> worker =
      valid.ok() ? registry_->ResolveMember(request.worker_id, request.device)
                 : absl::StatusOr<WorkerRecord>(valid);
  if (!worker.ok()) {
    if (valid.ok() && absl::IsUnimplemented(worker.status())) {
      RefuseJoinLocked(request, worker.status(), completions);
    }
    completions->push_back(
        [done = std::move(done), status = worker.status()] { done(status); });
    return;
  }
  GroupMember member = MemberOf(request, *worker);
  Formation& formation = forming_[request.group];
  if (formation.slots.empty()) {
    formation.world_size = request.world_size;
    formation.slots.resize(request.world_size);
  }
  formation.min_world_size = request.min_world_size;
  formation.max_world_size = request.max_world_size;
  // A refused rank that joins on a supported device clears its refusal.
  formation.refused.erase(request.rank);
  formation.gave_up.erase(request.rank);
  if (!formation.refused.empty()) {
    completions->push_back([done = std::move(done),
                            status = RefusedFormationStatus(
                                request.group, formation)] { done(status); });
    return;
  }
  const int rank = request.rank;
  const std::string name = request.group;
  formation.slots[rank] =
      PendingJoin{std::move(request), std::move(member), std::move(done)};
  if (formation.joined == 0) formation.first_join = clock_->Now();
  if (++formation.joined == formation.world_size) {
    Formation complete = std::move(formation);
    forming_.erase(name);
    FormGroupLocked(name, std::move(complete), completions);
  }
}

void GroupTable::FormGroupLocked(const std::string& name, Formation formation,
                                 Completions* completions) {
  GroupView view;
  view.name = name;
  auto [epoch, inserted] = epochs_.try_emplace(name, options_.first_epoch);
  view.epoch = ++epoch->second;
  view.world_size = formation.world_size;
  view.min_world_size = formation.min_world_size;
  view.max_world_size =
      formation.max_world_size > 0 || formation.min_world_size == 0
          ? formation.max_world_size
          : options_.max_world_size;
  for (std::optional<PendingJoin>& slot : formation.slots) {
    view.members.push_back(slot->member);
  }
  view.same_host = SameHost(view.members);
  view.nccl = AllHaveNccl(view.members);
  auto old = groups_.find(name);
  if (old != groups_.end()) {
    const absl::Status reformed = absl::AbortedError(
        absl::StrCat("group ", name, " was formed again at epoch ", view.epoch,
                     "; call again with the new epoch"));
    recorder_.EndAll(name, old->second.view.epoch, reformed, clock_->Now());
    for (auto& [sequence, match] : old->second.pending) {
      StallEndedLocked(old->second, sequence, match, reformed, completions);
      for (std::optional<ArrivedCall>& arrived : match.calls) {
        if (!arrived) continue;
        completions->push_back(
            [done = std::move(arrived->done), reformed] { done(reformed); });
      }
    }
    // Newcomers waiting to join the old epoch get the same answer.
    for (PendingJoin& joiner : old->second.joiners) {
      completions->push_back(
          [done = std::move(joiner.done), reformed] { done(reformed); });
    }
    // Ranks waiting for the others' commits get the same answer.
    for (auto& [sequence, commit] : old->second.commits) {
      for (size_t rank = 0; rank < commit.calls.size(); ++rank) {
        if (!commit.calls[rank]) continue;
        completions->push_back([done = std::move(commit.done[rank]), reformed] {
          done(reformed);
        });
      }
    }
    groups_.erase(old);
  }
  Group& group = groups_[name];
  group.view = view;
  unsaved_.insert(name);
  group.next_sequence.assign(view.world_size, 1);
  group.called_ahead.resize(view.world_size);
  group.last_outcome.resize(view.world_size);
  for (std::optional<PendingJoin>& slot : formation.slots) {
    group.request_ids.push_back(slot->request.request_id);
  }
  PublishLocked(
      GroupEvent(Event::Kind::kGroupFormed, view, 0, FormedText(view)),
      completions);
  // Every rank gets the same view: one copy, shared by the completions.
  auto formed =
      std::make_shared<const absl::StatusOr<GroupView>>(std::move(view));
  for (std::optional<PendingJoin>& slot : formation.slots) {
    completions->push_back(
        [done = std::move(slot->done), formed] { done(*formed); });
  }
}

// Joins: a rank whose deadline passed leaves the formation.
void GroupTable::ExpireJoinsLocked(absl::Time now, Completions* completions) {
  for (auto it = forming_.begin(); it != forming_.end();) {
    Formation& formation = it->second;
    std::vector<int> missing;
    for (int rank = 0; rank < formation.world_size; ++rank) {
      if (!formation.slots[rank] && formation.gave_up.count(rank) == 0) {
        missing.push_back(rank);
      }
    }
    const std::vector<int> gave_up(formation.gave_up.begin(),
                                   formation.gave_up.end());
    std::string why =
        missing.empty()
            ? ""
            : absl::StrCat(FormatRanks(missing), " of group ", it->first,
                           " did not join within the deadline (world size ",
                           formation.world_size, ")");
    if (!gave_up.empty()) {
      absl::StrAppend(
          &why,
          why.empty() ? absl::StrCat("group ", it->first,
                                     " did not form within the deadline "
                                     "(world size ",
                                     formation.world_size, "): ")
                      : "; ",
          FormatRanks(gave_up), " joined but left at ",
          gave_up.size() == 1 ? "its own deadline" : "their own deadlines");
    }
    bool expired = false;
    for (std::optional<PendingJoin>& slot : formation.slots) {
      if (!slot || slot->request.deadline > now) continue;
      expired = true;
      v1::ErrorDetail detail =
          MakeErrorDetail("RANKS_MISSING", it->first, 0, 0);
      for (int rank : missing) detail.add_missing_ranks(rank);
      const absl::Status status =
          WithErrorDetail(absl::DeadlineExceededError(why), detail);
      formation.gave_up.insert(slot->request.rank);
      completions->push_back(
          [done = std::move(slot->done), status] { done(status); });
      slot.reset();
      --formation.joined;
    }
    if (expired) {
      Event event;
      event.kind = Event::Kind::kDeadline;
      event.group = it->first;
      event.ranks = missing;
      event.status = absl::DeadlineExceededError(why);
      event.text = why;
      PublishLocked(std::move(event), completions);
    }
    if (formation.refused_until <= now) formation.refused.clear();
    if (FormationEmpty(formation)) {
      forming_.erase(it++);
    } else {
      ++it;
    }
  }
}

}  // namespace chorus
