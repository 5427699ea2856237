// Coordinator: the coordinator's core. It owns the registry of workers, the
// groups and their collectives, and the timers, and it keeps the rules that
// span them: a worker that is evicted (no heartbeat within its lease), that
// deregisters, or that registers again with a new incarnation aborts every
// group with one of its devices, and the workers holding those groups hear
// of it in their next heartbeat. Each job's groups are apart from the
// others' (job_groups.h): a worker's joins go to its job's groups, and the
// doors name the caller's job on every call. It owns the event hub
// (event_hub.h) that the event stream reads: workers registered and lost here,
// groups formed and aborted, stalls, mismatches and deadlines in the group
// table. It knows nothing about gRPC or sockets: the gRPC service, the call
// port and the fuzzers translate wire messages into these calls and statuses
// back into wire statuses.
//
// Every waiting call (join, collective, commit) carries the deadline its
// client set (InfiniteFuture() for none); the core ends it a little before
// that (CoreDeadline), and at most `max_wait` after it arrived, so the
// client receives the descriptive DEADLINE_EXCEEDED rather than its own bare
// one.
//
// Lifecycle: construct, then either StartTimers() (a real clock: background
// threads evict workers, end calls at their deadlines and log stalls) or
// drive RunTimers() by hand (a fake clock in tests). Shutdown() ends every
// pending call and every event subscription; the destructor stops the
// timers.
// Thread safety: every method is thread-safe. Callbacks run after the core's
// locks are released, on the calling thread or a timer thread. The clock is
// not owned and must outlive the core.
#ifndef CHORUS_SERVER_COORDINATOR_COORDINATOR_H_
#define CHORUS_SERVER_COORDINATOR_COORDINATOR_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/transport_security.h"
#include "common/wakeup_loop.h"
#include "server/coordinator/event_hub.h"
#include "server/coordinator/group_table.h"
#include "server/coordinator/job_groups.h"
#include "server/coordinator/key_store.h"
#include "server/coordinator/leadership.h"
#include "server/coordinator/registry.h"
#include "server/coordinator/state_log.h"

namespace chorus {

struct CoordinatorOptions {
  // A worker that sends no heartbeat for this long is evicted.
  absl::Duration lease_timeout = absl::Seconds(5);
  // Deadline of a waiting call whose client set none, and the most any call
  // may wait.
  absl::Duration max_wait = absl::Minutes(10);
  // A collective that has waited this long for some ranks is logged once
  // (and a kStallStarted event published).
  absl::Duration stall_report_after = absl::Seconds(10);
  // Events each event subscriber may fall behind by before it loses the
  // oldest.
  size_t event_queue_limit = EventHub::kDefaultQueueLimit;
  // With --etcd: whether this coordinator leads (not owned; null: it always
  // does). While it does not, its doors refuse heartbeats, so its lease
  // timer evicts nobody (every worker gets a fresh lease instead).
  const Leadership* leadership = nullptr;
  GroupTableOptions groups;
  StoreLimits store;
};

// What a heartbeat returns besides its status.
struct HeartbeatReply {
  // The abort notices after the one the worker saw last, for its groups.
  std::vector<AbortNotice> aborts;
  // The newest notice id (the worker passes it back next time).
  uint64_t aborts_latest = 0;
};

// Returns when the core should end a waiting call that arrived at `now`
// from a client whose own deadline is `client_deadline` (InfiniteFuture()
// for none): at most `max_wait` away, and a little before the client gives
// up (a tenth of the time left, between 5 ms and 250 ms).
absl::Time CoreDeadline(absl::Time now, absl::Time client_deadline,
                        absl::Duration max_wait);

class Coordinator {
 public:
  using JoinCallback = GroupTable::JoinCallback;
  using CollectiveCallback = GroupTable::CollectiveCallback;
  using CommitCallback = GroupTable::CommitCallback;

  // `clock` is not owned.
  Coordinator(Clock* clock, CoordinatorOptions options);
  ~Coordinator();

  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Starts the timer threads (for a real clock). Call once.
  void StartTimers();

