#include "server/coordinator/group_table.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/common/rank_list.h"
#include "server/coordinator/inline_executor.h"

namespace chorus {
namespace {

std::string CallName(const std::string& group, uint64_t sequence,
                     const CollectiveSpec& spec) {
  return absl::StrCat(CollectiveKindName(spec.kind), " #", sequence,
                      " of group ", group);
}

// True when `b` repeats the join `a` (a retried join).
bool SameJoin(const JoinRequest& a, const JoinRequest& b) {
  return a.worker_id == b.worker_id && a.world_size == b.world_size &&
         SameDevice(a.device, b.device);
}

// True when `b` repeats `a` exactly (a retried call).
bool SameCall(const CollectiveCall& a, const CollectiveCall& b) {
  return SpecsAgree(a.spec, b.spec) && a.algorithm == b.algorithm &&
         a.has_data == b.has_data && a.data == b.data &&
         a.device.has_value() == b.device.has_value() &&
         (!a.device.has_value() || SameDevice(*a.device, *b.device));
}

}  // namespace

GroupTable::GroupTable(Clock* clock, Registry* registry,
                       GroupTableOptions options)
    : clock_(clock), registry_(registry), options_(std::move(options)) {}

GroupTable::~GroupTable() = default;

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
  auto forming = forming_.find(request.group);
  if (forming != forming_.end()) {
    const Formation& formation = forming->second;
    if (formation.world_size != request.world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("group ", request.group, " is forming with world size ",
                       formation.world_size, "; rank ", request.rank,
                       " asked for ", request.world_size));
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
  }
  for (auto& complete : completions) complete();
}

absl::Status GroupTable::CheckResultHashes(const std::string& group,
                                           uint64_t sequence,
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
  return absl::DataLossError(absl::StrCat(
      "the results of ", CallName(group, sequence, commit.spec), " differ: ",
      FormatRanks(differing), differing.size() == 1 ? " holds" : " hold",
      " other bytes than ", FormatRanks(largest->second),
      " (result hashes differ); no rank's output of this call can be "
      "trusted"));
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
  return absl::FailedPreconditionError(
      absl::StrCat(absl::StrJoin(parts, "; "),
                   "; the group cannot form until that rank joins on a "
                   "device with distributed support"));
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

void GroupTable::JoinLocked(JoinRequest request, JoinCallback done,
                            Completions* completions) {
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
  GroupMember member;
  member.rank = request.rank;
  member.worker_id = worker->id;
  member.worker_name = worker->registration.name;
  member.host = worker->registration.host;
  member.address = worker->registration.address;
  member.device = request.device;
  for (const Device& d : worker->registration.devices) {
    if (SameDevice(d, request.device)) member.device = d;
  }
  Formation& formation = forming_[request.group];
  if (formation.slots.empty()) {
    formation.world_size = request.world_size;
    formation.slots.resize(request.world_size);
  }
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
  for (std::optional<PendingJoin>& slot : formation.slots) {
    view.members.push_back(slot->member);
  }
  view.same_host = !view.members.empty() && !view.members[0].host.empty() &&
                   std::all_of(view.members.begin(), view.members.end(),
                               [&](const GroupMember& m) {
                                 return m.host == view.members[0].host;
                               });
  auto old = groups_.find(name);
  if (old != groups_.end()) {
    const absl::Status reformed = absl::AbortedError(
        absl::StrCat("group ", name, " was formed again at epoch ", view.epoch,
                     "; call again with the new epoch"));
    for (auto& [sequence, match] : old->second.pending) {
      for (std::optional<ArrivedCall>& arrived : match.calls) {
        if (!arrived) continue;
        completions->push_back(
            [done = std::move(arrived->done), reformed] { done(reformed); });
      }
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
  group.next_sequence.assign(view.world_size, 1);
  group.called_ahead.resize(view.world_size);
  group.last_outcome.resize(view.world_size);
  for (std::optional<PendingJoin>& slot : formation.slots) {
    group.request_ids.push_back(slot->request.request_id);
  }
  // Every rank gets the same view: one copy, shared by the completions.
  auto formed =
      std::make_shared<const absl::StatusOr<GroupView>>(std::move(view));
  for (std::optional<PendingJoin>& slot : formation.slots) {
    completions->push_back(
        [done = std::move(slot->done), formed] { done(*formed); });
  }
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
    return absl::FailedPreconditionError(
        absl::StrCat("stale epoch ", epoch, " for group ", name,
                     ", which is at epoch ", group.view.epoch, "; join again"));
  }
  if (!group.aborted.ok()) return group.aborted;
  return &group;
}

absl::Status GroupTable::ValidateCallLocked(const CollectiveCall& call,
                                            Group** out) {
  absl::StatusOr<Group*> found = FindGroupLocked(call.group, call.epoch);
  if (!found.ok()) return found.status();
  Group& group = **found;
  const int world = group.view.world_size;
  if (call.rank < 0 || call.rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", call.rank, " is out of range for group ",
                     call.group, " of world size ", world));
  }
  const uint64_t expected = group.next_sequence[call.rank];
  if (call.sequence == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", call.rank, " of group ", call.group,
                     " sent sequence 0; sequences start at 1"));
  }
  if (call.sequence >= expected + options_.sequence_window) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", call.rank, " of group ", call.group, " sent sequence ",
        call.sequence, " from the future; its oldest uncalled is #", expected,
        " and at most ", options_.sequence_window, " may be outstanding"));
  }
  if (CalledLocked(group, call.rank, call.sequence)) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", call.rank, " of group ", call.group,
                     " already called #", call.sequence));
  }
  absl::Status spec = ValidateSpec(call.spec, world);
  if (!spec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", call.rank, " of group ", call.group, ": ", spec.message()));
  }
  const int algorithm = static_cast<int>(call.algorithm);
  if (algorithm < static_cast<int>(Algorithm::kUnspecified) ||
      algorithm > static_cast<int>(Algorithm::kSameHost)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", call.rank, " of group ", call.group,
                     ": unknown algorithm ", algorithm));
  }
  if (call.device.has_value()) {
    absl::Status device = ValidateDevice(*call.device);
    if (!device.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", call.rank,
                                                     " of group ", call.group,
                                                     ": ", device.message()));
    }
  }
  if (absl::StatusOr<Plan> plan =
          ChoosePlan(call.spec, world, call.algorithm, options_.planner,
                     group.view.same_host);
      !plan.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", call.rank, " of group ", call.group, ": ",
                     plan.status().message()));
  }
  if (call.has_data) {
    absl::Status size =
        CheckInputSize(call.spec, world, call.rank, call.data.size());
    if (!size.ok()) return size;
  } else if (!call.data.empty()) {
    return absl::InvalidArgumentError("data given without has_data");
  }
  *out = &group;
  return absl::OkStatus();
}

