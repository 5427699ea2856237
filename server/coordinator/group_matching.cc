// GroupTable's matching: the n-th call of every rank, checked for agreement,
// planned once, and run here when the plan is inline.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rank_list.h"
#include "common/status_detail.h"
#include "server/coordinator/group_table.h"
#include "server/reduce/cpu/inline_executor.h"

namespace chorus {
namespace {

// True when `b` repeats `a` exactly (a retried call).
bool SameCall(const CollectiveCall& a, const CollectiveCall& b) {
  return SpecsAgree(a.spec, b.spec) && a.algorithm == b.algorithm &&
         a.has_data == b.has_data && a.data == b.data &&
         a.device.has_value() == b.device.has_value() &&
         (!a.device.has_value() || SameDevice(*a.device, *b.device));
}

}  // namespace

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
      algorithm > static_cast<int>(Algorithm::kLeader)) {
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
  if (absl::Status forced =
          CheckForcedPlan(call.spec, call.algorithm, group.view.same_host,
                          options_.planner.nccl && group.view.nccl);
      !forced.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", call.rank, " of group ", call.group, ": ", forced.message()));
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
    NoteLeaderRanLocked(call);
    if (!call.running || TakeRunningLocked(call, done, &completions)) {
      TakeReplaysLocked(call, &completions);
      if (!AnswerRetriedCallLocked(call, done, &completions)) {
        CollectiveLocked(std::move(call), std::move(done), &completions);
      }
    }
    SaveChangedLocked();
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
  recorder_.Arrived(group->view.name, group->view.epoch, group->view.world_size,
                    sequence, rank, call.spec, clock_->Now());
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
  if (RefuseDevicesLocked(group, sequence, match, completions)) return;
  const int world = group.view.world_size;
  const CollectiveSpec& first = match.calls[0]->call.spec;
  std::vector<int> differing;
  const absl::Status agreement =
      CheckAgreement(group, sequence, match, &differing);
  absl::StatusOr<Plan> plan = agreement.ok() ? AgreedPlanLocked(group, match)
                                             : absl::StatusOr<Plan>(agreement);
  std::vector<std::string> outputs(world);
  // Inline plans run here.
  if (plan.ok() && plan->algorithm == Algorithm::kInline &&
      !KindCarriesNoData(first.kind)) {
    if (absl::Status ran =
            RunInlineMatch(group.view.name, sequence, match, &outputs);
        !ran.ok()) {
      plan = ran;
    }
  }
  if (plan.ok()) {
    recorder_.Decided(group.view.name, group.view.epoch, sequence,
                      plan->algorithm, clock_->Now());
  } else {
    recorder_.Ended(group.view.name, group.view.epoch, sequence, plan.status(),
                    clock_->Now());
  }
  if (!agreement.ok()) {
    Event event = GroupEvent(Event::Kind::kMismatch, group.view, sequence,
                             std::string(agreement.message()));
    event.ranks = std::move(differing);
    event.status = agreement;
    PublishLocked(std::move(event), completions);
  }
  StallEndedLocked(group, sequence, match, plan.status(), completions);
  if (plan.ok() && plan->algorithm != Algorithm::kInline) {
    CommitMatch& commit = group.commits[sequence];
    commit.spec = first;
    commit.calls.resize(world);
    commit.done.resize(world);
  }
  // A sync of an elastic group admits the newcomers waiting: every member's
  // outcome then carries the next epoch, formed below once the outcomes
  // are queued (the group is replaced by it).
  const bool admits = plan.ok() && first.kind == CollectiveKind::kSync &&
                      group.view.min_world_size > 0 && !group.joiners.empty();
  // Made only for such a sync: no other decision pays for it.
  struct Admission {
    std::shared_ptr<const GroupView> next;
    int still_waiting = 0;  // the newcomers left waiting after it
  };
  std::shared_ptr<Admission> admission =
      admits ? std::make_shared<Admission>() : nullptr;
  const int joiners = static_cast<int>(group.joiners.size());
  for (int rank = 0; rank < world; ++rank) {
    absl::StatusOr<CollectiveOutcome> outcome =
        plan.ok()
            ? absl::StatusOr<CollectiveOutcome>(CollectiveOutcome{
                  sequence, *plan, std::move(outputs[rank]), joiners, nullptr})
            : absl::StatusOr<CollectiveOutcome>(plan.status());
    group.last_outcome[rank] =
        LastCall{std::move(match.calls[rank]->call), outcome};
    completions->push_back([done = std::move(match.calls[rank]->done),
                            outcome = std::move(outcome), admission]() mutable {
      if (outcome.ok() && admission != nullptr) {
        outcome->next = admission->next;
        outcome->joiners_waiting = admission->still_waiting;
      }
      done(std::move(outcome));
    });
  }
  if (admission != nullptr) {
    AdmitJoinersLocked(group, &admission->next, completions);
    // `group` is the next epoch's now (or the same, none being admitted).
    admission->still_waiting = static_cast<int>(group.joiners.size());
  }
}

bool GroupTable::RefuseDevicesLocked(Group& group, uint64_t sequence,
                                     Match& match, Completions* completions) {
  const int world = group.view.world_size;
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
  if (refused.empty()) return false;
  v1::ErrorDetail detail = MakeErrorDetail("DEVICE_REFUSED", group.view.name,
                                           group.view.epoch, sequence);
  for (int rank = 0; rank < world; ++rank) {
    if (refusals[rank].ok()) continue;
    (*detail.mutable_ranks())[rank] = std::string(refusals[rank].message());
    if (detail.device().empty()) {
      detail.set_device(CanonicalName(*match.calls[rank]->call.device));
    }
  }
  const absl::Status others = WithErrorDetail(
      absl::FailedPreconditionError(absl::StrCat(
          CallName(group.view.name, sequence, match.calls[0]->call.spec),
          " cannot run: ", absl::StrJoin(refused, "; "))),
      detail);
  recorder_.Ended(group.view.name, group.view.epoch, sequence, others,
                  clock_->Now());
  StallEndedLocked(group, sequence, match, others, completions);
  for (int rank = 0; rank < world; ++rank) {
    absl::Status status = refusals[rank].ok() ? others : refusals[rank];
    group.last_outcome[rank] =
        LastCall{std::move(match.calls[rank]->call), status};
    completions->push_back(
        [done = std::move(match.calls[rank]->done), status] { done(status); });
  }
  return true;
}

absl::Status GroupTable::CheckAgreement(const Group& group, uint64_t sequence,
                                        const Match& match,
                                        std::vector<int>* differing) {
  const int world = group.view.world_size;
  const CollectiveCall& first = match.calls[0]->call;
  for (int rank = 1; rank < world; ++rank) {
    const CollectiveCall& call = match.calls[rank]->call;
    if (!SpecsAgree(first.spec, call.spec) ||
        call.algorithm != first.algorithm) {
      differing->push_back(rank);
    }
  }
  if (!differing->empty()) {
    std::vector<std::string> asked(world);
    for (int rank = 0; rank < world; ++rank) {
      const CollectiveCall& call = match.calls[rank]->call;
      asked[rank] = DescribeSpec(call.spec);
      if (call.algorithm != Algorithm::kUnspecified) {
        absl::StrAppend(&asked[rank], " algorithm ",
                        AlgorithmName(call.algorithm));
      }
    }
    v1::ErrorDetail detail = MakeErrorDetail("MISMATCH", group.view.name,
                                             group.view.epoch, sequence);
    for (int rank = 0; rank < world; ++rank) {
      (*detail.mutable_ranks())[rank] = asked[rank];
    }
    return WithErrorDetail(
        absl::InvalidArgumentError(absl::StrCat(
            "collective #", sequence, " of group ", group.view.name,
            " does not match across ranks: ", DescribeByRank(asked))),
        detail);
  }
  return absl::OkStatus();
}

absl::StatusOr<Plan> GroupTable::AgreedPlanLocked(const Group& group,
                                                  const Match& match) const {
  const int world = group.view.world_size;
  const CollectiveCall& first = match.calls[0]->call;
  // Shared memory is host memory: a rank on a GPU reduces there, so groups
  // with one use the data plane. NCCL needs every rank on the GPU it joined
  // on (the group's GPUs were checked distinct at its forming).
  bool host_memory = true;
  bool all_gpus = true;
  bool ranks_repeat = true;
  for (int rank = 0; rank < world; ++rank) {
    const Device& joined = group.view.members[rank].device;
    const std::optional<Device>& device = match.calls[rank]->call.device;
    ranks_repeat = ranks_repeat && match.calls[rank]->call.repeats_same_host;
    const DeviceKind kind = device.has_value() ? device->kind : joined.kind;
    host_memory = host_memory && kind != DeviceKind::kCuda;
    all_gpus = all_gpus && kind == DeviceKind::kCuda &&
               (!device.has_value() || device->index == joined.index);
  }
  return ChoosePlan(first.spec, world, first.algorithm, options_.planner,
                    group.view.same_host, host_memory,
                    all_gpus && group.view.nccl, ranks_repeat);
}

absl::Status GroupTable::RunInlineMatch(const std::string& group,
                                        uint64_t sequence, const Match& match,
                                        std::vector<std::string>* outputs) {
  const int world = static_cast<int>(match.calls.size());
  const CollectiveSpec& spec = match.calls[0]->call.spec;
  std::vector<const std::string*> inputs(world);
  std::vector<int> without_data;
  for (int rank = 0; rank < world; ++rank) {
    const CollectiveCall& call = match.calls[rank]->call;
    inputs[rank] = &call.data;
    if (!call.has_data) without_data.push_back(rank);
  }
  if (!without_data.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(CallName(group, sequence, spec), " runs inline, but ",
                     FormatRanks(without_data), " sent no data"));
  }
  absl::StatusOr<std::vector<std::string>> ran = RunInline(spec, world, inputs);
  if (!ran.ok()) return ran.status();
  *outputs = *std::move(ran);
  return absl::OkStatus();
}

