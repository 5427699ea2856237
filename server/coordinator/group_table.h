// GroupTable: the coordinator's groups (communicators) and the matching of
// their collective calls.
//
// Groups form by rendezvous: every rank calls Join(name, world_size, rank)
// and all of them complete once the last rank joined, with the member list
// and a new epoch. Every rank then numbers its collectives 1, 2, 3, ...; the
// n-th call of each rank is matched with the n-th call of the others. When
// all ranks arrived, one verdict goes to every rank: refused (a device
// without distributed support), mismatched (with what each rank asked for),
// or a plan — with the results already computed when the plan is inline.
// A call whose deadline passes first ends the match for every rank that
// arrived, with DEADLINE_EXCEEDED naming the ranks that did not.
//
// Bad input (unknown group, stale epoch, rank or sequence out of range,
// malformed spec, wrong data size) is refused at once and changes nothing.
//
// The implementation is split by concept: group_rendezvous.cc (joins),
// group_matching.cc (calls, agreement, plans, inline runs), group_commit.cc
// (commits and failure reports), group_aborts.cc (aborts and notices),
// group_restore.cc (each epoch written to the state log, groups taken over
// from the leader before) and group_table.cc (deadlines, stalls, listing).
//
// Events (a group formed or aborted, a stall started or ended, a mismatch,
// a deadline) are published to the event hub under the table's lock, so
// they are queued in the order they happened; the hub's subscribers are
// woken with the callbacks, after the lock is released.
//
// Lifecycle: owned by the coordinator; ExpireDeadlines() must be called at
// NextDeadline() (the coordinator runs it on a WakeupLoop).
// Thread safety: every method is thread-safe. Callbacks run on the calling
// thread after the table's lock is released, never under it. The clock,
// registry and event hub are not owned and must outlive the table.
#ifndef CHORUS_SERVER_COORDINATOR_GROUP_TABLE_H_
#define CHORUS_SERVER_COORDINATOR_GROUP_TABLE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "common/collective.h"
#include "common/device.h"
#include "server/coordinator/event_hub.h"
#include "server/coordinator/flight_recorder.h"
#include "server/coordinator/group_types.h"
#include "server/coordinator/planner.h"
#include "server/coordinator/registry.h"
#include "server/coordinator/state_log.h"

namespace chorus {

struct GroupTableOptions {
  // The job whose groups it holds (job_groups.h), for summaries and events.
  std::string job;
  int max_world_size = 65536;
  // Join replies list every member only up to this many ranks for a rank
  // that asked for members on request (JoinGroupRequest.members_on_request);
  // above it the rank fetches the members it needs (Members()).
  int member_list_max = 256;
  // How far ahead of its oldest unissued collective a rank may call
  // (asynchronous calls can reach the coordinator out of order); a sequence
  // beyond that is "from the future".
  uint64_t sequence_window = 1024;
  // Epochs of every group name start after this; the coordinator passes its
  // start time in microseconds so a restarted coordinator never reuses an
  // epoch workers still remember.
  uint64_t first_epoch = 0;
  // Where each group's epoch is written when it changes (state_log.h); not
  // owned, may be null.
  StateLog* log = nullptr;
  PlannerOptions planner;
  // The flight recorder keeps this many collectives per group (0: none),
  // of this many groups, and of a large group as many as hold
  // trace_rank_records ranks (FlightRecorder).
  size_t trace_entries = 2048;
  size_t trace_groups = 256;
  size_t trace_rank_records = FlightRecorder::kDefaultRankRecords;
};

class GroupTable {
 public:
  // Takes the view by reference: every rank of a group gets the same one.
  using JoinCallback = std::function<void(const absl::StatusOr<GroupView>&)>;
  using CollectiveCallback =
      std::function<void(absl::StatusOr<CollectiveOutcome>)>;
  using CommitCallback = std::function<void(absl::Status)>;

  // No pointer is owned; `events` may be null (no events are published).
  GroupTable(Clock* clock, Registry* registry, GroupTableOptions options,
             EventHub* events = nullptr);
  ~GroupTable();

  GroupTable(const GroupTable&) = delete;
  GroupTable& operator=(const GroupTable&) = delete;

