#include "server/coordinator/coordinator.h"

#include <glog/logging.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/answer_margin.h"
#include "common/device.h"
#include "common/metrics.h"

namespace chorus {
namespace {

// Counts a worker that registered (new, or a new incarnation of a name).
void CountRegistered() {
  static Counter* const registered =
      DefaultMetrics()
          .Counters("chorus_worker_registrations_total",
                    "Worker registrations (retries of one are not counted).",
                    {})
          ->With({});
  registered->Add();
}

// Counts a worker that left the registry: "lease_expired", "deregistered"
// or "restarted" (replaced by a new incarnation).
void CountLost(const char* reason) {
  static CounterFamily* const lost = DefaultMetrics().Counters(
      "chorus_workers_lost_total",
      "Workers removed from the registry, by reason: lease_expired, "
      "deregistered, restarted.",
      {"reason"});
  lost->With({reason})->Add();
}

}  // namespace

namespace {

// " of job J", or nothing for the default job.
std::string OfJob(const std::string& job) {
  return job.empty() ? "" : absl::StrCat(" of job ", job);
}

// What a call on a group of a job with no registered worker gets: what an
// unknown group gets.
absl::Status UnknownJobGroup(const std::string& job, const std::string& group) {
  return absl::NotFoundError(absl::StrCat("unknown group \"", group, "\"",
                                          OfJob(job), "; join it first"));
}

}  // namespace

absl::Time CoreDeadline(absl::Time now, absl::Time client_deadline,
                        absl::Duration max_wait) {
  const absl::Time deadline = std::min(now + max_wait, client_deadline);
  return deadline - AnswerMargin(deadline - now);
}

Coordinator::Coordinator(Clock* clock, CoordinatorOptions options)
    : clock_(clock),
      options_(std::move(options)),
      events_(options_.event_queue_limit),
      registry_(clock, options_.lease_timeout, options_.groups.log),
      groups_(clock, &registry_, options_.groups, &events_),
      store_(clock, options_.store, options_.groups.log) {}

Coordinator::~Coordinator() {
  // Stopped before the registry and groups go: their steps use both.
  if (deadlines_ != nullptr) deadlines_->Stop();
  if (sweeper_ != nullptr) sweeper_->Stop();
  if (stall_reporter_ != nullptr) stall_reporter_->Stop();
}

void Coordinator::StartTimers() {
  deadlines_ = std::make_unique<WakeupLoop>([this] {
    planned_.store(kComputing);
    const absl::Time next = ExpireDeadlines();
    planned_.store(next == absl::InfiniteFuture() ? INT64_MAX
                                                  : absl::ToUnixNanos(next));
    return next;
  });
  sweeper_ = std::make_unique<WakeupLoop>(
      [this, due = absl::InfiniteFuture()]() mutable {
        due = SweepLeases(due);
        return due;
      });
  stall_reporter_ =
      std::make_unique<WakeupLoop>([this] { return ReportStalls(); });
  sweeper_->Start();
  deadlines_->Start();
  stall_reporter_->Start();
}

void Coordinator::Restore(const StoredState& state) {
  registry_.Restore(state.workers);
  std::map<std::string, std::vector<StoredGroup>> by_job;
  for (const StoredGroup& group : state.groups) {
    by_job[group.job].push_back(group);
  }
  for (const auto& [job, groups] : by_job) groups_.Make(job).Restore(groups);
  store_.Restore(state.keys);
  Event event;
  event.time = clock_->Now();
  event.kind = Event::Kind::kLeaderElected;
  event.text =
      absl::StrCat("elected leader; took over ", state.workers.size(),
                   " workers, ", state.groups.size(), " groups and ",
                   state.keys.size(), " store keys from the leader before");
  LOG(INFO) << event.text;
  if (events_.Publish(event)) events_.Wake();
}

void Coordinator::RunTimers() {
  EvictExpired();
  ExpireDeadlines();
}

absl::Time Coordinator::SweepLeases(absl::Time due) {
  const absl::Duration lease = registry_.lease_timeout();
  const absl::Duration late = clock_->Now() - due;
  if (!CheckLeading(options_.leadership).ok()) {
    // A standby, or a leader unsure of its etcd lease: its doors refuse
    // heartbeats, so nobody could renew.
    registry_.RenewAll();
    return clock_->Now() + lease / 4;
  }
  if (due != absl::InfiniteFuture() && late > lease / 2) {
    const int renewed = registry_.RenewAll();
    LOG(WARNING) << "the lease timer ran " << absl::FormatDuration(late)
                 << " late: this coordinator did not run meanwhile (stopped, "
                    "or its machine paused), so it heard no heartbeats; "
                 << renewed << " workers get a fresh lease of "
                 << absl::FormatDuration(lease) << " instead of eviction";
  }
  return EvictExpired();
}

absl::Time Coordinator::EvictExpired() {
  for (const WorkerRecord& r : registry_.EvictExpired()) {
    LOG(WARNING) << "evicted worker " << r.id << " \"" << r.registration.name
                 << "\": no heartbeat within the lease";
    CountLost("lease_expired");
    const std::string why =
        absl::StrCat("no heartbeat within the lease (",
                     absl::FormatDuration(registry_.lease_timeout()), ")");
    PublishWorkerEvent(Event::Kind::kWorkerLost, r.id, r.registration.job,
                       r.registration.name, "evicted", why);
    AbortWorker(r.registration.job, r.id, r.registration.name, why);
  }
  // Just after the earliest lease can expire, and at least once a lease
  // period (a worker registered meanwhile expires no earlier than that).
  return std::min(registry_.NextExpiry() + absl::Milliseconds(1),
                  clock_->Now() + registry_.lease_timeout());
}

absl::Time Coordinator::ExpireDeadlines() {
  for (GroupTable* table : groups_.All()) table->ExpireDeadlines();
  store_.ExpireWaits();
  return NextDeadline();
}

absl::Time Coordinator::NextDeadline() const {
  absl::Time next = store_.NextDeadline();
  for (GroupTable* table : groups_.All()) {
    next = std::min(next, table->NextDeadline());
  }
  return next;
}

std::vector<std::string> Coordinator::NewStalls(absl::Duration threshold) {
  std::vector<std::string> stalls;
  for (GroupTable* table : groups_.All()) {
    for (std::string& stall : table->NewStalls(threshold)) {
      if (!table->options().job.empty()) {
        absl::StrAppend(&stall, " (job ", table->options().job, ")");
      }
      stalls.push_back(std::move(stall));
    }
  }
  return stalls;
}

absl::Time Coordinator::ReportStalls() {
  for (const std::string& stall : NewStalls(options_.stall_report_after)) {
    LOG(WARNING) << "stalled: " << stall;
  }
  return clock_->Now() +
         std::max(options_.stall_report_after / 4, absl::Milliseconds(100));
}

void Coordinator::PublishWorkerEvent(Event::Kind kind, uint64_t id,
                                     const std::string& job,
                                     const std::string& name,
                                     std::string reason, std::string text) {
  Event event;
  event.time = clock_->Now();
  event.kind = kind;
  event.worker_id = id;
  event.job = job;
  event.worker_name = name;
  event.reason = std::move(reason);
  event.text =
      absl::StrCat("worker ", id, " \"", name, "\" ",
                   kind == Event::Kind::kWorkerLost ? "lost: " : "", text);
  if (events_.Publish(event)) events_.Wake();
}

absl::Time Coordinator::CoreDeadlineFor(absl::Time client_deadline) const {
  return CoreDeadline(clock_->Now(), client_deadline, options_.max_wait);
}

void Coordinator::DeadlineAdded(absl::Time deadline) {
  const int64_t at = planned_.load();
  if (deadlines_ != nullptr &&
      (at == kComputing || absl::ToUnixNanos(deadline) < at)) {
    deadlines_->Poke();
  }
}

absl::StatusOr<RegisterResult> Coordinator::Register(
    const WorkerRegistration& request) {
  // Before the registry: a worker that can join has its job's groups.
  groups_.Make(request.job);
  absl::StatusOr<RegisterResult> result = registry_.Register(request);
  if (!result.ok() || result->retried) return result;
  CountRegistered();
  if (result->replaced) {
    CountLost("restarted");
    const std::string why = "it restarted with a new incarnation";
    PublishWorkerEvent(Event::Kind::kWorkerLost, result->replaced_id,
                       request.job, request.name, "replaced", why);
    AbortWorker(request.job, result->replaced_id, request.name, why);
  }
  PublishWorkerEvent(
      Event::Kind::kWorkerRegistered, result->worker_id, request.job,
      request.name, "",
      absl::StrCat("registered at ", request.address, " (host ", request.host,
                   ", incarnation ", request.incarnation, ") with ",
                   absl::StrJoin(request.devices, ",",
                                 [](std::string* out, const Device& d) {
                                   out->append(CanonicalName(d));
                                 })));
  return result;
}

absl::Status Coordinator::Heartbeat(uint64_t id, uint64_t incarnation,
                                    uint64_t aborts_seen, HeartbeatReply* reply,
                                    const std::vector<Device>& withdrawn) {
  absl::Status status = registry_.Renew(id, incarnation);
  if (!status.ok()) return status;
  if (!withdrawn.empty()) {
    absl::StatusOr<std::vector<Device>> dropped =
        registry_.Withdraw(id, incarnation, withdrawn);
    if (dropped.ok() && !dropped->empty()) {
      LOG(WARNING) << "worker " << id << " withdrew "
                   << absl::StrJoin(*dropped, ",",
                                    [](std::string* out, const Device& d) {
                                      out->append(CanonicalName(d));
                                    });
    }
  }
  absl::StatusOr<std::string> job = registry_.JobOf(id);
  GroupTable* table = groups_.Find(job.ok() ? *job : "");
  if (table != nullptr) {
    reply->aborts = table->AbortsFor(id, aborts_seen, &reply->aborts_latest);
  }
  return absl::OkStatus();
}

absl::Status Coordinator::Deregister(uint64_t id, uint64_t incarnation) {
  absl::StatusOr<WorkerRecord> record = registry_.Deregister(id, incarnation);
  if (!record.ok()) return record.status();
  LOG(INFO) << "deregistered worker " << id;
  CountLost("deregistered");
  PublishWorkerEvent(Event::Kind::kWorkerLost, record->id,
                     record->registration.job, record->registration.name,
                     "deregistered", "it shut down");
  AbortWorker(record->registration.job, record->id, record->registration.name,
              "it shut down");
  return absl::OkStatus();
}

std::vector<WorkerRecord> Coordinator::Workers() const {
  return registry_.List();
}

void Coordinator::AbortWorker(const std::string& job, uint64_t id,
                              const std::string& name, const std::string& why) {
  if (GroupTable* table = groups_.Find(job)) table->AbortWorker(id, name, why);
}

std::vector<GroupSummary> Coordinator::Groups() const {
  std::vector<GroupSummary> all;
  for (GroupTable* table : groups_.All()) {
    for (GroupSummary& group : table->List()) all.push_back(std::move(group));
  }
  return all;
}

std::vector<FormingSummary> Coordinator::Forming() const {
  std::vector<FormingSummary> all;
  for (GroupTable* table : groups_.All()) {
    for (FormingSummary& group : table->Forming()) {
      all.push_back(std::move(group));
    }
  }
  return all;
}

absl::StatusOr<std::vector<GroupMember>> Coordinator::Members(
    const std::string& job, const std::string& group, uint64_t epoch,
    absl::Span<const int> ranks) const {
  GroupTable* table = groups_.Find(job);
  if (table == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("unknown group \"", group, "\"; join it first"));
  }
  return table->Members(group, epoch, ranks);
}

