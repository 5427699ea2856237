#include "server/coordinator/coordinator_service.h"

#include <glog/logging.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "common/device_proto.h"
#include "common/grpc_status.h"
#include "common/refused_reactor.h"
#include "common/transport_security.h"
#include "server/coordinator/collective_proto.h"

namespace chorus {
namespace {

// HeartbeatRequest.withdrawn entries read at most.
constexpr size_t kMaxWithdrawn = 64;

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

// The client's deadline of `context`; InfiniteFuture() for none.
absl::Time ClientDeadline(const grpc::CallbackServerContext& context) {
  const auto client = context.deadline();
  return client == std::chrono::system_clock::time_point::max()
             ? absl::InfiniteFuture()
             : absl::FromChrono(client);
}

// With TLS on, the identity (a worker's, or a client's where the table lets
// clients use `action`) whose certificate made the call (PERMISSION_DENIED
// for an identity the authorization table does not let use `action`, a
// method's full name); nullopt with TLS off, where anyone may act for any
// worker.
absl::StatusOr<std::optional<Identity>> CallingWorker(
    const grpc::CallbackServerContext& context, absl::string_view action) {
  if (!TlsEnabled()) return std::nullopt;
  absl::StatusOr<Identity> caller = RequireIdentity(context, action);
  if (!caller.ok()) return caller.status();
  return *std::move(caller);
}

// One WatchEvents stream: a subscription to the core's events, written one
// at a time; the core's event hub holds the events not written yet (and
// drops the oldest for a client that reads too slowly).
//
// Lifecycle: made by CoordinatorService::WatchEvents; gRPC owns it and it
// deletes itself in OnDone(), after unsubscribing. It ends with CANCELLED
// when the client goes away and UNAVAILABLE once the core shut down and
// the queued events are written.
// Thread safety: the hub's wake (on the thread that published the event,
// without the core's locks), OnWriteDone and OnCancel may come at once on
// different threads; each decides under mu_ and starts the write or
// Finish after releasing it.
class EventStream final : public grpc::ServerWriteReactor<v1::Event> {
 public:
  // `core` is not owned and must outlive the stream.
  explicit EventStream(Coordinator* core) : core_(core) {
    {
      // Held so that a wake that comes at once waits for the id.
      absl::MutexLock lock(&mu_);
      id_ = core_->SubscribeEvents([this] { Pump(); });
    }
    // Sent (as every operation started before gRPC binds the reactor) once
    // this returns; the client may wait for it to know it is subscribed.
    StartSendInitialMetadata();
    Pump();
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      // The client is gone.
      if (!ok && !finish_.has_value()) finish_ = grpc::Status::CANCELLED;
    }
    Pump();
  }

  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      if (!finish_.has_value()) finish_ = grpc::Status::CANCELLED;
    }
    Pump();
  }

  void OnDone() override {
    uint64_t id;
    {
      absl::MutexLock lock(&mu_);
      id = id_;
    }
    core_->UnsubscribeEvents(id);
    delete this;
  }

 private:
  // The operation to start once mu_ is released: a write of message_, a
  // Finish, or nothing.
  struct Step {
    bool write = false;
    std::optional<grpc::Status> finish;
  };

  // Decides the next operation: none while a write is in flight or after
  // Finish; Finish when the stream is to end; else the next event's write.
  Step NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Step step;
    if (writing_ || finished_) return step;
    if (!finish_.has_value()) {
      Event event;
      switch (core_->NextEvent(id_, &event)) {
        case EventHub::Poll::kEvent:
          message_ = EventToProto(event);
          writing_ = true;
          step.write = true;
          return step;
        case EventHub::Poll::kEmpty:
          return step;
        case EventHub::Poll::kClosed:
          finish_ = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "the coordinator is shutting down");
          break;
      }
    }
    finished_ = true;
    step.finish = finish_;
    return step;
  }

  // Starts the next operation (see NextLocked).
  void Pump() {
    Step step;
    {
      absl::MutexLock lock(&mu_);
      step = NextLocked();
    }
    if (step.write) StartWrite(&message_);
    if (step.finish.has_value()) Finish(*step.finish);
  }

  Coordinator* const core_;  // not owned

  absl::Mutex mu_;
  uint64_t id_ ABSL_GUARDED_BY(mu_) = 0;
  // Owned by gRPC while writing_.
  v1::Event message_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  // The status to end with, once no write is in flight.
  std::optional<grpc::Status> finish_ ABSL_GUARDED_BY(mu_);
  // Finish() was called (or is about to be).
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