void GroupTable::FailMatchLocked(Group& group, uint64_t sequence, Match& match,
                                 const absl::Status& status,
                                 Completions* completions) {
  StallEndedLocked(group, sequence, match, status, completions);
  for (std::optional<ArrivedCall>& arrived : match.calls) {
    if (!arrived) continue;
    group.last_outcome[arrived->call.rank] =
        LastCall{std::move(arrived->call), status};
    completions->push_back(
        [done = std::move(arrived->done), status] { done(status); });
  }
  recorder_.Ended(group.view.name, group.view.epoch, sequence, status,
                  clock_->Now());
  group.failed[sequence] = status;
  ++group.completed;
  PruneFailedLocked(group);
}

void GroupTable::NoteLeaderRanLocked(const CollectiveCall& call) {
  if (call.leader_ran.empty()) return;
  auto it = groups_.find(call.group);
  if (it == groups_.end()) return;
  Group& group = it->second;
  if (call.epoch != group.view.epoch || call.rank < 0 ||
      call.rank >= group.view.world_size) {
    return;
  }
  uint64_t& next = group.next_sequence[call.rank];
  absl::flat_hash_set<uint64_t>& ahead = group.called_ahead[call.rank];
  for (const auto& [first, last] : call.leader_ran) {
    // Only ranges before this call.
    if (first == 0 || first > last || last >= call.sequence) continue;
    if (first <= next) {
      next = std::max(next, last + 1);
      while (ahead.erase(next) > 0) ++next;
      continue;
    }
    // A call of the rank's before the range has not arrived yet: the range
    // is kept call by call, within the window.
    if (last - first >= options_.sequence_window) continue;
    for (uint64_t sequence = first; sequence <= last; ++sequence) {
      ahead.insert(sequence);
    }
  }
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

// Matches: the first deadline to pass ends the match for every rank.
void GroupTable::ExpireMatchesLocked(Group& group, absl::Time now,
                                     Completions* completions) {
  const std::string& name = group.view.name;
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
    v1::ErrorDetail detail =
        MakeErrorDetail("RANKS_MISSING", name, group.view.epoch, it->first);
    for (int rank : missing) detail.add_missing_ranks(rank);
    const absl::Status status =
        WithErrorDetail(absl::DeadlineExceededError(absl::StrCat(
                            FormatRanks(missing), " of group ", name,
                            " did not reach ", CollectiveKindName(spec->kind),
                            " #", it->first, " within the deadline")),
                        detail);
    const uint64_t sequence = it->first;
    Event event = GroupEvent(Event::Kind::kDeadline, group.view, sequence,
                             std::string(status.message()));
    event.ranks = missing;
    event.status = status;
    PublishLocked(std::move(event), completions);
    Match expired_match = std::move(match);
    it = group.pending.erase(it);
    FailMatchLocked(group, sequence, expired_match, status, completions);
  }
}

}  // namespace chorus