absl::StatusOr<std::vector<TraceEntry>> Coordinator::Trace(
    const std::string& job, const std::string& group) const {
  GroupTable* table = groups_.Find(job);
  std::vector<TraceEntry> entries;
  if (table != nullptr) entries = table->Trace(group);
  if (entries.empty()) {
    return absl::NotFoundError(
        absl::StrCat("the flight recorder has no collectives of group ", group,
                     job.empty() ? "" : " of job ", job));
  }
  return entries;
}

void Coordinator::Join(JoinRequest request, JoinCallback done) {
  const absl::Time deadline = CoreDeadlineFor(request.deadline);
  request.deadline = deadline;
  // An unknown worker's join goes to the default job's table, which
  // answers that the worker is registering again.
  const uint64_t worker_id = request.worker_id;
  absl::StatusOr<std::string> job = registry_.JobOf(worker_id);
  GroupTable* table = groups_.Find(job.ok() ? *job : "");
  if (table == nullptr) table = &groups_.default_table();
  // A join the table did not refuse at once renews its worker's lease, as
  // a heartbeat does (a refused one changes nothing).
  auto refused = std::make_shared<std::atomic<bool>>(false);
  // The view is shared by every rank's callback: taken by reference, not
  // copied per rank (a copy of N members per rank made a rendezvous cost
  // N * N).
  table->Join(std::move(request), [refused, done = std::move(done)](
                                      const absl::StatusOr<GroupView>& view) {
    if (!view.ok()) refused->store(true);
    done(view);
  });
  if (!refused->load()) registry_.HeardFrom(worker_id);
  DeadlineAdded(deadline);
}

