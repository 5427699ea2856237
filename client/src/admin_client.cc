#include "chorus/admin_client.h"

#include <grpcpp/client_context.h>

#include <memory>
#include <utility>

#include "chorus/v1/coordinator.grpc.pb.h"
#include "common/collective_spec_proto.h"
#include "common/coordinator_target.h"
#include "common/device_proto.h"
#include "common/grpc_status.h"
#include "common/net.h"
#include "common/status_detail.h"
#include "common/tls_mismatch.h"

namespace chorus {
namespace {

WorkerInfo WorkerFromProto(const v1::WorkerInfo& proto) {
  WorkerInfo info;
  info.id = proto.worker_id();
  info.name = proto.name();
  info.job = proto.job();
  info.host = proto.host();
  info.address = proto.address();
  info.incarnation = proto.incarnation();
  info.cuda_support = proto.cuda_support();
  info.nccl_version = proto.nccl_version();
  info.lease_age = absl::Milliseconds(proto.lease_age_ms());
  for (const v1::Device& device : proto.devices()) {
    info.devices.push_back(DeviceFromProto(device));
  }
  return info;
}

GroupInfo GroupFromProto(const v1::GroupInfo& proto) {
  GroupInfo info;
  info.name = proto.name();
  info.job = proto.job();
  info.world_size = proto.world_size();
  info.epoch = proto.epoch();
  info.completed = proto.completed();
  info.min_world_size = proto.min_world_size();
  info.max_world_size = proto.max_world_size();
  info.joiners_waiting = proto.joiners_waiting();
  for (const v1::GroupMember& m : proto.members()) {
    GroupMemberInfo member;
    member.rank = m.rank();
    member.worker_id = m.worker_id();
    member.worker_name = m.worker_name();
    member.host = m.host();
    member.address = m.address();
    member.device = DeviceFromProto(m.device());
    info.members.push_back(std::move(member));
  }
  info.pending_sequence = proto.pending_sequence();
  info.missing_ranks.assign(proto.missing_ranks().begin(),
                            proto.missing_ranks().end());
  info.pending = absl::Milliseconds(proto.pending_ms());
  if (proto.has_aborted()) {
    info.aborted =
        StatusWithDetail(static_cast<absl::StatusCode>(proto.aborted().code()),
                         proto.aborted().message(), proto.aborted().detail());
  }
  return info;
}

absl::Time TimeOf(int64_t unix_ns) {
  return unix_ns == 0 ? absl::InfinitePast() : absl::FromUnixNanos(unix_ns);
}

TraceEntry::State StateOf(const std::string& name) {
  if (name == "decided") return TraceEntry::State::kDecided;
  if (name == "completed") return TraceEntry::State::kCompleted;
  if (name == "failed") return TraceEntry::State::kFailed;
  if (name == "membership_changed") {
    return TraceEntry::State::kMembershipChanged;
  }
  return TraceEntry::State::kWaiting;
}

Event EventFromProto(const v1::Event& proto) {
  Event event;
  event.time = absl::FromUnixNanos(proto.time_ns());
  event.kind = static_cast<Event::Kind>(proto.kind());
  event.worker_id = proto.worker_id();
  event.worker_name = proto.worker_name();
  event.job = proto.job();
  event.group = proto.group();
  event.epoch = proto.epoch();
  event.sequence = proto.sequence();
  event.ranks.assign(proto.ranks().begin(), proto.ranks().end());
  event.status = absl::Status(static_cast<absl::StatusCode>(proto.code()),
                              proto.message());
  event.reason = proto.reason();
  event.dropped = proto.dropped();
  event.text = proto.text();
  return event;
}

TraceEntry TraceFromProto(const v1::TraceEntry& proto) {
  TraceEntry entry;
  entry.record_id = proto.record_id();
  entry.epoch = proto.epoch();
  entry.sequence = proto.sequence();
  entry.spec = SpecFromProto(proto.spec());
  entry.state = StateOf(proto.state());
  entry.decided = TimeOf(proto.decided_ns());
  entry.plan = static_cast<Algorithm>(proto.plan());
  entry.ended = TimeOf(proto.ended_ns());
  entry.verdict = absl::Status(static_cast<absl::StatusCode>(proto.code()),
                               proto.message());
  for (const v1::TraceRank& rank : proto.ranks()) {
    entry.arrived.push_back(TimeOf(rank.called_ns()));
    entry.asked.push_back(rank.asked());
    entry.committed.push_back(TimeOf(rank.committed_ns()));
  }
  return entry;
}

}  // namespace

class AdminClient::Stub {
 public:
  using Call =
      std::function<grpc::Status(v1::Coordinator::Stub&, grpc::ClientContext&)>;

  explicit Stub(const std::string& coordinators) : target_(coordinators) {}