absl::Status CoordinatorService::AuthorizeWorkerId(
    const grpc::CallbackServerContext& context, absl::string_view action,
    uint64_t id) const {
  return AuthorizeWorkerJob(context, action, id).status();
}

absl::StatusOr<std::string> CoordinatorService::AuthorizeWorkerJob(
    const grpc::CallbackServerContext& context, absl::string_view action,
    uint64_t id) const {
  absl::StatusOr<std::optional<Identity>> caller =
      CallingWorker(context, action);
  if (!caller.ok()) return caller.status();
  if (!caller->has_value()) return std::string();
  if (absl::Status allowed = core_->AuthorizeWorker(**caller, id);
      !allowed.ok()) {
    return allowed;
  }
  return (*caller)->job;
}

absl::StatusOr<std::string> CoordinatorService::AuthorizeRank(
    const grpc::CallbackServerContext& context, absl::string_view action,
    const std::string& group, uint64_t epoch, int rank) const {
  absl::StatusOr<std::optional<Identity>> caller =
      CallingWorker(context, action);
  if (!caller.ok()) return caller.status();
  if (!caller->has_value()) return std::string();
  if (absl::Status allowed = core_->AuthorizeRank(**caller, group, epoch, rank);
      !allowed.ok()) {
    return allowed;
  }
  return (*caller)->job;
}

CoordinatorService::CoordinatorService(Coordinator* core,
                                       const Leadership* leadership)
    : core_(core), leadership_(leadership) {}

grpc::ServerUnaryReactor* CoordinatorService::RegisterWorker(
    grpc::CallbackServerContext* context,
    const v1::RegisterWorkerRequest* request,
    v1::RegisterWorkerResponse* response) {
  if (absl::Status leading = CheckLeading(leadership_); !leading.ok()) {
    return Finish(context, leading);
  }
  absl::StatusOr<std::optional<Identity>> caller =
      CallingWorker(*context, "chorus.v1.Coordinator/RegisterWorker");
  if (!caller.ok()) return Finish(context, caller.status());
  if (caller->has_value() && (*caller)->name != request->name()) {
    LOG(WARNING) << "refused registration of worker \"" << request->name()
                 << "\" by " << (*caller)->Uri() << " from " << context->peer();
    return Finish(context, absl::PermissionDeniedError(absl::StrCat(
                               "the certificate of worker \"", (*caller)->name,
                               "\" may not register a worker named \"",
                               request->name(), "\"")));
  }
  WorkerRegistration registration = RegistrationFromProto(*request);
  // The job is the certificate's, never the request's.
  if (caller->has_value()) registration.job = (*caller)->job;
  absl::StatusOr<RegisterResult> result = core_->Register(registration);
  if (!result.ok()) {
    LOG(WARNING) << "refused registration of worker \"" << request->name()
                 << "\" from " << context->peer() << ": "
                 << result.status().ToString(
                        absl::StatusToStringMode::kWithNoExtraData);
    return Finish(context, result.status());
  }
  if (!result->retried) {
    LOG(INFO) << (result->replaced ? "re-registered" : "registered")
              << " worker " << result->worker_id << " \"" << registration.name
              << "\" at " << registration.address << " incarnation "
              << registration.incarnation << " devices "
              << DeviceNames(registration.devices);
  }
  response->set_worker_id(result->worker_id);
  response->set_kept(result->retried);
  const absl::Duration lease = core_->lease_timeout();
  response->set_lease_timeout_ms(absl::ToInt64Milliseconds(lease));
  response->set_heartbeat_interval_ms(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(lease / 4)));
  response->set_call_port(static_cast<uint32_t>(call_port_.load()));
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(
    grpc::CallbackServerContext* context, const v1::HeartbeatRequest* request,
    v1::HeartbeatResponse* response) {
  if (absl::Status leading = CheckLeading(leadership_); !leading.ok()) {
    return Finish(context, leading);
  }
  if (absl::Status allowed = AuthorizeWorkerId(
          *context, "chorus.v1.Coordinator/Heartbeat", request->worker_id());
      !allowed.ok()) {
    return Finish(context, allowed);
  }
  std::vector<Device> withdrawn;
  for (const v1::Device& device : request->withdrawn()) {
    if (withdrawn.size() == kMaxWithdrawn) break;
    withdrawn.push_back(DeviceFromProto(device));
  }
  HeartbeatReply reply;
  absl::Status status =
      core_->Heartbeat(request->worker_id(), request->incarnation(),
                       request->aborts_seen(), &reply, withdrawn);
  response->set_lease_timeout_ms(
      absl::ToInt64Milliseconds(core_->lease_timeout()));
  if (status.ok()) {
    for (const AbortNotice& notice : reply.aborts) {
      *response->add_aborts() =
          AbortToProto(notice.group, notice.epoch, notice.status);
    }
    response->set_aborts_latest(reply.aborts_latest);
  }
  return Finish(context, status);
}