void Coordinator::Collective(CollectiveCall call, CollectiveCallback done) {
  GroupTable* table = groups_.Find(call.job);
  if (table == nullptr) {
    done(UnknownJobGroup(call.job, call.group));
    return;
  }
  const absl::Time deadline = CoreDeadlineFor(call.deadline);
  call.deadline = deadline;
  table->Collective(std::move(call), std::move(done));
  DeadlineAdded(deadline);
}

void Coordinator::Store(const std::string& job, StoreOp op,
                        KeyStore::Done done) {
  const absl::Time deadline = CoreDeadlineFor(op.deadline);
  op.deadline = deadline;
  store_.Run(job, std::move(op), std::move(done));
  DeadlineAdded(deadline);
}

void Coordinator::Commit(CommitCall call, CommitCallback done) {
  GroupTable* table = groups_.Find(call.job);
  if (table == nullptr) {
    done(UnknownJobGroup(call.job, call.group));
    return;
  }
  const absl::Time deadline = CoreDeadlineFor(call.deadline);
  call.deadline = deadline;
  table->Commit(std::move(call), std::move(done));
  DeadlineAdded(deadline);
}

absl::Status Coordinator::ReportFailure(
    const std::string& job, const std::string& group, uint64_t epoch, int rank,
    uint64_t sequence, const absl::Status& failure,
    const std::vector<int>& lost, bool leaving) {
  GroupTable* table = groups_.Find(job);
  if (table == nullptr) return UnknownJobGroup(job, group);
  absl::Status verdict = table->ReportFailure(group, epoch, rank, sequence,
                                              failure, lost, leaving);
  if (absl::IsAborted(verdict))
    LOG(WARNING) << verdict.ToString(
        absl::StatusToStringMode::kWithNoExtraData);
  return verdict;
}

