// The leader plan: a small call of a group the coordinator formed with
// leader calls (JoinGroupResponse.leader_calls) is computed by the worker of
// the group's rank 0 (the leader) when every rank is there in time with the
// same call, and judged by the coordinator otherwise. Each other rank (a
// member) sends the leader its call (spec, its patience, its input) and
// waits for the answer. The leader waits for every member's call until its
// patience, or a member's, runs out, then gives every member one answer:
// - its output, computed as the inline plan does (RunInline), when every
//   call is there, none withdrew and they agree;
// - "ask the coordinator" otherwise: every rank then sends the same call to
//   the coordinator, which matches it as any other and is the judge
//   (calls that differ, deadlines naming missing ranks, a rank on a plan of
//   its own, lost workers), with its flight recorder and metrics. The answer
//   goes to ranks that have not called yet too, so a late call goes there
//   at once.
//
// A member whose answer did not come within its patience withdraws (a frame
// after its call), waits a little longer (its grace), and asks the
// coordinator if the leader still did not answer. The leader decides after
// checking that no member withdrew, so a member that went to the
// coordinator never leaves the others succeeding at the leader: messages of
// an ordered pair arrive in order, and a result sent before the withdrawal
// was read reaches the member within its grace unless the network delays
// it longer than that. The transport's errors (the group aborted, a peer
// lost) end the call as they are; the runtime reports them for the group's
// verdict as for any plan.
//
// Stateless functions over a Transport; thread-compatible (one thread per
// call and rank).
#ifndef CHORUS_SERVER_WORKER_ALGORITHMS_LEADER_CALL_H_
#define CHORUS_SERVER_WORKER_ALGORITHMS_LEADER_CALL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/collective.h"
#include "server/worker/dataplane/transport.h"

namespace chorus {

// The rank that judges a group's calls under the leader plan.
inline constexpr int kLeaderRank = 0;

struct LeaderCallArgs {
  // The call.
  std::string group;
  uint64_t epoch = 0;
  uint64_t sequence = 0;
  CollectiveSpec spec;
  // This rank's input (as the caller gave it) and where its output goes.
  absl::string_view input;
  std::string* output = nullptr;
  Transport* transport = nullptr;
  // When a member withdraws, and when the leader stops waiting for calls
  // (or earlier, at a member's patience).
  absl::Time patience_by = absl::InfiniteFuture();
  // When a member that withdrew stops waiting for the leader's answer.
  absl::Time grace_until = absl::InfiniteFuture();
};

// How a call under the leader plan ended.
enum class LeaderEnd {
  // With the status RunLeaderCall() returned.
  kDone,
  // Not at the leader: the call goes to the coordinator.
  kAskCoordinator,
};

// Runs this rank's half of the call (the leader's when the transport's rank
// is kLeaderRank). Returns kDone with *args.output set, or kAskCoordinator;
// INTERNAL for a malformed message; or the transport's errors, for the
// runtime to report.
absl::StatusOr<LeaderEnd> RunLeaderCall(const LeaderCallArgs& args);

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_ALGORITHMS_LEADER_CALL_H_