  // Takes over the workers, groups and store keys the coordinator that led
  // before wrote (state_log.h): the workers keep their ids and get a fresh
  // lease, the groups their epochs; publishes a kLeaderElected event. Call
  // once, before serving, on a core that has served nothing.
  void Restore(const StoredState& state);

  // Does at once what the timers do when they are due: evicts the workers
  // whose leases expired (aborting their groups) and ends every join and
  // collective whose deadline passed. For tests that move a fake clock.
  void RunTimers();

  // The lease timer's step when it was due at `due` (InfiniteFuture() on
  // its first run): evicts the workers whose leases expired and returns
  // when it is due next. A step that runs more than half a lease after it
  // was due means this process did not run meanwhile (SIGSTOP, a paused or
  // swapping machine): the workers' heartbeats could not be heard, so
  // instead of evicting them all, it gives every worker a fresh lease in
  // which to send one. So does every step while this coordinator does not
  // lead (options.leadership). The timer thread calls it; public for tests.
  absl::Time SweepLeases(absl::Time due);

  // Registers a worker (see Registry::Register for the codes: INVALID_ARGUMENT
  // for a malformed registration, UNIMPLEMENTED for an unsupported device).
  // A registration that replaces an older incarnation of the same name
  // aborts that incarnation's groups (a kWorkerLost "replaced" event, then
  // the aborts, then kWorkerRegistered).
  absl::StatusOr<RegisterResult> Register(const WorkerRegistration& request);

  // Renews worker `id`'s lease and fills `reply` with the abort notices after
  // `aborts_seen`. Returns NOT_FOUND for an unknown (e.g. evicted) worker,
  // FAILED_PRECONDITION for another incarnation; `reply` is then untouched.
  absl::Status Heartbeat(uint64_t id, uint64_t incarnation,
                         uint64_t aborts_seen, HeartbeatReply* reply,
                         const std::vector<Device>& withdrawn = {});

  // Removes worker `id` (a kWorkerLost "deregistered" event) and aborts its
  // groups. Returns the codes of Heartbeat for an unknown worker or another
  // incarnation.
  absl::Status Deregister(uint64_t id, uint64_t incarnation);

  // Every registered worker, ordered by id.
  std::vector<WorkerRecord> Workers() const;

  // Every formed group, the default job's first, then by job; each job's
  // ordered by name.
  std::vector<GroupSummary> Groups() const;

  // Every group with ranks waiting in a join, in the order of Groups().
  std::vector<FormingSummary> Forming() const;

  // The flight recorder's entries of `job`'s `group`, oldest first (earlier
  // epochs too). NOT_FOUND for a group it does not remember.
  absl::StatusOr<std::vector<TraceEntry>> Trace(const std::string& job,
                                                const std::string& group) const;

  // GroupTable::Join, Collective and Commit (see there for the verdicts),
  // with `deadline` in the request being the client's and the core's own
  // deadline derived from it. A join goes to the groups of its worker's
  // job (one not refused at once renews that worker's lease, as its
  // heartbeat does); a call or commit to those of its `job` (NOT_FOUND, as
  // for an unknown group, when no worker of that job registered).
  void Join(JoinRequest request, JoinCallback done);
  void Collective(CollectiveCall call, CollectiveCallback done);
  void Commit(CommitCall call, CommitCallback done);

  // GroupTable::Members of `job`'s `group` (see there for the codes;
  // NOT_FOUND when no worker of that job registered).
  absl::StatusOr<std::vector<GroupMember>> Members(
      const std::string& job, const std::string& group, uint64_t epoch,
      absl::Span<const int> ranks) const;

  // KeyStore::Run on `job`'s store (see there for the codes), with
  // `op.deadline` the client's and the core's own deadline derived from it.
  void Store(const std::string& job, StoreOp op, KeyStore::Done done);

  // GroupTable::ReportFailure on `job`'s `group`: the group's abort status
  // (ABORTED), or NOT_FOUND / FAILED_PRECONDITION for an unknown group or
  // stale epoch; an elastic group goes on without the ranks that are gone.
  absl::Status ReportFailure(const std::string& job, const std::string& group,
                             uint64_t epoch, int rank, uint64_t sequence,
                             const absl::Status& failure,
                             const std::vector<int>& lost = {},
                             bool leaving = false);

