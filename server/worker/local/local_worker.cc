#include "server/worker/local/local_worker.h"

#include <glog/logging.h>
#include <unistd.h>

#include <utility>

#include "chorus/v1/worker.grpc.pb.h"
#include "server/worker/local/call_socket.h"
#include "server/worker/local/local_api_service.h"

namespace chorus {

LocalWorker::LocalWorker(const LocalWorkerOptions& options)
    : options_(options),
      calls_(options.max_tensor_bytes, options.max_shared_bytes),
      grpc_door_(std::make_unique<LocalApiService>(&calls_)) {}

absl::StatusOr<std::unique_ptr<LocalWorker>> LocalWorker::Create(
    LocalWorkerOptions options) {
  std::unique_ptr<LocalWorker> worker(new LocalWorker(options));
  RuntimeOptions runtime = options.runtime;
  runtime.extra_services.push_back(worker->grpc_door_.get());
  runtime.extra_service_names.push_back(v1::WorkerLocal::service_full_name());
  const std::string socket = runtime.unix_socket_path;
  if (!socket.empty()) {
    absl::Status prepared = PrepareLocalSocket(socket);
    if (!prepared.ok()) return prepared;
  }
  absl::StatusOr<std::unique_ptr<WorkerRuntime>> created =
      WorkerRuntime::Create(std::move(runtime));
  if (!created.ok()) return created.status();
  worker->runtime_ = *std::move(created);
  if (!socket.empty()) {
    absl::Status restricted = RestrictLocalSocket(socket);
    if (!restricted.ok()) return restricted;
  }
  return worker;
}

absl::StatusOr<std::unique_ptr<LocalWorker>> LocalWorker::Start(
    LocalWorkerOptions options) {
  absl::StatusOr<std::unique_ptr<LocalWorker>> worker =
      Create(std::move(options));
  if (!worker.ok()) return worker.status();
  absl::Status registered = (*worker)->Register();
  if (!registered.ok()) return registered;
  return worker;
}

LocalWorker::~LocalWorker() { Shutdown(); }

absl::Status LocalWorker::Register() {
  absl::Status registered = runtime_->Register();
  if (!registered.ok()) return registered;
  const std::string& socket = options_.runtime.unix_socket_path;
  if (options_.call_socket && !socket.empty()) {
    absl::StatusOr<std::unique_ptr<LocalCallSocket>> started =
        LocalCallSocket::Start(CallSocketPath(socket), &calls_,
                               options_.max_frame_bytes, options_.runtime.spin);
    if (started.ok()) {
      call_socket_ = *std::move(started);
      calls_.SetCallSocket(call_socket_->path());
      LOG(INFO) << "collective frames on unix:" << call_socket_->path();
    } else {
      // Clients fall back to gRPC calls: slower for small calls, no less.
      LOG(WARNING) << "no call socket: " << started.status();
    }
  }
  calls_.Bind(runtime_.get());
  return absl::OkStatus();
}

std::string LocalWorker::call_socket_path() const {
  return call_socket_ == nullptr ? std::string() : call_socket_->path();
}

void LocalWorker::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  // Holds that end now end with the worker, not with their clients.
  calls_.BeginShutdown();
  if (call_socket_ != nullptr) call_socket_->Shutdown();
  if (runtime_ != nullptr) runtime_->Shutdown();
  calls_.Drain();
  const std::string& socket = options_.runtime.unix_socket_path;
  if (runtime_ != nullptr && !socket.empty()) unlink(socket.c_str());
}

}  // namespace chorus