  // Runs `call` once, with a deadline of `timeout` (none when infinite), at
  // the coordinator calls go to now; `*to` names it. A TLS mismatch says
  // what to change.
  absl::Status Once(absl::Duration timeout, const Call& call, std::string* to) {
    *to = target_.address();
    std::unique_ptr<v1::Coordinator::Stub> stub =
        v1::Coordinator::NewStub(target_.channel());
    grpc::ClientContext context;
    if (timeout != absl::InfiniteDuration()) {
      context.set_deadline(DeadlineAfter(timeout));
    }
    return ExplainTlsMismatch(FromGrpcStatus(call(*stub, context)), *to,
                              Role::kCoordinator);
  }

  // Whether a call to `to` that ended with `status` may go again elsewhere
  // (CoordinatorTarget::Follow), and how many coordinators there are.
  bool Follow(const std::string& to, const absl::Status& status) {
    return target_.Follow(to, status);
  }
  size_t size() const { return target_.size(); }

  // Once(), again at the leader a standby names, or at the next
  // coordinator listed when one cannot be reached, trying each at most
  // once. Returns the last call's status.
  absl::Status Run(absl::Duration timeout, const Call& call) {
    absl::Status status;
    std::string to;
    for (size_t tries = 0; tries <= size(); ++tries) {
      status = Once(timeout, call, &to);
      if (!Follow(to, status)) break;
    }
    return status;
  }

 private:
  CoordinatorTarget target_;
};

std::unique_ptr<AdminClient> AdminClient::Connect(
    const std::string& coordinator, absl::Duration timeout) {
  return std::unique_ptr<AdminClient>(
      new AdminClient(std::make_unique<Stub>(coordinator), timeout));
}

AdminClient::AdminClient(std::unique_ptr<Stub> stub, absl::Duration timeout)
    : stub_(std::move(stub)), timeout_(timeout) {}

AdminClient::~AdminClient() = default;

absl::StatusOr<std::vector<WorkerInfo>> AdminClient::ListWorkers() const {
  v1::ListWorkersResponse response;
  absl::Status status = stub_->Run(
      timeout_, [&](v1::Coordinator::Stub& stub, grpc::ClientContext& context) {
        return stub.ListWorkers(&context, v1::ListWorkersRequest(), &response);
      });
  if (!status.ok()) return status;
  std::vector<WorkerInfo> workers;
  for (const v1::WorkerInfo& w : response.workers()) {
    workers.push_back(WorkerFromProto(w));
  }
  return workers;
}

absl::StatusOr<std::vector<GroupInfo>> AdminClient::ListGroups() const {
  v1::ListGroupsResponse response;
  absl::Status status = stub_->Run(
      timeout_, [&](v1::Coordinator::Stub& stub, grpc::ClientContext& context) {
        return stub.ListGroups(&context, v1::ListGroupsRequest(), &response);
      });
  if (!status.ok()) return status;
  std::vector<GroupInfo> groups;
  for (const v1::GroupInfo& g : response.groups()) {
    groups.push_back(GroupFromProto(g));
  }
  for (const v1::GroupInfo& g : response.forming()) {
    groups.push_back(GroupFromProto(g));
    groups.back().forming = true;
  }
  return groups;
}

absl::StatusOr<std::vector<TraceEntry>> AdminClient::Trace(
    const std::string& group, const std::string& job) const {
  v1::GetTraceRequest request;
  request.set_group(group);
  request.set_job(job);
  v1::GetTraceResponse response;
  absl::Status status = stub_->Run(
      timeout_, [&](v1::Coordinator::Stub& stub, grpc::ClientContext& context) {
        return stub.GetTrace(&context, request, &response);
      });
  if (!status.ok()) return status;
  std::vector<TraceEntry> entries;
  for (const v1::TraceEntry& e : response.entries()) {
    entries.push_back(TraceFromProto(e));
  }
  return entries;
}

absl::Status AdminClient::WatchEvents(
    const std::function<bool(const Event&)>& on_event,
    const WatchOptions& options) const {
  bool stopped = false;
  bool subscribed = false;
  bool got_event = false;
  auto watch = [&](v1::Coordinator::Stub& stub, grpc::ClientContext& context) {
    std::unique_ptr<grpc::ClientReader<v1::Event>> reader =
        stub.WatchEvents(&context, v1::WatchEventsRequest());
    // The coordinator sends its initial metadata once it has subscribed us.
    reader->WaitForInitialMetadata();
    if (!subscribed && options.on_subscribed) options.on_subscribed();
    subscribed = true;
    v1::Event message;
    while (!stopped && reader->Read(&message)) {
      got_event = true;
      stopped = !on_event(EventFromProto(message));
    }
    if (stopped) {
      context.TryCancel();
      while (reader->Read(&message)) {
      }
    }
    return reader->Finish();
  };
  absl::Status status;
  std::string to;
  // Only a refusal before any event (a standby's) moves to the leader.
  for (size_t tries = 0; tries <= stub_->size(); ++tries) {
    status = stub_->Once(options.timeout, watch, &to);
    if (stopped || got_event || !stub_->Follow(to, status)) break;
  }
  return stopped ? absl::OkStatus() : status;
}

}  // namespace chorus