grpc::ServerUnaryReactor* CoordinatorService::Deregister(
    grpc::CallbackServerContext* context, const v1::DeregisterRequest* request,
    v1::DeregisterResponse* response) {
  if (absl::Status leading = CheckLeading(leadership_); !leading.ok()) {
    return Finish(context, leading);
  }
  if (absl::Status allowed = AuthorizeWorkerId(
          *context, "chorus.v1.Coordinator/Deregister", request->worker_id());
      !allowed.ok()) {
    return Finish(context, allowed);
  }
  return Finish(
      context, core_->Deregister(request->worker_id(), request->incarnation()));
}

grpc::ServerUnaryReactor* CoordinatorService::ListWorkers(
    grpc::CallbackServerContext* context, const v1::ListWorkersRequest* request,
    v1::ListWorkersResponse* response) {
  if (absl::Status leading = CheckLeading(leadership_); !leading.ok()) {
    return Finish(context, leading);
  }
  if (absl::Status allowed =
          RequireRole(*context, "chorus.v1.Coordinator/ListWorkers");
      !allowed.ok()) {
    return Finish(context, allowed);
  }
  const absl::Time now = core_->clock()->Now();
  for (const WorkerRecord& record : core_->Workers()) {
    v1::WorkerInfo* info = response->add_workers();
    info->set_worker_id(record.id);
    info->set_name(record.registration.name);
    info->set_job(record.registration.job);
    info->set_host(record.registration.host);
    info->set_address(record.registration.address);
    info->set_incarnation(record.registration.incarnation);
    info->set_cuda_support(record.registration.cuda_support);
    info->set_nccl_version(record.registration.nccl_version);
    info->set_lease_age_ms(absl::ToInt64Milliseconds(now - record.renewed_at));
    for (const Device& device : record.registration.devices) {
      *info->add_devices() = DeviceToProto(device);
    }
  }
  return Finish(context, absl::OkStatus());
}

grpc::ByteBuffer CoordinatorService::JoinResponseBytes(const std::string& job,
                                                       const GroupView& view,
                                                       bool list_members) {
  // A view answering one newcomer or follower names its rank: its own. A
  // reply without members is small enough to make each time.
  const bool shared = view.rank < 0 && list_members;
  absl::MutexLock lock(&join_response_mu_);
  // Each job numbers its groups' epochs alike: the job is part of the key.
  if (!shared || join_response_.epoch != view.epoch ||
      join_response_.group != view.name || join_response_.job != job) {
    const v1::JoinGroupResponse response =
        JoinResponseOf(view, core_->group_options().planner, list_members);
    bool own_buffer = false;
    grpc::ByteBuffer bytes;
    if (!grpc::SerializationTraits<v1::JoinGroupResponse>::Serialize(
             response, &bytes, &own_buffer)
             .ok()) {
      return grpc::ByteBuffer();
    }
    if (!shared) return bytes;
    join_response_ = CachedJoinResponse{job, view.name, view.epoch, bytes};
  }
  // Copying a ByteBuffer shares its slices.
  return join_response_.bytes;
}

