#include "server/worker/local_api_service.h"

#include "absl/strings/str_cat.h"
#include "server/common/device_proto.h"
#include "server/common/grpc_status.h"

namespace chorus {
namespace {

// The time a call from `context` may take: the client's deadline, or ten
// minutes when it set none.
absl::Duration TimeLeft(const grpc::CallbackServerContext& context) {
  const auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) {
    return absl::Minutes(10);
  }
  return absl::FromChrono(deadline) - absl::Now();
}

}  // namespace

void LocalApiService::Bind(WorkerRuntime* runtime) {
  absl::MutexLock lock(&mu_);
  runtime_ = runtime;
}

WorkerRuntime* LocalApiService::runtime() const {
  absl::MutexLock lock(&mu_);
  return runtime_;
}

grpc::ServerUnaryReactor* LocalApiService::JoinGroup(
    grpc::CallbackServerContext* context, const v1::LocalJoinRequest* request,
    v1::LocalJoinResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  WorkerRuntime* runtime = this->runtime();
  if (runtime == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "this worker is not registered yet"));
    return reactor;
  }
  Device device;
  device.kind = DeviceKind::kCpu;
  if (request->has_device()) device = DeviceFromProto(request->device());
  const absl::Duration timeout = TimeLeft(*context);
  tasks_.Spawn([this, runtime, reactor, request, response, device, timeout] {
    absl::StatusOr<Membership> membership =
        runtime->Join(request->group(), request->world_size(), request->rank(),
                      device, timeout);
    if (membership.ok()) {
      response->set_epoch(membership->epoch);
      response->set_world_size(membership->world_size);
      for (const Device& d : membership->devices) {
        response->add_member_devices(CanonicalName(d));
      }
      absl::MutexLock lock(&mu_);
      memberships_[{request->group(), request->rank()}] = *membership;
    }
    reactor->Finish(ToGrpcStatus(membership.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* LocalApiService::Collective(
    grpc::CallbackServerContext* context,
    const v1::LocalCollectiveRequest* request,
    v1::LocalCollectiveResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  WorkerRuntime* runtime = this->runtime();
  Membership membership;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    auto it = memberships_.find({request->group(), request->rank()});
    if (runtime == nullptr) {
      status = absl::UnavailableError("this worker is not registered yet");
    } else if (it == memberships_.end()) {
      status = absl::FailedPreconditionError(
          absl::StrCat("this worker has not joined group ", request->group(),
                       " as rank ", request->rank(), "; join first"));
    } else if (it->second.epoch != request->epoch()) {
      status = absl::FailedPreconditionError(absl::StrCat(
          "stale epoch ", request->epoch(), " for group ", request->group(),
          "; this worker joined it at epoch ", it->second.epoch));
    } else {
      membership = it->second;
    }
  }
  if (!status.ok()) {
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  CollectiveSpec spec;
  spec.kind = static_cast<CollectiveKind>(request->kind());
  spec.dtype = static_cast<DType>(request->dtype());
  spec.count = request->count();
  spec.op = static_cast<ReduceOp>(request->op());
  spec.root = request->root();
  RunOptions options;
  options.algorithm = static_cast<Algorithm>(request->algorithm());
  options.timeout = TimeLeft(*context);
  if (request->has_device())
    options.device = DeviceFromProto(request->device());
  tasks_.Spawn(
      [runtime, reactor, request, response, membership, spec, options] {
        absl::StatusOr<RunResult> result =
            runtime->Run(membership, request->sequence(), spec, request->data(),
                         response->mutable_data(), options);
        if (result.ok()) {
          response->set_sequence(result->sequence);
          response->mutable_plan()->set_algorithm(
              static_cast<v1::Algorithm>(result->algorithm));
          response->mutable_plan()->set_chunk_bytes(result->chunk_bytes);
        }
        reactor->Finish(ToGrpcStatus(result.status()));
      });
  return reactor;
}

}  // namespace chorus
