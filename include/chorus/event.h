// Event: one thing that happened in a Chorus cluster, as the coordinator's
// event stream reports it (Coordinator.WatchEvents, AdminClient::
// WatchEvents, `chorusctl watch`): a worker registered or was lost, a group
// formed or was aborted, a collective stalled or stopped stalling, ranks
// disagreed, a deadline passed, or a watcher that fell behind missed events.
//
// Plain values; thread-compatible.
#ifndef CHORUS_INCLUDE_CHORUS_EVENT_H_
#define CHORUS_INCLUDE_CHORUS_EVENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace chorus {

struct Event {
  // Mirrors chorus.v1.EventKind value for value.
  enum class Kind : int {
    kUnspecified = 0,
    // A worker registered: a new name, or a new incarnation of a known one.
    kWorkerRegistered = 1,
    // A worker left the registry; `reason` says how: "evicted" (no
    // heartbeat within its lease), "deregistered" (it shut down) or
    // "replaced" (a new incarnation registered under its name).
    kWorkerLost = 2,
    // Every rank joined: `group` at its new `epoch`.
    kGroupFormed = 3,
    // A group epoch was aborted; `status` is what its calls get, `ranks`
    // (and the worker, for a lost one) the ranks it blames.
    kGroupAborted = 4,
    // Collective `sequence` has waited long for `ranks` (the coordinator's
    // --stall_report_after).
    kStallStarted = 5,
    // That collective ended (`status`: how) or its group epoch did.
    kStallEnded = 6,
    // The ranks of collective `sequence` asked for different things;
    // `status` is the INVALID_ARGUMENT every rank got.
    kMismatch = 7,
    // A join (sequence 0) or collective ended at its deadline without
    // `ranks`; `status` is the DEADLINE_EXCEEDED the others got.
    kDeadline = 8,
    // This watcher fell behind and missed `dropped` events before the next.
    kEventsDropped = 9,
    // An elastic group's epoch was revoked: `ranks` left (none when
    // newcomers were admitted); `text` says what follows.
    kMembershipChanged = 10,
    // A newcomer waits to join elastic `group` at its next sync.
    kJoinerWaiting = 11,
    // This coordinator was elected leader (--etcd) and took over what the
    // leader before it wrote (`text` says how much).
    kLeaderElected = 12,
  };

  // When it happened.
  absl::Time time = absl::UnixEpoch();
  Kind kind = Kind::kUnspecified;
  // The worker concerned (0 and empty for none).
  uint64_t worker_id = 0;
  std::string worker_name;
  // The job of the worker or group concerned (empty: the default job).
  std::string job;
  // The group epoch and collective concerned (empty and 0 for none).
  std::string group;
  uint64_t epoch = 0;
  uint64_t sequence = 0;
  // The ranks concerned: the missing ranks of a stall or deadline, the
  // ranks an abort blames.
  std::vector<int> ranks;
  // The verdict involved, where there is one.
  absl::Status status;
  // kWorkerLost: "evicted", "deregistered" or "replaced".
  std::string reason;
  // kEventsDropped: how many events were missed.
  uint64_t dropped = 0;
  // A sentence for people, e.g. `worker 3 "w0" lost: no heartbeat within
  // the lease (5s)`.
  std::string text;
};

// Returns the kind's name as chorus.v1.EventKind spells it without its
// prefix, e.g. "WORKER_REGISTERED"; "UNSPECIFIED" for kUnspecified and
// unknown values.
inline const char* EventKindName(Event::Kind kind) {
  switch (kind) {
    case Event::Kind::kUnspecified:
      return "UNSPECIFIED";
    case Event::Kind::kWorkerRegistered:
      return "WORKER_REGISTERED";
    case Event::Kind::kWorkerLost:
      return "WORKER_LOST";
    case Event::Kind::kGroupFormed:
      return "GROUP_FORMED";
    case Event::Kind::kGroupAborted:
      return "GROUP_ABORTED";
    case Event::Kind::kStallStarted:
      return "STALL_STARTED";
    case Event::Kind::kStallEnded:
      return "STALL_ENDED";
    case Event::Kind::kMismatch:
      return "MISMATCH";
    case Event::Kind::kDeadline:
      return "DEADLINE";
    case Event::Kind::kEventsDropped:
      return "EVENTS_DROPPED";
    case Event::Kind::kMembershipChanged:
      return "MEMBERSHIP_CHANGED";
    case Event::Kind::kJoinerWaiting:
      return "JOINER_WAITING";
    case Event::Kind::kLeaderElected:
      return "LEADER_ELECTED";
  }
  return "UNSPECIFIED";
}

}  // namespace chorus

#endif  // CHORUS_INCLUDE_CHORUS_EVENT_H_
