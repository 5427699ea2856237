#include "server/coordinator/collective_proto.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/collective_spec_proto.h"
#include "common/device_proto.h"
#include "common/status_detail.h"

namespace chorus {
v1::CallPortReply CallPortStatusReply(uint64_t call_id,
                                      const absl::Status& status) {
  v1::CallPortReply reply;
  reply.set_call_id(call_id);
  reply.set_code(static_cast<int>(status.code()));
  reply.set_message(std::string(status.message()));
  if (std::optional<v1::ErrorDetail> detail = ErrorDetailOf(status)) {
    *reply.mutable_detail() = *std::move(detail);
  }
  return reply;
}

namespace {

// Unix nanoseconds; 0 for InfinitePast() (never).
int64_t Nanos(absl::Time t) {
  return t == absl::InfinitePast() ? 0 : absl::ToUnixNanos(t);
}

}  // namespace

WorkerRegistration RegistrationFromProto(
    const v1::RegisterWorkerRequest& request) {
  WorkerRegistration registration;
  registration.name = request.name();
  registration.host = request.host();
  registration.machine = request.machine();
  registration.address = request.address();
  registration.data_port = request.data_port();
  registration.incarnation = request.incarnation();
  registration.cuda_support = request.cuda_support();
  registration.nccl_version = request.nccl_version();
  for (const v1::Device& device : request.devices()) {
    registration.devices.push_back(DeviceFromProto(device));
  }
  return registration;
}

JoinRequest JoinFromProto(const v1::JoinGroupRequest& request,
                          absl::Time client_deadline) {
  JoinRequest join;
  join.group = request.group();
  join.world_size = request.world_size();
  join.rank = request.rank();
  join.worker_id = request.worker_id();
  join.device = DeviceFromProto(request.device());
  join.request_id = request.request_id();
  join.deadline = client_deadline;
  join.min_world_size = request.min_world_size();
  join.max_world_size = request.max_world_size();
  join.newcomer = request.newcomer();
  join.follow_epoch = request.follow_epoch();
  return join;
}

CollectiveCall CollectiveCallFromProto(const v1::CollectiveRequest& request,
                                       absl::Time client_deadline) {
  CollectiveCall call;
  call.group = request.group();
  call.epoch = request.epoch();
  call.rank = request.rank();
  call.sequence = request.sequence();
  call.spec = SpecFromProto(request.spec());
  call.algorithm = static_cast<Algorithm>(request.algorithm());
  if (request.has_device()) call.device = DeviceFromProto(request.device());
  call.has_data = request.has_inline_data();
  call.data = request.inline_data();
  call.deadline = client_deadline;
  call.running = request.running();
  call.repeats_same_host = request.repeats_same_host();
  for (const v1::SequenceRange& range : request.leader_ran()) {
    if (call.leader_ran.size() == kMaxLeaderRanRanges) break;
    call.leader_ran.emplace_back(range.first(), range.last());
  }
  for (const v1::CollectiveRequest& replay : request.replays()) {
    if (call.replays.size() == kMaxReplays) break;
    // A replay's own replays mean nothing.
    v1::CollectiveRequest alone = replay;
    alone.clear_replays();
    alone.clear_running();
    call.replays.push_back(CollectiveCallFromProto(alone, client_deadline));
  }
  return call;
}

StoreOp StoreOpFromProto(const v1::StoreRequest& request,
                         absl::Time client_deadline) {
  StoreOp op;
  op.kind = static_cast<StoreOpKind>(request.op());
  op.keys.assign(request.keys().begin(), request.keys().end());
  op.value = request.value();
  op.expected = request.expected();
  op.amount = request.amount();
  op.deadline = client_deadline;
  return op;
}

CommitCall CommitCallFromProto(const v1::CommitRequest& request,
                               absl::Time client_deadline) {
  CommitCall call;
  call.group = request.group();
  call.epoch = request.epoch();
  call.rank = request.rank();
  call.sequence = request.sequence();
  if (request.has_result_hash()) call.result_hash = request.result_hash();
  call.deadline = client_deadline;
  return call;
}

v1::GroupMember MemberToProto(const GroupMember& member) {
  v1::GroupMember proto;
  proto.set_rank(member.rank);
  proto.set_worker_id(member.worker_id);
  proto.set_worker_name(member.worker_name);
  proto.set_host(member.host);
  proto.set_address(member.address);
  proto.set_data_port(member.data_port);
  proto.set_incarnation(member.incarnation);
  *proto.mutable_device() = DeviceToProto(member.device);
  return proto;
}

int ListMembersMax(bool members_on_request, const GroupTableOptions& options) {
  return members_on_request ? options.member_list_max : INT_MAX;
}

void CollectiveOutcomeToProto(CollectiveOutcome outcome,
                              const PlannerOptions& planner,
                              v1::CollectiveResponse* response,
                              int list_members_max) {
  response->set_sequence(outcome.sequence);
  response->mutable_plan()->set_algorithm(
      static_cast<v1::Algorithm>(outcome.plan.algorithm));
  response->mutable_plan()->set_chunk_bytes(outcome.plan.chunk_bytes);
  response->set_inline_result(std::move(outcome.data));
  response->set_joiners_waiting(outcome.joiners_waiting);
  if (outcome.next != nullptr) {
    *response->mutable_next() = JoinResponseOf(
        *outcome.next, planner, outcome.next->world_size <= list_members_max);
  }
}

v1::JoinGroupResponse JoinResponseOf(const GroupView& view,
                                     const PlannerOptions& planner,
                                     bool list_members) {
  v1::JoinGroupResponse response;
  response.set_group(view.name);
  response.set_epoch(view.epoch);
  response.set_inline_max_bytes(planner.inline_max_bytes);
  response.set_all_reduce_inline_max_bytes(InlineMaxBytes(
      CollectiveKind::kAllReduce, view.world_size, view.same_host, planner));
  response.set_world_size(static_cast<int>(view.members.size()));
  if (list_members) {
    response.mutable_members()->Reserve(view.members.size());
    for (const GroupMember& m : view.members) {
      *response.add_members() = MemberToProto(m);
    }
  }
  if (view.rank >= 0) response.set_rank(view.rank);
  response.set_min_world_size(view.min_world_size);
  response.set_max_world_size(view.max_world_size);
  response.set_leader_calls(planner.leader_calls && list_members &&
                            view.min_world_size == 0);
  // Also how long ranks repeating same-host calls wait for each other.
  response.set_leader_patience_ms(static_cast<uint32_t>(std::clamp<int64_t>(
      absl::ToInt64Milliseconds(planner.leader_patience), 1, 3600000)));
  return response;
}

v1::TraceEntry TraceEntryToProto(const TraceEntry& entry) {
  v1::TraceEntry proto;
  proto.set_record_id(entry.record_id);
  proto.set_epoch(entry.epoch);
  proto.set_sequence(entry.sequence);
  *proto.mutable_spec() = SpecToProto(entry.spec);
  proto.set_state(TraceStateName(entry.state));
  proto.set_decided_ns(Nanos(entry.decided));
  proto.set_plan(static_cast<v1::Algorithm>(entry.plan));
  proto.set_ended_ns(Nanos(entry.ended));
  proto.set_code(static_cast<int>(entry.verdict.code()));
  proto.set_message(std::string(entry.verdict.message()));
  for (size_t rank = 0; rank < entry.arrived.size(); ++rank) {
    v1::TraceRank* r = proto.add_ranks();
    r->set_rank(static_cast<int>(rank));
    r->set_called_ns(Nanos(entry.arrived[rank]));
    r->set_asked(entry.asked[rank]);
    r->set_committed_ns(Nanos(entry.committed[rank]));
  }
  return proto;
}

v1::Event EventToProto(const Event& event) {
  v1::Event proto;
  proto.set_time_ns(absl::ToUnixNanos(event.time));
  proto.set_kind(static_cast<v1::EventKind>(event.kind));
  proto.set_worker_id(event.worker_id);
  proto.set_worker_name(event.worker_name);
  proto.set_job(event.job);
  proto.set_group(event.group);
  proto.set_epoch(event.epoch);
  proto.set_sequence(event.sequence);
  for (int rank : event.ranks) proto.add_ranks(rank);
  proto.set_code(static_cast<int>(event.status.code()));
  proto.set_message(std::string(event.status.message()));
  proto.set_reason(event.reason);
  proto.set_dropped(event.dropped);
  proto.set_text(event.text);
  return proto;
}

v1::GroupAbort AbortToProto(const std::string& group, uint64_t epoch,
                            const absl::Status& status) {
  v1::GroupAbort proto;
  proto.set_group(group);
  proto.set_epoch(epoch);
  proto.set_code(static_cast<int>(status.code()));
  proto.set_message(std::string(status.message()));
  if (std::optional<v1::ErrorDetail> detail = ErrorDetailOf(status)) {
    *proto.mutable_detail() = *std::move(detail);
  }
  return proto;
}

absl::Status ReportFailureToCore(Coordinator& core, const std::string& job,
                                 const v1::ReportFailureRequest& request,
                                 v1::ReportFailureResponse* response) {
  const absl::Status failure(static_cast<absl::StatusCode>(request.code()),
                             request.message());
  absl::Status verdict =
      core.ReportFailure(job, request.group(), request.epoch(), request.rank(),
                         request.sequence(), failure,
                         std::vector<int>(request.lost_ranks().begin(),
                                          request.lost_ranks().end()),
                         request.leaving());
  if (!absl::IsAborted(verdict)) return verdict;
  *response->mutable_abort() =
      AbortToProto(request.group(), request.epoch(), verdict);
  return absl::OkStatus();
}

void TakeCallPortRequest(Coordinator& core, const std::string& job,
                         const v1::CallPortRequest& request,
                         std::function<void(v1::CallPortReply)> reply) {
  const uint64_t call_id = request.call_id();
  if (request.kind_case() == v1::CallPortRequest::KIND_NOT_SET) {
    reply(CallPortStatusReply(
        call_id, absl::InvalidArgumentError(absl::StrCat(
                     "call port call ", call_id,
                     " carries no CollectiveRequest, CommitRequest or "
                     "ReportFailureRequest"))));
    return;
  }
  if (request.timeout_us() < 0) {
    reply(CallPortStatusReply(
        call_id, absl::InvalidArgumentError(absl::StrCat(
                     "call port call ", call_id, " has a negative timeout (",
                     request.timeout_us(), " us)"))));
    return;
  }
  const absl::Time client_deadline =
      request.timeout_us() == 0
          ? absl::InfiniteFuture()
          : core.clock()->Now() + absl::Microseconds(request.timeout_us());
  switch (request.kind_case()) {
    case v1::CallPortRequest::kCommit: {
      CommitCall commit =
          CommitCallFromProto(request.commit(), client_deadline);
      commit.job = job;
      core.Commit(std::move(commit),
                  [call_id, reply = std::move(reply)](absl::Status status) {
                    reply(CallPortStatusReply(call_id, status));
                  });
      return;
    }
    case v1::CallPortRequest::kFailure: {
      v1::ReportFailureResponse response;
      const absl::Status status =
          ReportFailureToCore(core, job, request.failure(), &response);
      v1::CallPortReply verdict = CallPortStatusReply(call_id, status);
      if (response.has_abort()) {
        *verdict.mutable_abort() = std::move(*response.mutable_abort());
      }
      reply(std::move(verdict));
      return;
    }
    default: {
      CollectiveCall call =
          CollectiveCallFromProto(request.call(), client_deadline);
      call.job = job;
      core.Collective(
          std::move(call),
          [call_id, reply = std::move(reply),
           planner = core.group_options().planner,
           list_max = ListMembersMax(request.call().members_on_request(),
                                     core.group_options())](
              absl::StatusOr<CollectiveOutcome> outcome) {
            if (!outcome.ok()) {
              reply(CallPortStatusReply(call_id, outcome.status()));
              return;
            }
            v1::CallPortReply verdict;
            verdict.set_call_id(call_id);
            CollectiveOutcomeToProto(*std::move(outcome), planner,
                                     verdict.mutable_response(), list_max);
            reply(std::move(verdict));
          });
    }
  }
}

}  // namespace chorus
