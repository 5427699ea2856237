#include "server/coordinator/coordinator_service.h"

#include <glog/logging.h>

#include <string>

#include "absl/strings/str_join.h"
#include "server/common/device_proto.h"
#include "server/common/grpc_status.h"

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

}  // namespace

CoordinatorService::CoordinatorService(Registry* registry, Clock* clock)
    : registry_(registry), clock_(clock) {}

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
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(
    grpc::CallbackServerContext* context, const v1::HeartbeatRequest* request,
    v1::HeartbeatResponse* response) {
  absl::Status status =
      registry_->Renew(request->worker_id(), request->incarnation());
  response->set_lease_timeout_ms(
      absl::ToInt64Milliseconds(registry_->lease_timeout()));
  return Finish(context, status);
}

grpc::ServerUnaryReactor* CoordinatorService::Deregister(
    grpc::CallbackServerContext* context, const v1::DeregisterRequest* request,
    v1::DeregisterResponse* response) {
  absl::Status status =
      registry_->Deregister(request->worker_id(), request->incarnation());
  if (status.ok()) {
    LOG(INFO) << "deregistered worker " << request->worker_id();
  }
  return Finish(context, status);
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

}  // namespace chorus
