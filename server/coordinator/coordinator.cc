#include "server/coordinator/coordinator.h"

#include <glog/logging.h>

#include <algorithm>
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

absl::Time CoreDeadline(absl::Time now, absl::Time client_deadline,
                        absl::Duration max_wait) {
  const absl::Time deadline = std::min(now + max_wait, client_deadline);
  return deadline - AnswerMargin(deadline - now);
}

Coordinator::Coordinator(Clock* clock, CoordinatorOptions options)
    : clock_(clock),
      options_(std::move(options)),
      events_(options_.event_queue_limit),
      registry_(clock, options_.lease_timeout),
      groups_(clock, &registry_, options_.groups, &events_) {}

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

void Coordinator::RunTimers() {
  EvictExpired();
  ExpireDeadlines();
}

absl::Time Coordinator::SweepLeases(absl::Time due) {
  const absl::Duration lease = registry_.lease_timeout();
  const absl::Duration late = clock_->Now() - due;
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
    PublishWorkerEvent(Event::Kind::kWorkerLost, r.id, r.registration.name,
                       "evicted", why);
    groups_.AbortWorker(r.id, r.registration.name, why);
  }
  // Just after the earliest lease can expire, and at least once a lease
  // period (a worker registered meanwhile expires no earlier than that).
  return std::min(registry_.NextExpiry() + absl::Milliseconds(1),
                  clock_->Now() + registry_.lease_timeout());
}

absl::Time Coordinator::ExpireDeadlines() {
  groups_.ExpireDeadlines();
  return groups_.NextDeadline();
}

absl::Time Coordinator::ReportStalls() {
  for (const std::string& stall :
       groups_.NewStalls(options_.stall_report_after)) {
    LOG(WARNING) << "stalled: " << stall;
  }
  return clock_->Now() +
         std::max(options_.stall_report_after / 4, absl::Milliseconds(100));
}

void Coordinator::PublishWorkerEvent(Event::Kind kind, uint64_t id,
                                     const std::string& name,
                                     std::string reason, std::string text) {
  Event event;
  event.time = clock_->Now();
  event.kind = kind;
  event.worker_id = id;
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
  absl::StatusOr<RegisterResult> result = registry_.Register(request);
  if (!result.ok() || result->retried) return result;
  CountRegistered();
  if (result->replaced) {
    CountLost("restarted");
    const std::string why = "it restarted with a new incarnation";
    PublishWorkerEvent(Event::Kind::kWorkerLost, result->replaced_id,
                       request.name, "replaced", why);
    groups_.AbortWorker(result->replaced_id, request.name, why);
  }
  PublishWorkerEvent(
      Event::Kind::kWorkerRegistered, result->worker_id, request.name, "",
      absl::StrCat("registered at ", request.address, " (host ", request.host,
                   ", incarnation ", request.incarnation, ") with ",
                   absl::StrJoin(request.devices, ",",
                                 [](std::string* out, const Device& d) {
                                   out->append(CanonicalName(d));
                                 })));
  return result;
}

absl::Status Coordinator::Heartbeat(uint64_t id, uint64_t incarnation,
                                    uint64_t aborts_seen,
                                    HeartbeatReply* reply) {
  absl::Status status = registry_.Renew(id, incarnation);
  if (!status.ok()) return status;
  reply->aborts = groups_.AbortsFor(id, aborts_seen, &reply->aborts_latest);
  return absl::OkStatus();
}

absl::Status Coordinator::Deregister(uint64_t id, uint64_t incarnation) {
  absl::StatusOr<WorkerRecord> record = registry_.Deregister(id, incarnation);
  if (!record.ok()) return record.status();
  LOG(INFO) << "deregistered worker " << id;
  CountLost("deregistered");
  PublishWorkerEvent(Event::Kind::kWorkerLost, record->id,
                     record->registration.name, "deregistered", "it shut down");
  groups_.AbortWorker(record->id, record->registration.name, "it shut down");
  return absl::OkStatus();
}

std::vector<WorkerRecord> Coordinator::Workers() const {
  return registry_.List();
}

std::vector<GroupSummary> Coordinator::Groups() const { return groups_.List(); }

absl::StatusOr<std::vector<TraceEntry>> Coordinator::Trace(
    const std::string& group) const {
  std::vector<TraceEntry> entries = groups_.Trace(group);
  if (entries.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "the flight recorder has no collectives of group ", group));
  }
  return entries;
}

void Coordinator::Join(JoinRequest request, JoinCallback done) {
  const absl::Time deadline = CoreDeadlineFor(request.deadline);
  request.deadline = deadline;
  groups_.Join(std::move(request), std::move(done));
  DeadlineAdded(deadline);
}

void Coordinator::Collective(CollectiveCall call, CollectiveCallback done) {
  const absl::Time deadline = CoreDeadlineFor(call.deadline);
  call.deadline = deadline;
  groups_.Collective(std::move(call), std::move(done));
  DeadlineAdded(deadline);
}

void Coordinator::Commit(CommitCall call, CommitCallback done) {
  const absl::Time deadline = CoreDeadlineFor(call.deadline);
  call.deadline = deadline;
  groups_.Commit(std::move(call), std::move(done));
  DeadlineAdded(deadline);
}

absl::Status Coordinator::ReportFailure(
    const std::string& group, uint64_t epoch, int rank, uint64_t sequence,
    const absl::Status& failure, const std::vector<int>& lost, bool leaving) {
  absl::Status verdict = groups_.ReportFailure(group, epoch, rank, sequence,
                                               failure, lost, leaving);
  if (absl::IsAborted(verdict))
    LOG(WARNING) << verdict.ToString(
        absl::StatusToStringMode::kWithNoExtraData);
  return verdict;
}

uint64_t Coordinator::LatestAbortNotice() const {
  uint64_t latest = 0;
  groups_.AbortsFor(0, 0, &latest);
  return latest;
}

void Coordinator::Shutdown(const absl::Status& status) {
  groups_.AbortAll(status);
  events_.Close();
}

absl::Status Coordinator::AuthorizeWorker(const std::string& caller,
                                          uint64_t id) const {
  absl::StatusOr<std::string> name = registry_.NameOf(id);
  if (!name.ok() || *name == caller) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat("worker \"", caller,
                                                  "\" may not act for worker ",
                                                  id, " \"", *name, "\""));
}

absl::Status Coordinator::AuthorizeRank(const std::string& caller,
                                        const std::string& group,
                                        uint64_t epoch, int rank) const {
  absl::StatusOr<std::string> name =
      groups_.MemberWorkerName(group, epoch, rank);
  if (!name.ok() || *name == caller) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("worker \"", caller, "\" may not act for rank ", rank,
                   " of group ", group, ": worker \"", *name, "\" holds it"));
}

}  // namespace chorus
