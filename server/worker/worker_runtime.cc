#include "server/worker/worker_runtime.h"

#include <glog/logging.h>

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/coordinator_target.h"
#include "common/net.h"
#include "common/tcp_socket.h"
#include "common/transport_security.h"
#include "server/worker/dataplane/tcp_peer_pool.h"
#include "server/worker/worker_address.h"

namespace chorus {

absl::StatusOr<std::unique_ptr<WorkerRuntime>> WorkerRuntime::Start(
    RuntimeOptions options) {
  absl::StatusOr<std::unique_ptr<WorkerRuntime>> runtime =
      Create(std::move(options));
  if (!runtime.ok()) return runtime.status();
  absl::Status registered = (*runtime)->Register();
  if (!registered.ok()) return registered;
  return runtime;
}

absl::Status WorkerRuntime::Register() { return session_->Start(); }

absl::StatusOr<std::unique_ptr<WorkerRuntime>> WorkerRuntime::Create(
    RuntimeOptions options) {
  std::unique_ptr<WorkerRuntime> runtime(new WorkerRuntime());
  const std::optional<std::vector<Device>> gpus =
      options.device_runtime != nullptr ? options.device_runtime->Gpus()
                                        : std::nullopt;
  const DiscoveredDevices discovered =
      gpus.has_value() ? DiscoverEmulated(*gpus) : DiscoverDevices();
  absl::StatusOr<std::vector<Device>> devices =
      SelectDevices(options.devices, discovered);
  if (!devices.ok()) return devices.status();
  runtime->devices_ = *std::move(devices);
  runtime->support_ = discovered.support;
  for (const auto& [index, why] : discovered.support.cuda_refused) {
    Device gpu;
    gpu.kind = DeviceKind::kCuda;
    gpu.index = index;
    LOG(WARNING) << UnsupportedDeviceError(gpu, why).message()
                 << "; not registering it";
  }
  runtime->inbox_.SetSpin(options.spin);
  absl::Status started = runtime->StartDataPlane(options);
  if (started.ok()) started = runtime->StartServing(options);
  if (!started.ok()) return started;
  std::string why;
  absl::StatusOr<std::string> address = ChoosePeerAddress(
      options.listen, options.advertise_address,
      CoordinatorTarget(options.coordinator).address(), runtime->port_, &why);
  if (!address.ok()) return address.status();
  runtime->address_ = *std::move(address);
  LOG(INFO) << "peers reach this worker at " << runtime->address_ << " (" << why
            << "); data plane on port " << runtime->tcp_listener_->port()
            << (TlsEnabled() ? " (TLS)" : "");
  runtime->StartSession(options, discovered.support.cuda_built);
  runtime->options_ = std::move(options);
  runtime->ResolveArrivals();
  return runtime;
}

absl::Status WorkerRuntime::StartDataPlane(const RuntimeOptions& options) {
  absl::StatusOr<HostPort> listen = SplitHostPort(options.listen);
  if (!listen.ok()) return listen.status();
  if (options.data_port < 0 || options.data_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("data port ", options.data_port, " is out of range"));
  }
  // With TLS the data plane's connections are TLS too (TlsStream).
  absl::StatusOr<std::unique_ptr<TcpListener>> tcp_listener =
      TcpListener::Start(listen->host, options.data_port, &inbox_, &peers_);
  if (!tcp_listener.ok()) return tcp_listener.status();
  tcp_listener_ = *std::move(tcp_listener);
  // A data connection that stops carrying data fails within the lease: by
  // then the coordinator has its verdict on the peer anyway.
  sender_ = std::make_unique<TcpPeerPool>([this] {
    return session_ != nullptr ? session_->lease() : absl::ZeroDuration();
  });
  DeviceRuntime* gpus = options.device_runtime != nullptr
                            ? options.device_runtime
                            : BuiltInDeviceRuntime();
  device_buffers_ = std::make_unique<DeviceBuffers>(gpus);
  nccl_calls_ = std::make_unique<NcclCalls>(gpus);
  return absl::OkStatus();
}