  // Joins `request.rank` to the group. `done` runs once: with the view when
  // every rank joined; INVALID_ARGUMENT for a world size of 0 or over the
  // maximum, a rank out of range, a rank already taken, or a world size
  // other than the one the group is forming with; UNAVAILABLE for an
  // unknown worker (it is registering again); UNIMPLEMENTED for a device
  // without distributed support;
  // DEADLINE_EXCEEDED naming the ranks that did not join in time.
  void Join(JoinRequest request, JoinCallback done);

  // Adds a rank's call to its match. A retried call (same rank and sequence)
  // replaces the pending one, or gets the verdict already given if it was
  // the rank's last. `done` runs once with the verdict (see the class
  // comment): the outcome; INVALID_ARGUMENT for bad input or a
  // mismatch; NOT_FOUND for an unknown group; FAILED_PRECONDITION for a
  // stale epoch, a sequence already used, or when another rank was refused;
  // UNIMPLEMENTED for this rank's unsupported device; DEADLINE_EXCEEDED;
  // ABORTED when the group was formed again meanwhile.
  void Collective(CollectiveCall call, CollectiveCallback done);

  // Commits a collective that ran on the data plane. `done` runs once: OK
  // when every rank committed; ABORTED when the group was aborted (a rank
  // reported a failure, or a worker was lost); DEADLINE_EXCEEDED naming the
  // ranks that did not commit in time (the group is then aborted);
  // NOT_FOUND, FAILED_PRECONDITION or INVALID_ARGUMENT for bad input (a
  // sequence that ran inline or is not decided yet, a stale epoch).
  void Commit(CommitCall call, CommitCallback done);

  // Aborts `group` at `epoch` because rank `rank` saw `failure` on the data
  // plane during collective `sequence` (sequence 0: the rank itself is gone,
  // or with `leaving` it leaves). Returns the group's abort status (ABORTED;
  // the first failure reported wins), or NOT_FOUND / FAILED_PRECONDITION for
  // an unknown group or stale epoch. An elastic group goes on without the
  // ranks `lost` names (those the failure says are gone), or without `rank`
  // when it is gone or leaves: its epoch is revoked with ABORTED and a
  // MEMBERSHIP_CHANGED detail (group_elastic.cc).
  absl::Status ReportFailure(const std::string& group, uint64_t epoch, int rank,
                             uint64_t sequence, const absl::Status& failure,
                             const std::vector<int>& lost = {},
                             bool leaving = false);

  // Aborts every group with a member on worker `worker_id` (evicted or shut
  // down; `why` says which) and drops its pending joins. Every pending and
  // later call on those group epochs gets ABORTED naming the worker and its
  // ranks, until the group is formed again.
  void AbortWorker(uint64_t worker_id, const std::string& worker_name,
                   const std::string& why);

  // Returns the abort notices after `after` for groups with a member on
  // `worker_id`, and sets `latest` to the newest notice id.
  std::vector<AbortNotice> AbortsFor(uint64_t worker_id, uint64_t after,
                                     uint64_t* latest) const;

  // Ends every pending join and collective with `status` and forgets every
  // group (used when the coordinator shuts down).
  void AbortAll(const absl::Status& status);

  // Ends every join and match whose deadline passed.
  void ExpireDeadlines();

  // Returns the earliest pending deadline, or InfiniteFuture().
  absl::Time NextDeadline() const;

  // Returns a line for each collective that has waited longer than
  // `threshold` for some ranks and was not reported before, e.g.
  // "all_reduce #41 of group g has waited 12s for ranks 2, 3", and
  // publishes a kStallStarted for each (a kStallEnded follows when the
  // collective or its group epoch ends).
  std::vector<std::string> NewStalls(absl::Duration threshold);

  // Returns every formed group, ordered by name.
  std::vector<GroupSummary> List() const;

  // Returns every group with ranks waiting in a join, ordered by name.
  std::vector<FormingSummary> Forming() const;

  // Returns the flight recorder's entries of `group`, oldest first (also of
  // earlier epochs); empty for a group it does not remember.
  std::vector<TraceEntry> Trace(const std::string& group) const;