grpc::ServerUnaryReactor* CoordinatorService::JoinGroup(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request_bytes,
    grpc::ByteBuffer* response) {
  if (absl::Status leading = CheckLeading(leadership_); !leading.ok()) {
    return Finish(context, leading);
  }
  v1::JoinGroupRequest request;
  // Deserializing consumes the buffer; the copy shares its slices.
  grpc::ByteBuffer copy(*request_bytes);
  if (!grpc::SerializationTraits<v1::JoinGroupRequest>::Deserialize(&copy,
                                                                    &request)
           .ok()) {
    return Finish(context, absl::InvalidArgumentError(
                               "malformed JoinGroupRequest message"));
  }
  absl::StatusOr<std::string> job = AuthorizeWorkerJob(
      *context, "chorus.v1.Coordinator/JoinGroup", request.worker_id());
  if (!job.ok()) return Finish(context, job.status());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  JoinRequest join = JoinFromProto(request, ClientDeadline(*context));
  // The worker cancels a newcomer's join whose caller went away. The
  // context lives until the reactor finishes, after the join's answer.
  join.withdrawn = [context] { return context->IsCancelled(); };
  const int list_max =
      ListMembersMax(request.members_on_request(), core_->group_options());
  core_->Join(std::move(join), [this, reactor, response, list_max,
                                job = *std::move(job)](
                                   const absl::StatusOr<GroupView>& view) {
    absl::Status status = view.status();
    if (status.ok()) {
      *response = JoinResponseBytes(job, *view, view->world_size <= list_max);
      if (response->Length() == 0) {
        status = absl::InternalError("cannot serialize the group");
      }
    }
    reactor->Finish(ToGrpcStatus(status));
  });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::GetGroupMembers(
    grpc::CallbackServerContext* context,
    const v1::GetGroupMembersRequest* request,
    v1::GetGroupMembersResponse* response) {
  if (absl::Status leading = CheckLeading(leadership_); !leading.ok()) {
    return Finish(context, leading);
  }
  absl::StatusOr<std::string> job =
      AuthorizeRank(*context, "chorus.v1.Coordinator/GetGroupMembers",
                    request->group(), request->epoch(), request->rank());
  if (!job.ok()) return Finish(context, job.status());
  absl::StatusOr<std::vector<GroupMember>> members = core_->Members(
      *job, request->group(), request->epoch(),
      absl::MakeConstSpan(request->ranks().data(), request->ranks().size()));
  if (!members.ok()) return Finish(context, members.status());
  response->set_epoch(request->epoch());
  response->mutable_members()->Reserve(static_cast<int>(members->size()));
  for (const GroupMember& m : *members) {
    *response->add_members() = MemberToProto(m);
  }
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::Collective(
    grpc::CallbackServerContext* context, const v1::CollectiveRequest* request,
    v1::CollectiveResponse* response) {
  if (absl::Status leading = CheckLeading(leadership_); !leading.ok()) {
    return Finish(context, leading);
  }
  absl::StatusOr<std::string> job =
      AuthorizeRank(*context, "chorus.v1.Coordinator/Collective",
                    request->group(), request->epoch(), request->rank());
  if (!job.ok()) return Finish(context, job.status());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  CollectiveCall call =
      CollectiveCallFromProto(*request, ClientDeadline(*context));
  call.job = *std::move(job);
  const int list_max =
      ListMembersMax(request->members_on_request(), core_->group_options());
  core_->Collective(std::move(call),
                    [this, reactor, response,
                     list_max](absl::StatusOr<CollectiveOutcome> outcome) {
                      if (outcome.ok()) {
                        CollectiveOutcomeToProto(*std::move(outcome),
                                                 core_->group_options().planner,
                                                 response, list_max);
                      }
                      reactor->Finish(ToGrpcStatus(outcome.status()));
                    });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::ListGroups(
    grpc::CallbackServerContext* context, const v1::ListGroupsRequest* request,
    v1::ListGroupsResponse* response) {
  if (absl::Status leading = CheckLeading(leadership_); !leading.ok()) {
    return Finish(context, leading);
  }
  if (absl::Status allowed =
          RequireRole(*context, "chorus.v1.Coordinator/ListGroups");
      !allowed.ok()) {
    return Finish(context, allowed);
  }
  const absl::Time now = core_->clock()->Now();
  for (const GroupSummary& summary : core_->Groups()) {
    v1::GroupInfo* info = response->add_groups();
    info->set_name(summary.view.name);
    info->set_job(summary.job);
    info->set_world_size(summary.view.world_size);
    info->set_epoch(summary.view.epoch);
    info->set_completed(summary.completed);
    info->set_min_world_size(summary.view.min_world_size);
    info->set_max_world_size(summary.view.max_world_size);
    info->set_joiners_waiting(summary.joiners_waiting);
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
  for (const FormingSummary& summary : core_->Forming()) {
    v1::GroupInfo* info = response->add_forming();
    info->set_name(summary.name);
    info->set_job(summary.job);
    info->set_world_size(summary.world_size);
    for (const GroupMember& m : summary.joined) {
      *info->add_members() = MemberToProto(m);
    }
    for (int rank : summary.missing_ranks) info->add_missing_ranks(rank);
    info->set_pending_ms(absl::ToInt64Milliseconds(now - summary.since));
  }
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::GetTrace(
    grpc::CallbackServerContext* context, const v1::GetTraceRequest* request,
    v1::GetTraceResponse* response) {
  if (absl::Status leading = CheckLeading(leadership_); !leading.ok()) {
    return Finish(context, leading);
  }
  if (absl::Status allowed =
          RequireRole(*context, "chorus.v1.Coordinator/GetTrace");
      !allowed.ok()) {
    return Finish(context, allowed);
  }
  absl::StatusOr<std::vector<TraceEntry>> entries =
      core_->Trace(request->job(), request->group());
  if (entries.ok()) {
    for (const TraceEntry& entry : *entries) {
      *response->add_entries() = TraceEntryToProto(entry);
    }
  }
  return Finish(context, entries.status());
}

grpc::ServerUnaryReactor* CoordinatorService::Commit(
    grpc::CallbackServerContext* context, const v1::CommitRequest* request,
    v1::CommitResponse* response) {
  if (absl::Status leading = CheckLeading(leadership_); !leading.ok()) {
    return Finish(context, leading);
  }
  absl::StatusOr<std::string> job =
      AuthorizeRank(*context, "chorus.v1.Coordinator/Commit", request->group(),
                    request->epoch(), request->rank());
  if (!job.ok()) return Finish(context, job.status());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  CommitCall commit = CommitCallFromProto(*request, ClientDeadline(*context));
  commit.job = *std::move(job);
  core_->Commit(std::move(commit), [reactor](absl::Status status) {
    reactor->Finish(ToGrpcStatus(status));
  });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::ReportFailure(
    grpc::CallbackServerContext* context,
    const v1::ReportFailureRequest* request,
    v1::ReportFailureResponse* response) {
  if (absl::Status leading = CheckLeading(leadership_); !leading.ok()) {
    return Finish(context, leading);
  }
  absl::StatusOr<std::string> job =
      AuthorizeRank(*context, "chorus.v1.Coordinator/ReportFailure",
                    request->group(), request->epoch(), request->rank());
  if (!job.ok()) return Finish(context, job.status());
  return Finish(context, ReportFailureToCore(*core_, *job, *request, response));
}

grpc::ServerWriteReactor<v1::Event>* CoordinatorService::WatchEvents(
    grpc::CallbackServerContext* context,
    const v1::WatchEventsRequest* request) {
  if (absl::Status leading = CheckLeading(leadership_); !leading.ok()) {
    return new RefusedReactor<grpc::ServerWriteReactor<v1::Event>>(
        ToGrpcStatus(leading));
  }
  if (absl::Status allowed =
          RequireRole(*context, "chorus.v1.Coordinator/WatchEvents");
      !allowed.ok()) {
    return new RefusedReactor<grpc::ServerWriteReactor<v1::Event>>(
        ToGrpcStatus(allowed));
  }
  return new EventStream(core_);
}

grpc::ServerUnaryReactor* CoordinatorService::Store(
    grpc::CallbackServerContext* context, const v1::StoreRequest* request,
    v1::StoreResponse* response) {
  if (absl::Status leading = CheckLeading(leadership_); !leading.ok()) {
    return Finish(context, leading);
  }
  // The job is the certificate's; without TLS, the default job.
  absl::StatusOr<std::optional<Identity>> caller =
      CallingWorker(*context, "chorus.v1.Coordinator/Store");
  if (!caller.ok()) return Finish(context, caller.status());
  const std::string job = caller->has_value() ? (*caller)->job : "";
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  core_->Store(job, StoreOpFromProto(*request, ClientDeadline(*context)),
               [reactor, response](absl::StatusOr<StoreResult> result) {
                 if (result.ok()) {
                   response->set_value(std::move(result->value));
                   response->set_number(result->number);
                   response->set_flag(result->flag);
                 }
                 reactor->Finish(ToGrpcStatus(result.status()));
               });
  return reactor;
}

}  // namespace chorus