uint64_t Coordinator::LatestAbortNotice() const {
  uint64_t newest = 0;
  for (GroupTable* table : groups_.All()) {
    uint64_t latest = 0;
    table->AbortsFor(0, 0, &latest);
    newest = std::max(newest, latest);
  }
  return newest;
}

void Coordinator::Shutdown(const absl::Status& status) {
  for (GroupTable* table : groups_.All()) table->AbortAll(status);
  store_.Shutdown(status);
  events_.Close();
}

absl::Status Coordinator::AuthorizeWorker(const Identity& caller,
                                          uint64_t id) const {
  absl::StatusOr<std::string> name = registry_.NameOf(id);
  absl::StatusOr<std::string> job = registry_.JobOf(id);
  if (!name.ok() || !job.ok() || (*name == caller.name && *job == caller.job)) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "worker \"", caller.name, "\"", OfJob(caller.job),
      " may not act for worker ", id, " \"", *name, "\"", OfJob(*job)));
}

absl::Status Coordinator::AuthorizeRank(const Identity& caller,
                                        const std::string& group,
                                        uint64_t epoch, int rank) const {
  GroupTable* table = groups_.Find(caller.job);
  if (table == nullptr) return absl::OkStatus();  // the call is refused
  absl::StatusOr<std::string> name =
      table->MemberWorkerName(group, epoch, rank);
  if (!name.ok() || *name == caller.name) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("worker \"", caller.name, "\" may not act for rank ", rank,
                   " of group ", group, ": worker \"", *name, "\" holds it"));
}

}  // namespace chorus