  // Returns the name of the worker that holds `rank` of `group` at `epoch`;
  // NOT_FOUND when the group is not formed at that epoch or has no such
  // rank (then Collective, Commit and ReportFailure refuse the call too).
  absl::StatusOr<std::string> MemberWorkerName(const std::string& group,
                                               uint64_t epoch, int rank) const;

  // Returns the members holding `ranks` of `group` at `epoch`, in that
  // order: NOT_FOUND for an unknown group, FAILED_PRECONDITION (with a
  // STALE_EPOCH detail, or the revocation of a revoked elastic epoch) for
  // another epoch, the group's abort status once aborted, INVALID_ARGUMENT
  // for a rank out of range or more ranks than the group has.
  absl::StatusOr<std::vector<GroupMember>> Members(const std::string& group,
                                                   uint64_t epoch,
                                                   absl::Span<const int> ranks);

  // Takes over `groups`, as the coordinator that led before wrote them
  // (state_log.h; group_restore.cc): same epochs and members, each rank's
  // sequence learned from its first call or commit here. Call before
  // serving, on an empty table.
  void Restore(const std::vector<StoredGroup>& groups);

  const GroupTableOptions& options() const { return options_; }

 private:
  using Completions = std::vector<std::function<void()>>;
  struct PendingJoin {
    JoinRequest request;
    GroupMember member;
    JoinCallback done;
  };
  struct Formation {
    int world_size = 0;
    // Elastic bounds every rank named (0: not elastic).
    int min_world_size = 0;
    int max_world_size = 0;
    std::vector<std::optional<PendingJoin>> slots;
    int joined = 0;
    // When `joined` last went from 0 to 1.
    absl::Time first_join = absl::InfinitePast();
    // Ranks whose join was refused for their device, with the refusal;
    // until `refused_until` every other rank's join fails at once.
    std::map<int, std::string> refused;
    absl::Time refused_until = absl::InfinitePast();
    // Ranks that joined but whose own deadline passed before the group
    // formed (they are told apart from ranks that never joined).
    std::set<int> gave_up;
  };
  struct ArrivedCall {
    CollectiveCall call;
    CollectiveCallback done;
  };
  struct Match {
    std::vector<std::optional<ArrivedCall>> calls;
    int arrived = 0;
    absl::Time first_arrival;
    // NewStalls reported it (and published its kStallStarted).
    bool stall_reported = false;
  };
  struct CommitMatch {
    // The matched call, for messages.
    CollectiveSpec spec;
    std::vector<std::optional<CommitCall>> calls;
    std::vector<CommitCallback> done;
    int arrived = 0;
  };
  struct LastCall {
    CollectiveCall call;
    absl::StatusOr<CollectiveOutcome> outcome;
  };
  // Whom an abort blames, for its kGroupAborted event: ranks, and the
  // worker when one was lost (id 0: none).
  struct Blame {
    std::vector<int> ranks;
    uint64_t worker_id = 0;
    std::string worker_name;
  };
  struct Group {
    GroupView view;
    // Elastic groups: newcomers waiting for a sync to admit them.
    std::vector<PendingJoin> joiners;
    // The join request id of each rank, to answer retried joins.
    std::vector<std::string> request_ids;
    // The last call of each rank and its outcome, to answer a retry.
    std::vector<std::optional<LastCall>> last_outcome;
    // OK while the epoch is live; the abort status once aborted.
    absl::Status aborted;
    // Decided data-plane collectives waiting for their commits.
    std::map<uint64_t, CommitMatch> commits;
    // Next sequence each rank may call.
    // Lowest sequence each rank has not called yet, and the higher ones it
    // already called (calls issued together may arrive out of order).
    std::vector<uint64_t> next_sequence;
    std::vector<absl::flat_hash_set<uint64_t>> called_ahead;
    // A restored group: the first sequence each rank called or committed
    // here (0: none yet; its sequence is not known).
    bool restored = false;
    std::vector<uint64_t> first_here;
    std::map<uint64_t, Match> pending;
    // Verdicts of failed matches that some rank has not reached yet.
    std::map<uint64_t, absl::Status> failed;
    uint64_t completed = 0;
  };