bool GroupTable::AnswerRetriedCallLocked(CollectiveCall& call,
                                         CollectiveCallback& done,
                                         Completions* completions) {
  auto it = groups_.find(call.group);
  if (it == groups_.end()) return false;
  Group& group = it->second;
  if (call.epoch != group.view.epoch || call.rank < 0 ||
      call.rank >= group.view.world_size ||
      !CalledLocked(group, call.rank, call.sequence)) {
    return false;
  }
  auto pending = group.pending.find(call.sequence);
  if (pending != group.pending.end() && pending->second.calls[call.rank]) {
    ArrivedCall& arrived = *pending->second.calls[call.rank];
    // Only the same call again is a retry; anything else reuses a sequence.
    if (!SameCall(arrived.call, call)) return false;
    // The first attempt's caller is gone; the retry takes its place.
    completions->push_back([old = std::move(arrived.done)] {
      old(absl::AbortedError("superseded by a retry of the same call"));
    });
    arrived.done = std::move(done);
    arrived.call.deadline = call.deadline;
    return true;
  }
  const auto& last = group.last_outcome[call.rank];
  if (last.has_value() && last->call.sequence == call.sequence &&
      SameCall(last->call, call)) {
    completions->push_back(
        [done = std::move(done), outcome = last->outcome] { done(outcome); });
    return true;
  }
  return false;
}

void GroupTable::Collective(CollectiveCall call, CollectiveCallback done) {
  Completions completions;
  {
    absl::MutexLock lock(&mu_);
    if (!AnswerRetriedCallLocked(call, done, &completions)) {
      CollectiveLocked(std::move(call), std::move(done), &completions);
    }
  }
  for (auto& complete : completions) complete();
}

