// Conversions between chorus.v1 coordinator messages and the core's
// (coordinator.h) calls and outcomes, shared by the gRPC service, the call
// port and the fuzzers, so every way in takes exactly the same path into
// the core.
//
// Pure functions, except TakeCallPortRequest and ReportFailureToCore, which
// call the core; all are thread-safe.
#ifndef CHORUS_SERVER_COORDINATOR_COLLECTIVE_PROTO_H_
#define CHORUS_SERVER_COORDINATOR_COLLECTIVE_PROTO_H_

#include <climits>
#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"
#include "server/coordinator/coordinator.h"

namespace chorus {

// Returns the registration `request` asks for.
WorkerRegistration RegistrationFromProto(
    const v1::RegisterWorkerRequest& request);

// Returns the join `request` asks for, from a client whose deadline is
// `client_deadline`.
JoinRequest JoinFromProto(const v1::JoinGroupRequest& request,
                          absl::Time client_deadline);

// Returns the core's store operation for `request`, from a client whose
// deadline is `client_deadline`; the core validates it.
StoreOp StoreOpFromProto(const v1::StoreRequest& request,
                         absl::Time client_deadline);

// The most replays (CollectiveRequest.replays) a call's conversion keeps.
inline constexpr size_t kMaxReplays = 16;
// At most this many of a call's leader_ran ranges are read.
inline constexpr size_t kMaxLeaderRanRanges = 64;

// Returns the core's call for `request`, from a client whose deadline is
// `client_deadline`, with at most kMaxReplays of its replays (theirs
// dropped). The inline data is copied; the core validates the rest.
CollectiveCall CollectiveCallFromProto(const v1::CollectiveRequest& request,
                                       absl::Time client_deadline);

// Returns the core's commit for `request`, from a client whose deadline is
// `client_deadline`.
CommitCall CommitCallFromProto(const v1::CommitRequest& request,
                               absl::Time client_deadline);

// Returns `member` as the wire message.
v1::GroupMember MemberToProto(const GroupMember& member);

// Returns the join response describing `view` (its rank set where the view
// says it), whose ranks send inline data up to the sizes `planner` plans
// inline (InlineMaxBytes); it lists the members unless `list_members` is
// false (world_size says how many).
v1::JoinGroupResponse JoinResponseOf(const GroupView& view,
                                     const PlannerOptions& planner,
                                     bool list_members = true);

// Fills `response` with `outcome` (its inline data is moved); a next epoch
// in it is described as JoinResponseOf does, and lists its members when it
// has at most `list_members_max` ranks.
void CollectiveOutcomeToProto(CollectiveOutcome outcome,
                              const PlannerOptions& planner,
                              v1::CollectiveResponse* response,
                              int list_members_max = INT_MAX);

// The largest group whose members a reply lists (a join's, or a sync's
// next epoch): the groups' --member_list_max for a rank that can ask for
// members (`members_on_request`), else every one.
int ListMembersMax(bool members_on_request, const GroupTableOptions& options);

// Returns the flight recorder's `entry` as the wire message.
v1::TraceEntry TraceEntryToProto(const TraceEntry& entry);

// Returns the event hub's `event` as the wire message.
v1::Event EventToProto(const Event& event);

// Returns `status` as a GroupAbort of `group` at `epoch`.
v1::GroupAbort AbortToProto(const std::string& group, uint64_t epoch,
                            const absl::Status& status);

// Reports the failure `request` describes to `core`, on a group of `job`
// (the caller's). Returns OK with the
// group's abort in `response` once the group is aborted, or the core's
// NOT_FOUND / FAILED_PRECONDITION for an unknown group or stale epoch.
absl::Status ReportFailureToCore(Coordinator& core, const std::string& job,
                                 const v1::ReportFailureRequest& request,
                                 v1::ReportFailureResponse* response);

// Returns the call-port reply to call `call_id` that says `status` (with its
// ErrorDetail, if it has one).
v1::CallPortReply CallPortStatusReply(uint64_t call_id,
                                      const absl::Status& status);

// Takes one call-port request of a worker of `job` into `core`: refuses a
// request that carries no call, commit or failure report, or has a negative
// timeout, at once (INVALID_ARGUMENT), else starts it with the deadline its
// timeout gives. `reply` runs once, on any thread, possibly before this
// returns.
void TakeCallPortRequest(Coordinator& core, const std::string& job,
                         const v1::CallPortRequest& request,
                         std::function<void(v1::CallPortReply)> reply);

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_COLLECTIVE_PROTO_H_