  absl::Status ValidateJoinLocked(const JoinRequest& request) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers a retried join (see JoinRequest::request_id); returns false
  // when `request` is not a retry.
  bool AnswerRetriedJoinLocked(JoinRequest& request, JoinCallback& done,
                               Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers a retried collective call; returns false when it is not one.
  bool AnswerRetriedCallLocked(CollectiveCall& call, CollectiveCallback& done,
                               Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CollectiveLocked(CollectiveCall call, CollectiveCallback done,
                        Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void JoinLocked(JoinRequest request, JoinCallback done,
                  Completions* completions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK when every rank of a complete commit sent the same result hash (or
  // some sent none); DATA_LOSS naming the ranks whose results differ (and
  // a RESULTS_DIFFER detail with them in `ranks`).
  static absl::Status CheckResultHashes(const std::string& group,
                                        uint64_t epoch, uint64_t sequence,
                                        const CommitMatch& commit);
  // How long a join refused for its device fails the other ranks' joins
  // at once (at most; no longer than the refused join's deadline).
  static constexpr absl::Duration kRefusalMemory = absl::Seconds(60);
  // True when a formation has neither waiting ranks nor refusals.
  static bool FormationEmpty(const Formation& formation);
  // FAILED_PRECONDITION naming every refused rank of `group` and why.
  static absl::Status RefusedFormationStatus(const std::string& group,
                                             const Formation& formation);
  // Records that `request` was refused for its device (`refusal`) and
  // fails the ranks waiting in its formation with FAILED_PRECONDITION.
  void RefuseJoinLocked(const JoinRequest& request, const absl::Status& refusal,
                        Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FormGroupLocked(const std::string& name, Formation formation,
                       Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ---- Restored groups (group_restore.cc) ----
  // Writes the epochs of the groups in unsaved_ to the log, if any.
  void SaveChangedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Matches the replays `call` carries (CollectiveCall::replays) where its
  // group is restored, learning the rank's sequence from them.
  void TakeReplaysLocked(CollectiveCall& call, Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A running call (CollectiveCall::running): answers `done` at once (with
  // nothing where its group is restored at its epoch, else
  // FAILED_PRECONDITION) and puts a callback that drops the verdict in its
  // place. Returns whether the call is to be matched (the group restored).
  bool TakeRunningLocked(const CollectiveCall& call, CollectiveCallback& done,
                         Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `sequence` is pending in `group` with running calls only (every
  // rank that called it runs the previous leader's plan).
  static bool OnlyRunningLocked(const Group& group, uint64_t sequence);
  // Whether `rank`'s call pending for `sequence` in `group` is a running
  // call.
  static bool RunningHereLocked(const Group& group, uint64_t sequence,
                                int rank);
  // A commit of a restored group for a collective the previous leader
  // decided: the commit match it joins (made on its first commit), or end.
  // A match still pending for it stays: should a rank that never heard the
  // plan call again, the match plans it anew and the commits wait in their
  // match; should every rank commit first, the running calls left pending
  // are dropped with the verdict (Commit).
  std::map<uint64_t, CommitMatch>::iterator AdoptCommitLocked(
      Group& group, const CommitCall& call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ValidateCallLocked(const CollectiveCall& call, Group** group)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the match of `sequence`, now complete, with one verdict for every
  // rank: refused devices, a mismatch, or the plan (and the inline results).
  void DecideLocked(Group& group, uint64_t sequence, Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // When a rank's device is refused, answers every rank of `match` (the
  // refused rank its refusal, the others FAILED_PRECONDITION naming it) and
  // returns true; false when every device can take part.
  bool RefuseDevicesLocked(Group& group, uint64_t sequence, Match& match,
                           Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK when the ranks of a complete match agree; INVALID_ARGUMENT with the
  // per-rank account otherwise, and the ranks whose call differs from rank
  // 0's in `differing`.
  static absl::Status CheckAgreement(const Group& group, uint64_t sequence,
                                     const Match& match,
                                     std::vector<int>* differing);
  // The plan of a complete match whose ranks agree.
  absl::StatusOr<Plan> AgreedPlanLocked(const Group& group,
                                        const Match& match) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Computes the outputs of an inline match. Returns INVALID_ARGUMENT when
  // a rank sent no data, or the inline executor's error.
  static absl::Status RunInlineMatch(const std::string& group,
                                     uint64_t sequence, const Match& match,
                                     std::vector<std::string>* outputs);
  // NewStalls() under the lock: appends the lines to `stalls`.
  void NewStallsLocked(absl::Duration threshold,
                       std::vector<std::string>* stalls,
                       Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The parts of ExpireDeadlines(): joins, matches and commits past theirs.
  void ExpireJoinsLocked(absl::Time now, Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireMatchesLocked(Group& group, absl::Time now,
                           Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireCommitsLocked(Group& group, absl::Time now,
                           Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "all_reduce #3 of group g", as messages name a call.
  static std::string CallName(const std::string& group, uint64_t sequence,
                              const CollectiveSpec& spec);
  void FailMatchLocked(Group& group, uint64_t sequence, Match& match,
                       const absl::Status& status, Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PruneFailedLocked(Group& group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts the calls `call` reports it ran under the leader plan as called
  // by its rank (ranges before `call` and within the sequence window only).
  void NoteLeaderRanLocked(const CollectiveCall& call)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static bool CalledLocked(const Group& group, int rank, uint64_t sequence);
  static void MarkCalledLocked(Group& group, int rank, uint64_t sequence);
  // Aborts the group epoch with `status` (kept if it was already aborted):
  // fails its pending matches and commits, records a notice, counts the
  // abort under `reason` (chorus_aborts_total{reason}) and publishes a
  // kGroupAborted naming `blame`.
  void AbortGroupLocked(Group& group, const absl::Status& status,
                        const char* reason, const Blame& blame,
                        Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stamps `event` with the time and queues it on the event hub (if any);
  // adds the wake of its subscribers to `completions` when one is due.
  void PublishLocked(Event event, Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A `kind` event about `group`'s epoch (and collective `sequence`, 0 for
  // none) saying `text`.
  static Event GroupEvent(Event::Kind kind, const GroupView& group,
                          uint64_t sequence, std::string text);
  // Publishes a kStallEnded when NewStalls reported `match` (collective
  // `sequence` of `group`), which ended with `verdict`.
  void StallEndedLocked(const Group& group, uint64_t sequence,
                        const Match& match, const absl::Status& verdict,
                        Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Group*> FindGroupLocked(const std::string& name,
                                         uint64_t epoch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ReportFailure() of a group that is not elastic: aborts it. Returns the
  // abort status.
  absl::Status AbortForFailureLocked(Group& group, int rank, uint64_t sequence,
                                     const absl::Status& failure,
                                     Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ReportFailure() of an elastic group: revokes its epoch without the ranks
  // that are gone. Returns the revocation, or INVALID_ARGUMENT.
  absl::Status ReportElasticLocked(Group& group, int rank, uint64_t sequence,
                                   const absl::Status& failure,
                                   const std::vector<int>& lost, bool leaving,
                                   Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The member a join of worker `worker` adds for `request`.
  static GroupMember MemberOf(const JoinRequest& request,
                              const WorkerRecord& worker);
  // Whether `members` are on one machine and network namespace.
  static bool SameHost(const std::vector<GroupMember>& members);
  // Whether `members`' workers all have one NCCL version (NCCL refuses
  // mixed ones) and no two members joined on one GPU of one host (NCCL
  // refuses a GPU twice in a communicator).
  static bool AllHaveNccl(const std::vector<GroupMember>& members);

  // ---- Elastic groups (group_elastic.cc) ----
  // How a revoked elastic epoch ended and what followed it.
  struct Succession {
    // What every call of the revoked epoch gets.
    absl::Status revoked;
    // The epoch that followed (0 while the group waits below its minimum)
    // and, by old rank, each rank's rank there (-1: it left).
    uint64_t next_epoch = 0;
    std::vector<int> next_ranks;
  };
  // An elastic group below its minimum: the ranks that wait for enough
  // newcomers to form its next epoch.
  struct Refill {
    // The revoked epoch, and its ranks that go on, in order.
    GroupView previous;
    std::vector<int> survivors;
    // Joins of survivors following into the next epoch (request.rank: the
    // old rank), and of newcomers.
    std::vector<PendingJoin> followers;
    std::vector<PendingJoin> joiners;
    // When the epoch was revoked; with no join waiting by give_up_at, the
    // group is given up.
    absl::Time revoked_at;
    absl::Time give_up_at;
  };
  // Checks an elastic join's bounds: INVALID_ARGUMENT when they are not
  // 0 < min <= world_size <= max <= the table's maximum.
  absl::Status ValidateElasticLocked(const JoinRequest& request) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A newcomer's join, or a rank following its group into the next epoch.
  void NewcomerLocked(JoinRequest request, JoinCallback done,
                      Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FollowLocked(JoinRequest request, JoinCallback done,
                    Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Revokes the epoch of elastic `group`: the ranks in `lost` leave (`why`,
  // counted under `reason`), every pending and later call of the epoch
  // gets ABORTED with a MEMBERSHIP_CHANGED detail, and the survivors form
  // the next epoch at once, or wait for newcomers below the minimum.
  void RevokeLocked(Group& group, std::vector<int> lost, const char* reason,
                    const std::string& why, const Blame& blame,
                    Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a sync of `group` was decided: admits the waiting newcomers (up
  // to the maximum) into the next epoch, which `next` then holds.
  void AdmitJoinersLocked(Group& group, std::shared_ptr<const GroupView>* next,
                          Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forms `name`'s next epoch `epoch` from `previous`'s ranks `survivors`
  // (in order) and the newcomers `admitted` after them; the newcomers in
  // `waiting` wait on in it. Answers the admitted newcomers. Returns the new
  // epoch's view.
  std::shared_ptr<const GroupView> FormNextEpochLocked(
      const GroupView& previous, const std::vector<int>& survivors,
      uint64_t epoch, std::vector<PendingJoin> admitted,
      std::vector<PendingJoin> waiting, Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forms a refill's next epoch once it has its minimum; true when it did.
  bool TryFormRefillLocked(const std::string& name, Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the pending calls and commits of `group` with `status` (the epoch
  // is over); unlike an abort, records no notice.
  void EndEpochLocked(Group& group, const absl::Status& status,
                      Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records how `epoch` of `name` ended, forgetting the oldest records.
  void RecordSuccessionLocked(const std::string& name, uint64_t epoch,
                              Succession succession)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The newcomers and followers of a lost worker leave; those past their
  // deadline get DEADLINE_EXCEEDED.
  void DropElasticJoinsLocked(uint64_t worker_id, const absl::Status& why,
                              Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireElasticJoinsLocked(absl::Time now, Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the newcomers of `joiners` whose join was withdrawn (CANCELLED):
  // they are not admitted and change nothing.
  void DropWithdrawnLocked(std::vector<PendingJoin>& joiners,
                           Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The earliest deadline of the elastic joins waiting.
  absl::Time NextElasticDeadlineLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next epoch number of group `name`.
  uint64_t NextEpochLocked(const std::string& name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Clock* const clock_;        // not owned
  Registry* const registry_;  // not owned
  const GroupTableOptions options_;
  EventHub* const events_;  // not owned; may be null

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Formation> forming_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Group> groups_ ABSL_GUARDED_BY(mu_);
  std::deque<AbortNotice> notices_ ABSL_GUARDED_BY(mu_);
  uint64_t next_notice_ ABSL_GUARDED_BY(mu_) = 1;
  FlightRecorder recorder_ ABSL_GUARDED_BY(mu_);
  // Last epoch handed out per group name; survives re-formation.
  absl::flat_hash_map<std::string, uint64_t> epochs_ ABSL_GUARDED_BY(mu_);
  // Revoked elastic epochs, (name, epoch) -> how they ended, and the order
  // they were recorded in (the oldest are forgotten).
  std::map<std::pair<std::string, uint64_t>, Succession> successions_
      ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<std::string, uint64_t>> succession_order_
      ABSL_GUARDED_BY(mu_);
  // Elastic groups below their minimum, by name.
  std::map<std::string, Refill> refills_ ABSL_GUARDED_BY(mu_);
  // Groups whose epoch changed since the log was last written.
  std::set<std::string> unsaved_ ABSL_GUARDED_BY(mu_);
  // Ranks of restored groups whose sequence is not learned yet (an upper
  // bound: a restored group formed again keeps its count).
  int64_t unlearned_ranks_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_GROUP_TABLE_H_
