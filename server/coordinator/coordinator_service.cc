#include "server/coordinator/coordinator_service.h"

#include <glog/logging.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "server/common/device_proto.h"
#include "server/common/grpc_status.h"
#include "server/coordinator/collective_proto.h"

namespace chorus {
namespace {

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context,
                                 const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

std::string DeviceNames(const std::vector<Device>& devices) {
  return absl::StrJoin(devices, ",", [](std::string* out, const Device& d) {
    out->append(CanonicalName(d));
  });
}

v1::GroupAbort AbortToProto(const std::string& group, uint64_t epoch,
                            const absl::Status& status) {
  v1::GroupAbort proto;
  proto.set_group(group);
  proto.set_epoch(epoch);
  proto.set_code(static_cast<int>(status.code()));
  proto.set_message(std::string(status.message()));
  return proto;
}

v1::GroupMember MemberToProto(const GroupMember& member) {
  v1::GroupMember proto;
  proto.set_rank(member.rank);
  proto.set_worker_id(member.worker_id);
  proto.set_worker_name(member.worker_name);
  proto.set_host(member.host);
  proto.set_address(member.address);
  *proto.mutable_device() = DeviceToProto(member.device);
  return proto;
}

}  // namespace

CoordinatorService::CoordinatorService(
    Registry* registry, GroupTable* groups, Clock* clock,
    CoordinatorServiceOptions options,
    std::function<void(absl::Time)> deadline_added)
    : registry_(registry),
      groups_(groups),
      clock_(clock),
      options_(options),
      deadline_added_(std::move(deadline_added)) {}

absl::Time CoordinatorService::CoreDeadline(
    const grpc::CallbackServerContext& context) const {
  const auto client = context.deadline();
  return chorus::CoreDeadline(
      clock_->Now(),
      client == std::chrono::system_clock::time_point::max()
          ? absl::InfiniteFuture()
          : absl::FromChrono(client),
      options_.max_wait);
}

grpc::ServerUnaryReactor* CoordinatorService::RegisterWorker(
    grpc::CallbackServerContext* context,
    const v1::RegisterWorkerRequest* request,
    v1::RegisterWorkerResponse* response) {
  WorkerRegistration registration;
  registration.name = request->name();
  registration.host = request->host();
  registration.address = request->address();
  registration.incarnation = request->incarnation();
  registration.cuda_support = request->cuda_support();
  for (const v1::Device& device : request->devices()) {
    registration.devices.push_back(DeviceFromProto(device));
  }
  absl::StatusOr<RegisterResult> result = registry_->Register(registration);
  if (!result.ok()) {
    LOG(WARNING) << "refused registration of worker \"" << request->name()
                 << "\" from " << context->peer() << ": " << result.status();
    return Finish(context, result.status());
  }
  if (result->replaced) {
    groups_->AbortWorker(result->replaced_id, registration.name,
                         "it restarted with a new incarnation");
  }
  if (!result->retried) {
    LOG(INFO) << (result->replaced ? "re-registered" : "registered")
              << " worker " << result->worker_id << " \"" << registration.name
              << "\" at " << registration.address << " incarnation "
              << registration.incarnation << " devices "
              << DeviceNames(registration.devices);
  }
  response->set_worker_id(result->worker_id);
  const absl::Duration lease = registry_->lease_timeout();
  response->set_lease_timeout_ms(absl::ToInt64Milliseconds(lease));
  response->set_heartbeat_interval_ms(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(lease / 4)));
  response->set_call_port(static_cast<uint32_t>(call_port_.load()));
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(
    grpc::CallbackServerContext* context, const v1::HeartbeatRequest* request,
    v1::HeartbeatResponse* response) {
  absl::Status status =
      registry_->Renew(request->worker_id(), request->incarnation());
  response->set_lease_timeout_ms(
      absl::ToInt64Milliseconds(registry_->lease_timeout()));
  if (status.ok()) {
    uint64_t latest = 0;
    for (const AbortNotice& notice : groups_->AbortsFor(
             request->worker_id(), request->aborts_seen(), &latest)) {
      *response->add_aborts() =
          AbortToProto(notice.group, notice.epoch, notice.status);
    }
    response->set_aborts_latest(latest);
  }
  return Finish(context, status);
}

grpc::ServerUnaryReactor* CoordinatorService::Deregister(
    grpc::CallbackServerContext* context, const v1::DeregisterRequest* request,
    v1::DeregisterResponse* response) {
  absl::StatusOr<WorkerRecord> record =
      registry_->Deregister(request->worker_id(), request->incarnation());
  if (record.ok()) {
    LOG(INFO) << "deregistered worker " << request->worker_id();
    groups_->AbortWorker(record->id, record->registration.name, "it shut down");
  }
  return Finish(context, record.status());
}

grpc::ServerUnaryReactor* CoordinatorService::ListWorkers(
    grpc::CallbackServerContext* context, const v1::ListWorkersRequest* request,
    v1::ListWorkersResponse* response) {
  const absl::Time now = clock_->Now();
  for (const WorkerRecord& record : registry_->List()) {
    v1::WorkerInfo* info = response->add_workers();
    info->set_worker_id(record.id);
    info->set_name(record.registration.name);
    info->set_host(record.registration.host);
    info->set_address(record.registration.address);
    info->set_incarnation(record.registration.incarnation);
    info->set_cuda_support(record.registration.cuda_support);
    info->set_lease_age_ms(absl::ToInt64Milliseconds(now - record.renewed_at));
    for (const Device& device : record.registration.devices) {
      *info->add_devices() = DeviceToProto(device);
    }
  }
  return Finish(context, absl::OkStatus());
}

grpc::ByteBuffer CoordinatorService::JoinResponseBytes(const GroupView& view) {
  absl::MutexLock lock(&join_response_mu_);
  if (join_response_.epoch != view.epoch || join_response_.group != view.name) {
    v1::JoinGroupResponse response;
    response.set_group(view.name);
    response.set_epoch(view.epoch);
    response.set_inline_max_bytes(groups_->options().planner.inline_max_bytes);
    response.mutable_members()->Reserve(view.members.size());
    for (const GroupMember& m : view.members) {
      *response.add_members() = MemberToProto(m);
    }
    bool own_buffer = false;
    grpc::ByteBuffer bytes;
    if (!grpc::SerializationTraits<v1::JoinGroupResponse>::Serialize(
             response, &bytes, &own_buffer)
             .ok()) {
      return grpc::ByteBuffer();
    }
    join_response_ = CachedJoinResponse{view.name, view.epoch, bytes};
  }
  // Copying a ByteBuffer shares its slices.
  return join_response_.bytes;
}

grpc::ServerUnaryReactor* CoordinatorService::JoinGroup(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request_bytes,
    grpc::ByteBuffer* response) {
  v1::JoinGroupRequest request;
  // Deserializing consumes the buffer; the copy shares its slices.
  grpc::ByteBuffer copy(*request_bytes);
  if (!grpc::SerializationTraits<v1::JoinGroupRequest>::Deserialize(&copy,
                                                                    &request)
           .ok()) {
    return Finish(context, absl::InvalidArgumentError(
                               "malformed JoinGroupRequest message"));
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  JoinRequest join;
  join.group = request.group();
  join.world_size = request.world_size();
  join.rank = request.rank();
  join.worker_id = request.worker_id();
  join.device = DeviceFromProto(request.device());
  join.request_id = request.request_id();
  join.deadline = CoreDeadline(*context);
  const absl::Time deadline = join.deadline;
  groups_->Join(std::move(join), [this, reactor, response](
                                     const absl::StatusOr<GroupView>& view) {
    absl::Status status = view.status();
    if (status.ok()) {
      *response = JoinResponseBytes(*view);
      if (response->Length() == 0) {
        status = absl::InternalError("cannot serialize the group");
      }
    }
    reactor->Finish(ToGrpcStatus(status));
  });
  deadline_added_(deadline);
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::Collective(
    grpc::CallbackServerContext* context, const v1::CollectiveRequest* request,
    v1::CollectiveResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const auto client = context->deadline();
  StartCollective(
      *request,
      client == std::chrono::system_clock::time_point::max()
          ? absl::InfiniteFuture()
          : absl::FromChrono(client),
      [reactor, response](absl::StatusOr<CollectiveOutcome> outcome) {
        if (outcome.ok()) {
          CollectiveOutcomeToProto(*std::move(outcome), response);
        }
        reactor->Finish(ToGrpcStatus(outcome.status()));
      });
  return reactor;
}

void CoordinatorService::StartCollective(const v1::CollectiveRequest& request,
                                         absl::Time client_deadline,
                                         GroupTable::CollectiveCallback done) {
  const absl::Time deadline =
      chorus::CoreDeadline(clock_->Now(), client_deadline, options_.max_wait);
  groups_->Collective(CollectiveCallFromProto(request, deadline),
                      std::move(done));
  deadline_added_(deadline);
}

void CoordinatorService::StartCommit(const v1::CommitRequest& request,
                                     absl::Time client_deadline,
                                     std::function<void(absl::Status)> done) {
  const absl::Time deadline =
      chorus::CoreDeadline(clock_->Now(), client_deadline, options_.max_wait);
  groups_->Commit(CommitCallFromProto(request, deadline), std::move(done));
  deadline_added_(deadline);
}

grpc::ServerBidiReactor<v1::CollectiveStreamRequest, v1::CollectiveStreamReply>*
CoordinatorService::CollectiveStream(grpc::CallbackServerContext* context) {
  auto* stream = new CollectiveStreamReactor(this);
  absl::Status ended;
  {
    absl::MutexLock lock(&streams_mu_);
    if (streams_ended_) {
      ended = streams_end_status_;
    } else {
      streams_.insert(stream);
    }
  }
  if (!ended.ok()) stream->End(ended);
  return stream;
}

void CoordinatorService::StreamDone(CollectiveStreamReactor* stream) {
  absl::MutexLock lock(&streams_mu_);
  streams_.erase(stream);
}

void CoordinatorService::EndStreams(const absl::Status& status) {
  std::vector<CollectiveStreamReactor*> streams;
  {
    absl::MutexLock lock(&streams_mu_);
    streams_ended_ = true;
    streams_end_status_ = status;
    streams.assign(streams_.begin(), streams_.end());
    // Held, a stream cannot be deleted before End() below returned.
    for (CollectiveStreamReactor* stream : streams) stream->Hold();
  }
  for (CollectiveStreamReactor* stream : streams) {
    stream->End(status);
    stream->Release();
  }
}

grpc::ServerUnaryReactor* CoordinatorService::ListGroups(
    grpc::CallbackServerContext* context, const v1::ListGroupsRequest* request,
    v1::ListGroupsResponse* response) {
  const absl::Time now = clock_->Now();
  for (const GroupSummary& summary : groups_->List()) {
    v1::GroupInfo* info = response->add_groups();
    info->set_name(summary.view.name);
    info->set_world_size(summary.view.world_size);
    info->set_epoch(summary.view.epoch);
    info->set_completed(summary.completed);
    for (const GroupMember& m : summary.view.members) {
      *info->add_members() = MemberToProto(m);
    }
    if (!summary.aborted.ok()) {
      *info->mutable_aborted() =
          AbortToProto(summary.view.name, summary.view.epoch, summary.aborted);
    }
    if (summary.pending_sequence != 0) {
      info->set_pending_sequence(summary.pending_sequence);
      for (int rank : summary.missing_ranks) info->add_missing_ranks(rank);
      info->set_pending_ms(
          absl::ToInt64Milliseconds(now - summary.pending_since));
    }
  }
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::Commit(
    grpc::CallbackServerContext* context, const v1::CommitRequest* request,
    v1::CommitResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time deadline = CoreDeadline(*context);
  groups_->Commit(CommitCallFromProto(*request, deadline),
                  [reactor](absl::Status status) {
                    reactor->Finish(ToGrpcStatus(status));
                  });
  deadline_added_(deadline);
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::ReportFailure(
    grpc::CallbackServerContext* context,
    const v1::ReportFailureRequest* request,
    v1::ReportFailureResponse* response) {
  const absl::Status failure(static_cast<absl::StatusCode>(request->code()),
                             request->message());
  absl::Status verdict =
      groups_->ReportFailure(request->group(), request->epoch(),
                             request->rank(), request->sequence(), failure);
  if (absl::IsAborted(verdict)) {
    LOG(WARNING) << verdict;
    *response->mutable_abort() =
        AbortToProto(request->group(), request->epoch(), verdict);
    verdict = absl::OkStatus();
  }
  return Finish(context, verdict);
}

}  // namespace chorus