void GroupTable::CollectiveLocked(CollectiveCall call, CollectiveCallback done,
                                  Completions* completions) {
  Group* group = nullptr;
  absl::Status valid = ValidateCallLocked(call, &group);
  if (!valid.ok()) {
    completions->push_back([done = std::move(done), valid] { done(valid); });
    return;
  }
  const uint64_t sequence = call.sequence;
  const int rank = call.rank;
  MarkCalledLocked(*group, rank, sequence);
  auto failed = group->failed.find(sequence);
  if (failed != group->failed.end()) {
    // The match already ended without this rank.
    group->last_outcome[rank] = LastCall{std::move(call), failed->second};
    completions->push_back(
        [done = std::move(done), status = failed->second] { done(status); });
    PruneFailedLocked(*group);
    return;
  }
  Match& match = group->pending[sequence];
  if (match.calls.empty()) {
    match.calls.resize(group->view.world_size);
    match.first_arrival = clock_->Now();
  }
  match.calls[rank] = ArrivedCall{std::move(call), std::move(done)};
  if (++match.arrived == group->view.world_size) {
    DecideLocked(*group, sequence, completions);
  }
}

void GroupTable::DecideLocked(Group& group, uint64_t sequence,
                              Completions* completions) {
  Match match = std::move(group.pending.at(sequence));
  group.pending.erase(sequence);
  ++group.completed;
  const int world = group.view.world_size;
  const std::string& name = group.view.name;
  const CollectiveSpec& first = match.calls[0]->call.spec;

  // 1. Devices: a refused rank gets its refusal, every other rank a status
  // naming it.
  std::vector<absl::Status> refusals(world);
  std::vector<std::string> refused;
  for (int rank = 0; rank < world; ++rank) {
    const CollectiveCall& call = match.calls[rank]->call;
    if (!call.device.has_value()) continue;
    absl::StatusOr<WorkerRecord> worker = registry_->ResolveMember(
        group.view.members[rank].worker_id, *call.device);
    if (!worker.ok()) {
      refusals[rank] = worker.status();
      refused.push_back(
          absl::StrCat("rank ", rank, ": ", worker.status().message()));
    }
  }
  if (!refused.empty()) {
    const absl::Status others = absl::FailedPreconditionError(
        absl::StrCat(CallName(name, sequence, first),
                     " cannot run: ", absl::StrJoin(refused, "; ")));
    for (int rank = 0; rank < world; ++rank) {
      absl::Status status = refusals[rank].ok() ? others : refusals[rank];
      group.last_outcome[rank] =
          LastCall{std::move(match.calls[rank]->call), status};
      completions->push_back([done = std::move(match.calls[rank]->done),
                              status] { done(status); });
    }
    return;
  }

  // 2. Agreement on the spec and on a forced algorithm.
  bool agree = true;
  for (int rank = 1; rank < world; ++rank) {
    const CollectiveCall& call = match.calls[rank]->call;
    agree = agree && SpecsAgree(first, call.spec) &&
            call.algorithm == match.calls[0]->call.algorithm;
  }
  // Shared memory is host memory: a rank on a GPU reduces there, so groups
  // with one use the data plane.
  bool same_host = group.view.same_host;
  for (int rank = 0; rank < world && same_host; ++rank) {
    const std::optional<Device>& device = match.calls[rank]->call.device;
    const DeviceKind kind = device.has_value()
                                ? device->kind
                                : group.view.members[rank].device.kind;
    same_host = kind != DeviceKind::kCuda;
  }
  absl::StatusOr<Plan> plan =
      agree ? ChoosePlan(first, world, match.calls[0]->call.algorithm,
                         options_.planner, same_host)
            : absl::StatusOr<Plan>(absl::UnknownError(""));
  if (!agree) {
    std::vector<std::string> asked(world);
    for (int rank = 0; rank < world; ++rank) {
      const CollectiveCall& call = match.calls[rank]->call;
      asked[rank] = DescribeSpec(call.spec);
      if (call.algorithm != Algorithm::kUnspecified) {
        absl::StrAppend(&asked[rank], " algorithm ",
                        AlgorithmName(call.algorithm));
      }
    }
    plan = absl::InvalidArgumentError(
        absl::StrCat("collective #", sequence, " of group ", name,
                     " does not match across ranks: ", DescribeByRank(asked)));
  }

  // 3. Inline plans run here.
  std::vector<std::string> outputs(world);
  if (plan.ok() && plan->algorithm == Algorithm::kInline &&
      first.kind != CollectiveKind::kBarrier) {
    std::vector<const std::string*> inputs(world);
    std::vector<int> without_data;
    for (int rank = 0; rank < world; ++rank) {
      const CollectiveCall& call = match.calls[rank]->call;
      inputs[rank] = &call.data;
      if (!call.has_data) without_data.push_back(rank);
    }
    if (!without_data.empty()) {
      plan = absl::InvalidArgumentError(
          absl::StrCat(CallName(name, sequence, first), " runs inline, but ",
                       FormatRanks(without_data), " sent no data"));
    } else {
      absl::StatusOr<std::vector<std::string>> ran =
          RunInline(first, world, inputs);
      if (ran.ok()) {
        outputs = *std::move(ran);
      } else {
        plan = ran.status();
      }
    }
  }

  if (plan.ok() && plan->algorithm != Algorithm::kInline) {
    CommitMatch& commit = group.commits[sequence];
    commit.spec = first;
    commit.calls.resize(world);
    commit.done.resize(world);
  }
  for (int rank = 0; rank < world; ++rank) {
    absl::StatusOr<CollectiveOutcome> outcome =
        plan.ok() ? absl::StatusOr<CollectiveOutcome>(CollectiveOutcome{
                        sequence, *plan, std::move(outputs[rank])})
                  : absl::StatusOr<CollectiveOutcome>(plan.status());
    group.last_outcome[rank] =
        LastCall{std::move(match.calls[rank]->call), outcome};
    completions->push_back(
        [done = std::move(match.calls[rank]->done),
         outcome = std::move(outcome)]() mutable { done(std::move(outcome)); });
  }
}

