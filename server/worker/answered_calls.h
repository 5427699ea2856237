// AnsweredCalls: the collective calls of each group epoch that a
// coordinator answered lately, kept so that they can go again as replays
// (CollectiveRequest.replays) after the worker moved to another
// coordinator. A new leader that took a group over learns from them what
// the old leader matched, and answers the ranks whose answer was lost the
// same (server/coordinator/group_restore.cc).
//
// A call is remembered with the registration count of the worker's session
// when it was answered; a later call of the same group epoch carries the
// remembered ones only while that count differs from the session's (the
// worker registered again: it moved), and stops once a call was answered
// after the move. At most kKept calls per group epoch, and only the newest
// epoch of each group.
//
// It also keeps the answered calls whose plan is running (from the plan
// until the commit's verdict): after a move they go to the new leader as
// running calls (CollectiveRequest.running), so that ranks whose plan was
// lost get the same plan there; a commit sent again after a move follows
// its own running call.
//
// Lifecycle: owned by the worker runtime. Thread safety: thread-safe.
#ifndef CHORUS_SERVER_WORKER_ANSWERED_CALLS_H_
#define CHORUS_SERVER_WORKER_ANSWERED_CALLS_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"

namespace chorus {

class AnsweredCalls {
 public:
  // Calls kept per group epoch (what a new leader reads at most).
  static constexpr size_t kKept = 16;

  // Remembers `request` (without its own replays), answered while the
  // session's registration count was `registrations`.
  void Record(const v1::CollectiveRequest& request, uint64_t registrations);

  // Adds to `request` the remembered calls of its group epoch before its
  // sequence, when they were answered under another registration count
  // than `registrations`; otherwise clears its replays.
  void AttachReplays(v1::CollectiveRequest* request, uint64_t registrations);

  // Keeps `request` (without its replays, marked running) until Ran() for
  // its group and sequence, with the deadline of its run.
  void Running(const v1::CollectiveRequest& request, absl::Time deadline);
  void Ran(const std::string& group, uint64_t sequence);

  // A call whose plan is running, and its run's deadline.
  struct RunningCall {
    v1::CollectiveRequest request;
    absl::Time deadline;
  };
  // The calls kept by Running() and not yet Ran().
  std::vector<RunningCall> RunningCalls();
  // The one of `group` and `sequence`, if kept.
  std::optional<RunningCall> FindRunning(const std::string& group,
                                         uint64_t sequence);

 private:
  struct Epoch {
    uint64_t epoch = 0;
    uint64_t registrations = 0;
    std::deque<v1::CollectiveRequest> calls;
  };

  absl::Mutex mu_;
  // By group name.
  absl::flat_hash_map<std::string, Epoch> groups_ ABSL_GUARDED_BY(mu_);
  // By group name and sequence.
  std::map<std::pair<std::string, uint64_t>, RunningCall> running_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_ANSWERED_CALLS_H_