absl::Status WorkerRuntime::StartServing(const RuntimeOptions& options) {
  peer_service_ = std::make_unique<PeerService>(tcp_listener_->port());
  ServerOptions server_options;
  server_options.listen_address = options.listen;
  server_options.services = options.extra_services;
  server_options.services.push_back(peer_service_.get());
  server_options.health_names = options.extra_service_names;
  server_options.health_names.push_back(v1::Peer::service_full_name());
  server_options.unix_socket_path = options.unix_socket_path;
  absl::StatusOr<StartedServer> server = StartServer(server_options);
  if (!server.ok()) return server.status();
  server_ = std::move(server->server);
  port_ = server->port;
  return absl::OkStatus();
}

void WorkerRuntime::StartSession(const RuntimeOptions& options,
                                 bool cuda_built) {
  SessionOptions session;
  session.coordinator = options.coordinator;
  session.address = address_;
  session.data_port = static_cast<uint32_t>(tcp_listener_->port());
  session.host = Hostname();
  session.machine = MachineIdentity();
  session.name = options.name.empty() ? address_ : options.name;
  name_ = session.name;
  session.devices = devices_;
  session.cuda_support = cuda_built;
  // NCCL runs on the GPUs this worker offers.
  const bool gpus =
      std::any_of(devices_.begin(), devices_.end(),
                  [](const Device& d) { return d.kind == DeviceKind::kCuda; });
  session.nccl_version =
      gpus ? static_cast<uint32_t>(nccl_calls_->version()) : 0;
  session.rpc_timeout = options.rpc_timeout;
  session.register_timeout = options.register_timeout;
  session.on_group_aborted = [this](const std::string& group, uint64_t epoch,
                                    const absl::Status& status) {
    LOG(WARNING) << status.ToString(absl::StatusToStringMode::kWithNoExtraData);
    AbortLocally(group, epoch, status);
  };
  session.on_forgotten = [this](const absl::Status& why) {
    inbox_.AbortAllSeen(why);
  };
  session.on_kept = [this] { ResendRunningCalls(); };
  session.withdrawn = [this] { return device_buffers_->WithdrawnDevices(); };
  session_ = std::make_unique<CoordinatorSession>(session);
  if (!options.call_port) return;
  CoordinatorSession* session_ptr = session_.get();
  call_port_ = std::make_unique<CallPortClient>(
      [session_ptr]() {
        // The port of the coordinator the worker registered with last.
        const int port = session_ptr->call_port();
        const absl::StatusOr<HostPort> host =
            SplitHostPort(session_ptr->coordinator());
        if (port <= 0 || !host.ok()) return std::string();
        return absl::StrCat(host->host.find(':') == std::string::npos
                                ? host->host
                                : absl::StrCat("[", host->host, "]"),
                            ":", port);
      },
      options.coordinator, options.spin);
}

WorkerRuntime::~WorkerRuntime() { Shutdown(); }

void WorkerRuntime::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  closing_.store(true);
  // Calls waiting on peers end now rather than at their deadlines.
  inbox_.AbortAllSeen(absl::UnavailableError("this worker is shutting down"));
  if (call_port_ != nullptr) call_port_->Shutdown();
  if (session_ != nullptr) session_->Shutdown();
  // The deregistration ended this worker's joins at the coordinator; any
  // still waiting end here, before the services they answer through stop.
  if (session_ != nullptr) {
    CloseJoins();
    CloseRuns();
  }
  if (sender_ != nullptr) sender_->Shutdown();
  if (server_ != nullptr) server_->Shutdown(DeadlineAfter(absl::Seconds(2)));
  if (tcp_listener_ != nullptr) tcp_listener_->Shutdown();
}

void WorkerRuntime::RankEnded(const Membership& membership) {
  nccl_calls_->Forget(membership.group, membership.epoch, membership.rank);
  same_host_bindings_.Drop(membership.group, membership.epoch, membership.rank);
  repeat_asks_.Drop(membership.group, membership.epoch, membership.rank);
}

void WorkerRuntime::AbortLocally(const std::string& group, uint64_t epoch,
                                 const absl::Status& verdict) {
  inbox_.Abort(group, epoch, verdict);
  sender_->AbortGroup(group, epoch);
  nccl_calls_->Forget(group, epoch);
  same_host_bindings_.Drop(group, epoch);
  repeat_asks_.Drop(group, epoch);
}

}  // namespace chorus