  // Authorization of a caller that proved, with its certificate, to be
  // worker `caller` (its job and name): OK when worker `id` registered under
  // that job and name, or when no worker has that id (the call itself then
  // gets NOT_FOUND); PERMISSION_DENIED naming both otherwise. Ids are never
  // reused, so the answer cannot change between the check and the call.
  absl::Status AuthorizeWorker(const Identity& caller, uint64_t id) const;

  // As AuthorizeWorker for a call as `rank` of the caller's job's `group` at
  // `epoch`: OK when that rank's worker is `caller`, or when the group has
  // no such rank at that epoch (the call is then refused anyway);
  // PERMISSION_DENIED otherwise.
  absl::Status AuthorizeRank(const Identity& caller, const std::string& group,
                             uint64_t epoch, int rank) const;

  // Subscribes to the event stream (EventHub::Subscribe): returns the
  // subscriber's id; `wake` runs, on another thread and without the core's
  // locks, when NextEvent has something after it said kEmpty.
  uint64_t SubscribeEvents(EventHub::WakeCallback wake) {
    return events_.Subscribe(std::move(wake));
  }
  // Takes subscriber `id`'s next event (EventHub::Next): kEvent, kEmpty
  // (wait for the wake) or kClosed (after Shutdown, or an unknown id).
  EventHub::Poll NextEvent(uint64_t id, Event* event) {
    return events_.Next(id, event);
  }
  // Ends subscription `id` (EventHub::Unsubscribe: its wake no longer runs
  // once this returns; not to be called from the wake).
  void UnsubscribeEvents(uint64_t id) { events_.Unsubscribe(id); }

  // Ends every pending join and collective with `status`, forgets every
  // group, and closes the event stream (subscribers take what is queued,
  // then kClosed); for the coordinator's shutdown.
  void Shutdown(const absl::Status& status);

  // For tests and fuzzers, what the timers look at: the earliest pending
  // deadline (InfiniteFuture() for none), the newest abort notice id, and
  // the stall lines not reported before (see GroupTable::NewStalls).
  absl::Time NextDeadline() const;
  uint64_t LatestAbortNotice() const;
  std::vector<std::string> NewStalls(absl::Duration threshold);

  Clock* clock() const { return clock_; }
  absl::Duration lease_timeout() const { return registry_.lease_timeout(); }
  const GroupTableOptions& group_options() const {
    return groups_.default_table().options();
  }

 private:
  // The core's deadline for a call from a client whose deadline is
  // `client_deadline`.
  absl::Time CoreDeadlineFor(absl::Time client_deadline) const;
  // Makes sure the deadline timer runs by `deadline`, that of a call just
  // added.
  void DeadlineAdded(absl::Time deadline);
  // Evicts the workers whose leases expired; returns when to look again.
  absl::Time EvictExpired();
  // Ends the calls whose deadlines passed; returns the next deadline.
  absl::Time ExpireDeadlines();
  // Logs the collectives newly stalled; returns when to look again.
  absl::Time ReportStalls();
  // Publishes a `kind` event about worker `id` "`name`" of `job` saying
  // `text`, and wakes the subscribers.
  void PublishWorkerEvent(Event::Kind kind, uint64_t id, const std::string& job,
                          const std::string& name, std::string reason,
                          std::string text);
  // Aborts the groups of worker `id` of `job` (GroupTable::AbortWorker).
  void AbortWorker(const std::string& job, uint64_t id, const std::string& name,
                   const std::string& why);

  Clock* const clock_;  // not owned
  const CoordinatorOptions options_;
  // Before the group table, which publishes to it.
  EventHub events_;
  Registry registry_;
  JobGroups groups_;
  KeyStore store_;

  // When the deadline timer will next look (unix ns); kComputing while it
  // computes, so that every new call pokes it then.
  static constexpr int64_t kComputing = INT64_MIN;
  std::atomic<int64_t> planned_{kComputing};
  std::unique_ptr<WakeupLoop> deadlines_;
  std::unique_ptr<WakeupLoop> sweeper_;
  std::unique_ptr<WakeupLoop> stall_reporter_;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_COORDINATOR_H_