void GroupTable::FailMatchLocked(Group& group, uint64_t sequence, Match& match,
                                 const absl::Status& status,
                                 Completions* completions) {
  for (std::optional<ArrivedCall>& arrived : match.calls) {
    if (!arrived) continue;
    group.last_outcome[arrived->call.rank] =
        LastCall{std::move(arrived->call), status};
    completions->push_back(
        [done = std::move(arrived->done), status] { done(status); });
  }
  group.failed[sequence] = status;
  ++group.completed;
  PruneFailedLocked(group);
}

bool GroupTable::CalledLocked(const Group& group, int rank, uint64_t sequence) {
  return sequence < group.next_sequence[rank] ||
         group.called_ahead[rank].contains(sequence);
}

void GroupTable::MarkCalledLocked(Group& group, int rank, uint64_t sequence) {
  uint64_t& next = group.next_sequence[rank];
  absl::flat_hash_set<uint64_t>& ahead = group.called_ahead[rank];
  if (sequence != next) {
    ahead.insert(sequence);
    return;
  }
  ++next;
  while (ahead.erase(next) > 0) ++next;
}

void GroupTable::PruneFailedLocked(Group& group) {
  const uint64_t slowest =
      *std::min_element(group.next_sequence.begin(), group.next_sequence.end());
  while (!group.failed.empty() && group.failed.begin()->first < slowest) {
    group.failed.erase(group.failed.begin());
  }
}

void GroupTable::ExpireDeadlines() {
  Completions completions;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_->Now();
    // Joins: a rank whose deadline passed leaves the formation.
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
      for (std::optional<PendingJoin>& slot : formation.slots) {
        if (!slot || slot->request.deadline > now) continue;
        const absl::Status status = absl::DeadlineExceededError(why);
        formation.gave_up.insert(slot->request.rank);
        completions.push_back(
            [done = std::move(slot->done), status] { done(status); });
        slot.reset();
        --formation.joined;
      }
      if (formation.refused_until <= now) formation.refused.clear();
      if (FormationEmpty(formation)) {
        forming_.erase(it++);
      } else {
        ++it;
      }
    }
    // Matches: the first deadline to pass ends the match for every rank.
    for (auto& [name, group] : groups_) {
      for (auto it = group.pending.begin(); it != group.pending.end();) {
        Match& match = it->second;
        bool expired = false;
        std::vector<int> missing;
        const CollectiveSpec* spec = nullptr;
        for (int rank = 0; rank < group.view.world_size; ++rank) {
          if (!match.calls[rank]) {
            missing.push_back(rank);
            continue;
          }
          spec = &match.calls[rank]->call.spec;
          expired = expired || match.calls[rank]->call.deadline <= now;
        }
        if (!expired) {
          ++it;
          continue;
        }
        const absl::Status status = absl::DeadlineExceededError(
            absl::StrCat(FormatRanks(missing), " of group ", name,
                         " did not reach ", CollectiveKindName(spec->kind),
                         " #", it->first, " within the deadline"));
        const uint64_t sequence = it->first;
        Match expired_match = std::move(match);
        it = group.pending.erase(it);
        FailMatchLocked(group, sequence, expired_match, status, &completions);
      }
      // Commits: ranks that never commit leave the outcome unknown, so the
      // group is aborted; the ranks that did commit learn who is missing.
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
        const absl::Status status = absl::DeadlineExceededError(absl::StrCat(
            FormatRanks(missing), " of group ", name, " did not finish #",
            sequence, " within the deadline; the group is aborted"));
        for (int rank = 0; rank < group.view.world_size; ++rank) {
          if (!commit.calls[rank]) continue;
          completions.push_back(
              [done = std::move(commit.done[rank]), status] { done(status); });
          commit.calls[rank].reset();
        }
        AbortGroupLocked(group, absl::AbortedError(status.message()),
                         &completions);
        break;  // commits were cleared
      }
    }
  }
  for (auto& complete : completions) complete();
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
      if (call.rank < 0 || call.rank >= group.view.world_size) {
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
        commit->calls[rank] = std::move(call);
        commit->done[rank] = std::move(done);
        if (++commit->arrived == group.view.world_size) {
          const absl::Status verdict =
              CheckResultHashes(group.view.name, it->first, *commit);
          for (CommitCallback& waiter : commit->done) {
            completions.push_back(
                [waiter = std::move(waiter), verdict] { waiter(verdict); });
          }
          group.commits.erase(it);
        }
      }
    }
    if (commit == nullptr) {
      completions.push_back([done = std::move(done), status] { done(status); });
    }
  }
  for (auto& complete : completions) complete();
}

absl::Status GroupTable::ReportFailure(const std::string& group_name,
                                       uint64_t epoch, int rank,
                                       uint64_t sequence,
                                       const absl::Status& failure) {
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
      return absl::FailedPreconditionError(
          absl::StrCat("stale epoch ", epoch, " for group ", group_name));
    }
    AbortGroupLocked(
        group,
        absl::AbortedError(absl::StrCat(
            "group ", group_name, " (epoch ", epoch, ") aborted: rank ", rank,
            " failed collective #", sequence, ": ", failure.ToString())),
        &completions);
    verdict = group.aborted;
  }
  for (auto& complete : completions) complete();
  return verdict;
}

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
      AbortGroupLocked(
          group,
          absl::AbortedError(absl::StrCat(
              "group ", name, " (epoch ", group.view.epoch,
              ") aborted: ", FormatRanks(ranks), " on worker \"", worker_name,
              "\" (id ", worker_id, ") lost: ", why, "; join the group again")),
          &completions);
    }
    // Joins the lost worker made can no longer be answered.
    for (auto it = forming_.begin(); it != forming_.end();) {
      Formation& formation = it->second;
      for (std::optional<PendingJoin>& slot : formation.slots) {
        if (!slot || slot->member.worker_id != worker_id) continue;
        const absl::Status status = absl::AbortedError(absl::StrCat(
            "worker \"", worker_name, "\" (id ", worker_id, ") lost: ", why));
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
  }
  for (auto& complete : completions) complete();
}

void GroupTable::AbortGroupLocked(Group& group, const absl::Status& status,
                                  Completions* completions) {
  if (!group.aborted.ok()) return;
  group.aborted = status;
  for (auto& [sequence, match] : group.pending) {
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
      AbortGroupLocked(group, status, &completions);
    }
    groups_.clear();
    notices_.clear();
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
  return next;
}

std::vector<std::string> GroupTable::NewStalls(absl::Duration threshold) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  std::vector<std::string> stalls;
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
      stalls.push_back(absl::StrCat(
          CollectiveKindName(spec->kind), " #", sequence, " of group ", name,
          " has waited ", absl::FormatDuration(now - match.first_arrival),
          " for ", FormatRanks(missing)));
    }
  }
  return stalls;
}

std::vector<GroupSummary> GroupTable::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<GroupSummary> out;
  for (const auto& [name, group] : groups_) {
    GroupSummary summary;
    summary.view = group.view;
    summary.completed = group.completed;
    summary.aborted = group.aborted;
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

}  // namespace chorus
