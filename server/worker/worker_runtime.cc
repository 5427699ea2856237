#include "server/worker/worker_runtime.h"

#include <glog/logging.h>
#include <grpcpp/client_context.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "server/common/answer_margin.h"
#include "server/common/collective_metrics.h"
#include "server/common/collective_spec_proto.h"
#include "server/common/device_proto.h"
#include "server/common/grpc_status.h"
#include "server/common/status_detail.h"
#include "server/common/tcp_socket.h"
#include "server/worker/algorithms/algorithm.h"
#include "server/worker/coordinator_status.h"
#include "server/worker/dataplane/peer_transport.h"
#include "server/worker/dataplane/tcp_peer_pool.h"

namespace chorus {
namespace {

std::string Hostname() {
  char buffer[256] = {};
  if (gethostname(buffer, sizeof(buffer) - 1) != 0) return "localhost";
  return buffer;
}

// This machine's id and this process's network namespace,
// "<machine id>/net:[<inode>]"; "" when either cannot be read. Two workers
// with the same value share the machine's memory and its loopback.
std::string MachineIdentity() {
  std::string id;
  for (const char* path : {"/etc/machine-id", "/var/lib/dbus/machine-id"}) {
    std::ifstream file(path);
    if (file && std::getline(file, id) && !id.empty()) break;
    id.clear();
  }
  char netns[64] = {};
  const ssize_t n = readlink("/proc/self/ns/net", netns, sizeof(netns) - 1);
  if (id.empty() || n <= 0) return "";
  return absl::StrCat(id, "/", absl::string_view(netns, n));
}

// "host:port", with brackets around an IPv6 host.
std::string JoinHostPort(const std::string& host, int port) {
  return host.find(':') == std::string::npos
             ? absl::StrCat(host, ":", port)
             : absl::StrCat("[", host, "]:", port);
}

// The address peers use when --advertise_address is not given, and why it
// was chosen (for the log):
// - the listen host, when the worker listens on one address;
// - listening on every interface with the coordinator on this machine
//   (a loopback address or a name for one): this machine's hostname, as
//   every peer on this machine resolves it alike;
// - listening on every interface with the coordinator elsewhere: the local
//   address of this host's route to the coordinator, the address the
//   coordinator and the peers on its network see this worker at. The
//   hostname is not used: it often resolves to a loopback address (Debian's
//   /etc/hosts maps it to 127.0.1.1), or to the same address on cloned
//   machines, and peers would then connect to themselves.
std::string AdvertisedAddress(const std::string& listen,
                              const std::string& coordinator, int port,
                              std::string* why) {
  const std::string host = listen.substr(0, listen.rfind(':'));
  if (!(host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::")) {
    *why = "the --listen host";
    return absl::StrCat(host, ":", port);
  }
  absl::StatusOr<HostPort> where = SplitHostPort(coordinator);
  if (!where.ok() || IsLoopbackHost(where->host)) {
    *why = "this machine's hostname; the coordinator is on this machine";
    return JoinHostPort(Hostname(), port);
  }
  absl::StatusOr<std::string> local =
      LocalAddressTowards(where->host, where->port);
  if (!local.ok()) {
    *why = absl::StrCat(
        "this machine's hostname: no local address towards the coordinator (",
        local.status().message(), "); set --advertise_address");
    return JoinHostPort(Hostname(), port);
  }
  *why = absl::StrCat("the local address of the route to the coordinator at ",
                      coordinator);
  return JoinHostPort(*local, port);
}

// The address peers use: `advertise` as given when it has a port, else its
// host with the bound port. INVALID_ARGUMENT for anything else.
absl::StatusOr<std::string> AdvertiseWithPort(const std::string& advertise,
                                              int port) {
  if (SplitHostPort(advertise).ok()) return advertise;
  const absl::Status bad = absl::InvalidArgumentError(absl::StrCat(
      "advertise address \"", advertise,
      "\" is neither host nor host:port with a port in [0, 65535]"));
  const size_t colons = std::count(advertise.begin(), advertise.end(), ':');
  // One colon is a host:port whose port is wrong; an unclosed bracket is
  // not an address.
  if (advertise.empty() || colons == 1 ||
      (advertise.front() == '[' && advertise.back() != ']')) {
    return bad;
  }
  // A bare IPv6 address takes brackets before its port.
  const std::string host = colons >= 2 && advertise.front() != '['
                               ? absl::StrCat("[", advertise, "]")
                               : advertise;
  const std::string with_port = absl::StrCat(host, ":", port);
  if (!SplitHostPort(with_port).ok()) return bad;
  return with_port;
}

// Refuses an advertised address peers could not use: a host that does not
// resolve or that this host has no route to; a loopback address while the
// coordinator (and so, presumably, the peers) is elsewhere; a non-loopback
// address while the worker listens on a loopback address only. An address
// that is not this host's own (a NAT's, a port mapping's) is allowed.
// `coordinator_remote`: the coordinator is not on a loopback address.
absl::Status CheckAdvertised(const std::string& advertised,
                             const std::string& listen_host,
                             const std::string& coordinator,
                             bool coordinator_remote) {
  absl::StatusOr<HostPort> where = SplitHostPort(advertised);
  if (!where.ok()) return where.status();
  const std::string prefix =
      absl::StrCat("advertise address \"", advertised, "\": ");
  absl::StatusOr<std::string> route =
      LocalAddressTowards(where->host, where->port);
  if (!route.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "peers could not reach it (", route.status().message(), ")"));
  }
  const bool loopback = IsLoopbackHost(where->host);
  if (loopback && coordinator_remote) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "a loopback address, while the coordinator at ", coordinator,
        " is on another host: peers there could not reach this worker"));
  }
  if (!loopback && IsLoopbackHost(listen_host)) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "not a loopback address, but this worker listens on ",
        listen_host, " only; set --listen to an address peers reach"));
  }
  return absl::OkStatus();
}

// The shortest time a failure report gets, even past the call's deadline.
constexpr absl::Duration kMinReportTime = absl::Milliseconds(50);

// "collective #<sequence> of group <group>", for messages.
std::string CallName(const Membership& membership, uint64_t sequence) {
  return absl::StrCat("collective #", sequence, " of group ", membership.group);
}

// Counts a call that started at `start` in the collective metrics
// (collective_metrics.h) and returns its result.
absl::StatusOr<RunResult> Counted(const CollectiveSpec& spec, absl::Time start,
                                  absl::StatusOr<RunResult> result) {
  RecordCollective(spec,
                   result.ok() ? result->algorithm : Algorithm::kUnspecified,
                   result.status().code(), absl::Now() - start);
  return result;
}

}  // namespace

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
  const DiscoveredDevices discovered = DiscoverDevices();
  absl::StatusOr<std::vector<Device>> devices =
      SelectDevices(options.devices, discovered);
  if (!devices.ok()) return devices.status();
  runtime->devices_ = *std::move(devices);
  runtime->support_ = discovered.support;

  absl::StatusOr<HostPort> listen = SplitHostPort(options.listen);
  if (!listen.ok()) return listen.status();
  if (options.data_port < 0 || options.data_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("data port ", options.data_port, " is out of range"));
  }
  // With TLS the data plane's connections are TLS too (TlsStream).
  absl::StatusOr<std::unique_ptr<TcpListener>> tcp_listener =
      TcpListener::Start(listen->host, options.data_port, &runtime->inbox_,
                         &runtime->peers_);
  if (!tcp_listener.ok()) return tcp_listener.status();
  runtime->tcp_listener_ = *std::move(tcp_listener);
  const int tcp_port = runtime->tcp_listener_->port();
  // A data connection that stops carrying data fails within the lease: by
  // then the coordinator has its verdict on the peer anyway.
  WorkerRuntime* self = runtime.get();
  runtime->sender_ = std::make_unique<TcpPeerPool>([self] {
    return self->session_ != nullptr ? self->session_->lease()
                                     : absl::ZeroDuration();
  });
  runtime->device_buffers_ = std::make_unique<DeviceBuffers>();
  runtime->peer_service_ = std::make_unique<PeerService>(tcp_port);
  ServerOptions server_options;
  server_options.listen_address = options.listen;
  server_options.services = options.extra_services;
  server_options.services.push_back(runtime->peer_service_.get());
  server_options.health_names = options.extra_service_names;
  server_options.health_names.push_back(v1::Peer::service_full_name());
  server_options.unix_socket_path = options.unix_socket_path;
  absl::StatusOr<StartedServer> server = StartServer(server_options);
  if (!server.ok()) return server.status();
  runtime->server_ = std::move(server->server);
  runtime->port_ = server->port;
  std::string why = "--advertise_address";
  absl::StatusOr<HostPort> coordinator_at = SplitHostPort(options.coordinator);
  const bool coordinator_remote =
      coordinator_at.ok() && !IsLoopbackHost(coordinator_at->host);
  if (options.advertise_address.empty()) {
    runtime->address_ = AdvertisedAddress(options.listen, options.coordinator,
                                          server->port, &why);
    if (coordinator_remote && IsLoopbackHost(listen->host)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "this worker listens on ", options.listen,
          ", a loopback address, but the coordinator at ", options.coordinator,
          " is on another host: peers there could not reach it. Listen on an "
          "address they reach (e.g. 0.0.0.0:0; without TLS that needs "
          "--insecure)"));
    }
  } else {
    absl::StatusOr<std::string> advertised =
        AdvertiseWithPort(options.advertise_address, server->port);
    if (!advertised.ok()) return advertised.status();
    absl::Status usable = CheckAdvertised(
        *advertised, listen->host, options.coordinator, coordinator_remote);
    if (!usable.ok()) return usable;
    runtime->address_ = *std::move(advertised);
  }
  LOG(INFO) << "peers reach this worker at " << runtime->address_ << " (" << why
            << "); data plane on port " << tcp_port
            << (TlsEnabled() ? " (TLS)" : "");

  SessionOptions session;
  session.coordinator = options.coordinator;
  session.address = runtime->address_;
  session.data_port = static_cast<uint32_t>(tcp_port);
  session.host = Hostname();
  session.machine = MachineIdentity();
  session.name = options.name.empty() ? runtime->address_ : options.name;
  runtime->name_ = session.name;
  session.devices = runtime->devices_;
  session.cuda_support = discovered.support.cuda_built;
  session.rpc_timeout = options.rpc_timeout;
  session.register_timeout = options.register_timeout;
  Inbox* inbox = &runtime->inbox_;
  session.on_group_aborted = [self](const std::string& group, uint64_t epoch,
                                    const absl::Status& status) {
    LOG(WARNING) << status.ToString(absl::StatusToStringMode::kWithNoExtraData);
    self->AbortLocally(group, epoch, status);
  };
  session.on_forgotten = [inbox](const absl::Status& why) {
    inbox->AbortAllSeen(why);
  };
  runtime->session_ = std::make_unique<CoordinatorSession>(session);
  runtime->coordinator_ = v1::Coordinator::NewStub(
      MakeChannel(options.coordinator, Role::kCoordinator));
  if (options.call_port) {
    CoordinatorSession* session_ptr = runtime->session_.get();
    runtime->call_port_ = std::make_unique<CallPortClient>(
        [session_ptr, host = SplitHostPort(options.coordinator)]() {
          const int port = session_ptr->call_port();
          if (port <= 0 || !host.ok()) return std::string();
          return absl::StrCat(host->host.find(':') == std::string::npos
                                  ? host->host
                                  : absl::StrCat("[", host->host, "]"),
                              ":", port);
        },
        options.coordinator);
  }
  runtime->options_ = std::move(options);
  return runtime;
}

WorkerRuntime::~WorkerRuntime() { Shutdown(); }

void WorkerRuntime::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  // Calls waiting on peers end now rather than at their deadlines.
  inbox_.AbortAllSeen(absl::UnavailableError("this worker is shutting down"));
  if (call_port_ != nullptr) call_port_->Shutdown();
  if (session_ != nullptr) session_->Shutdown();
  // The deregistration ended this worker's joins at the coordinator; any
  // still waiting end here, before the services they answer through stop.
  if (coordinator_ != nullptr) {
    CloseJoins();
    CloseRuns();
  }
  if (sender_ != nullptr) sender_->Shutdown();
  if (server_ != nullptr) server_->Shutdown(DeadlineAfter(absl::Seconds(2)));
  if (tcp_listener_ != nullptr) tcp_listener_->Shutdown();
}

struct WorkerRuntime::PendingJoin {
  v1::JoinGroupRequest request;
  v1::JoinGroupResponse response;
  // Guarded by the runtime's joins_mu_ (CloseJoins() cancels it).
  std::unique_ptr<grpc::ClientContext> context;
  Device device;
  absl::Time start;
  absl::Time deadline;
  int attempt = 0;
  std::function<void(absl::StatusOr<Membership>)> done;
};

absl::StatusOr<Membership> WorkerRuntime::Join(const std::string& group,
                                               int world_size, int rank,
                                               const Device& device,
                                               absl::Duration timeout) {
  absl::Notification joined;
  absl::StatusOr<Membership> result;
  JoinAsync(group, world_size, rank, device, timeout,
            [&](absl::StatusOr<Membership> membership) {
              result = std::move(membership);
              joined.Notify();
            });
  joined.WaitForNotification();
  return result;
}

void WorkerRuntime::JoinAsync(
    const std::string& group, int world_size, int rank, const Device& device,
    absl::Duration timeout,
    std::function<void(absl::StatusOr<Membership>)> done) {
  auto* join = new PendingJoin;
  v1::JoinGroupRequest& request = join->request;
  request.set_group(group);
  request.set_world_size(world_size);
  request.set_rank(rank);
  request.set_worker_id(session_->worker_id());
  *request.mutable_device() = DeviceToProto(device);
  absl::BitGen gen;
  request.set_request_id(absl::StrCat(absl::Hex(absl::Uniform<uint64_t>(gen)),
                                      absl::Hex(absl::Uniform<uint64_t>(gen))));
  join->device = device;
  join->start = absl::Now();
  join->deadline = join->start + timeout;
  join->done = std::move(done);
  {
    absl::MutexLock lock(&joins_mu_);
    joins_.insert(join);
  }
  SendJoin(join);
}

void WorkerRuntime::SendJoin(PendingJoin* join) {
  grpc::ClientContext* context = nullptr;
  {
    absl::MutexLock lock(&joins_mu_);
    if (!joins_closed_) {
      join->context = std::make_unique<grpc::ClientContext>();
      context = join->context.get();
      // The retry waits a little for the connection to come back.
      context->set_wait_for_ready(join->attempt > 0);
      context->set_deadline(absl::ToChronoTime(
          join->attempt == 0
              ? join->deadline
              : std::min(join->deadline, absl::Now() + options_.rpc_timeout)));
    }
  }
  if (context == nullptr) {
    EndJoin(join, absl::UnavailableError("this worker is shutting down"));
    return;
  }
  coordinator_->async()->JoinGroup(
      context, &join->request, &join->response,
      [this, join](grpc::Status answer) { OnJoinAnswered(join, answer); });
}

void WorkerRuntime::OnJoinAnswered(PendingJoin* join,
                                   const grpc::Status& answer) {
  const v1::JoinGroupRequest& request = join->request;
  absl::Status status =
      FromCoordinator(answer, options_.coordinator,
                      absl::StrCat("the join of group ", request.group(),
                                   " as rank ", request.rank()),
                      join->start);
  if (absl::IsUnavailable(status) && join->attempt == 0) {
    ++join->attempt;
    SendJoin(join);
    return;
  }
  if (status.ok()) {
    EndJoin(join, MembershipFromJoin(*join));
    return;
  }
  {
    absl::MutexLock lock(&joins_mu_);
    // CloseJoins() cancelled it.
    if (joins_closed_ && absl::IsCancelled(status)) {
      status = absl::UnavailableError(
          absl::StrCat("this worker is shutting down; the join of group ",
                       request.group(), " as rank ", request.rank(), " ended"));
    }
  }
  EndJoin(join, status);
}

absl::StatusOr<Membership> WorkerRuntime::MembershipFromJoin(
    const PendingJoin& join) {
  const v1::JoinGroupRequest& request = join.request;
  const v1::JoinGroupResponse& response = join.response;
  Membership membership;
  membership.group = request.group();
  membership.epoch = response.epoch();
  membership.rank = request.rank();
  membership.world_size = request.world_size();
  membership.device = join.device;
  membership.inline_max_bytes = response.inline_max_bytes();
  for (const v1::GroupMember& member : response.members()) {
    membership.addresses.push_back(member.address());
    membership.devices.push_back(DeviceFromProto(member.device()));
    membership.worker_names.push_back(member.worker_name());
    if (member.address() != address_) {
      PeerRegistration identity;
      identity.worker_id = member.worker_id();
      identity.incarnation = member.incarnation();
      identity.data_port = member.data_port();
      sender_->LearnPeer(member.address(), identity);
    }
  }
  if (static_cast<int>(membership.addresses.size()) != membership.world_size) {
    return absl::InternalError("the coordinator returned a partial group");
  }
  peers_.Learn(membership.group, membership.epoch, membership.worker_names);
  return membership;
}

void WorkerRuntime::EndJoin(PendingJoin* join,
                            absl::StatusOr<Membership> result) {
  join->done(std::move(result));
  {
    absl::MutexLock lock(&joins_mu_);
    joins_.erase(join);
  }
  delete join;
}

void WorkerRuntime::CloseJoins() {
  absl::MutexLock lock(&joins_mu_);
  joins_closed_ = true;
  for (PendingJoin* join : joins_) {
    if (join->context != nullptr) join->context->TryCancel();
  }
  joins_mu_.Await(absl::Condition(
      +[](absl::flat_hash_set<PendingJoin*>* joins) { return joins->empty(); },
      &joins_));
}

absl::StatusOr<RunResult> WorkerRuntime::Run(
    const Membership& membership, uint64_t sequence, const CollectiveSpec& spec,
    absl::string_view input, std::string* output, const RunOptions& options) {
  const absl::Time start = absl::Now();
  return Counted(spec, start,
                 RunCall(membership, sequence, spec,
                         HostBuffers(input, output, options), options));
}

WorkerRuntime::CallBuffers WorkerRuntime::HostBuffers(
    absl::string_view input, std::string* output, const RunOptions& options) {
  CallBuffers buffers;
  buffers.host_input = input;
  buffers.host_output = output;
  if (!options.output_place.empty()) {
    buffers.host_output_place = options.output_place.data();
  }
  return buffers;
}

bool WorkerRuntime::SendsWithoutWaiting() {
  // Without a call port the call goes as an asynchronous gRPC call.
  return call_port_ == nullptr || session_->call_port() <= 0 ||
         call_port_->Connected();
}

absl::Status WorkerRuntime::CheckDeviceMemory(const Membership& membership,
                                              const CollectiveSpec& spec,
                                              const Device& device,
                                              const void* input,
                                              const void* output) const {
  if (device.kind != DeviceKind::kCuda) {
    return absl::InvalidArgumentError(
        absl::StrCat("device buffers are for Cuda(n) devices, not ",
                     CanonicalName(device), "; pass host bytes to Run()"));
  }
  const bool registered =
      std::any_of(devices_.begin(), devices_.end(),
                  [&](const Device& d) { return SameDevice(d, device); });
  if (!registered) {
    return UnsupportedDeviceError(device, "this worker did not register it");
  }
  absl::Status valid = ValidateSpec(spec, membership.world_size);
  if (!valid.ok()) return valid;
  const uint64_t in_bytes = DeviceInputBytes(membership, spec, input);
  const uint64_t out_bytes =
      OutputBytes(spec, membership.world_size, membership.rank);
  valid = device_buffers_->CheckPointer(device.index, input, in_bytes,
                                        "input pointer");
  if (valid.ok()) {
    valid = device_buffers_->CheckPointer(device.index, output, out_bytes,
                                          "output pointer");
  }
  return valid;
}

uint64_t WorkerRuntime::DeviceInputBytes(const Membership& membership,
                                         const CollectiveSpec& spec,
                                         const void* input) {
  return input == nullptr && InputMayBeEmpty(spec, membership.rank)
             ? 0
             : InputBytes(spec, membership.world_size, membership.rank);
}

absl::StatusOr<RunResult> WorkerRuntime::RunOnDevice(
    const Membership& membership, uint64_t sequence, const CollectiveSpec& spec,
    const void* input, void* output, const RunOptions& options) {
  const Device device = options.device.value_or(membership.device);
  absl::Status valid =
      CheckDeviceMemory(membership, spec, device, input, output);
  if (!valid.ok()) return valid;
  CallBuffers buffers;
  buffers.device_input = input;
  buffers.device_output = output;
  buffers.on_device = true;
  // RunCall() checks sizes against the host input; a device input is
  // InputBytes long by construction, so a view of that length (never read)
  // stands for it.
  buffers.host_input =
      absl::string_view(static_cast<const char*>(input),
                        DeviceInputBytes(membership, spec, input));
  const absl::Time start = absl::Now();
  return Counted(spec, start,
                 RunCall(membership, sequence, spec, buffers, options));
}

absl::Status WorkerRuntime::PrepareCall(
    const Membership& membership, uint64_t sequence, const CollectiveSpec& spec,
    const CallBuffers& buffers, const RunOptions& options, PreparedCall* call) {
  const int world = membership.world_size;
  absl::Status valid =
      ValidateCall(spec, world, membership.rank, buffers.host_input.size(),
                   options.algorithm);
  if (!valid.ok()) return valid;
  // The rank answers by `deadline`; the coordinator ends its waits a margin
  // before that (CoreDeadline), and so do the rank's waits on its peers.
  call->start = absl::Now();
  call->deadline = call->start + options.timeout;
  call->device = options.device.value_or(membership.device);
  const bool carries = CarriesInlineData(spec, world, options.algorithm,
                                         membership.inline_max_bytes);
  // A device input that rides with the call comes to the host first.
  call->host_input = buffers.host_input;
  if (buffers.on_device && carries) {
    absl::Status copied = device_buffers_->CopyFromDevice(
        call->device.index, buffers.device_input, buffers.host_input.size(),
        &call->staged_input);
    // The call took its sequence number: the group must hear of it.
    if (!copied.ok()) {
      return ReportFailure(membership, sequence, copied, call->deadline);
    }
    call->host_input = call->staged_input;
  }

  v1::CollectiveRequest& request = call->request;
  request.set_group(membership.group);
  request.set_epoch(membership.epoch);
  request.set_rank(membership.rank);
  request.set_sequence(sequence);
  *request.mutable_spec() = SpecToProto(spec);
  request.set_algorithm(static_cast<v1::Algorithm>(options.algorithm));
  if (options.device.has_value()) {
    *request.mutable_device() = DeviceToProto(*options.device);
  }
  if (carries) {
    request.set_has_inline_data(true);
    request.set_inline_data(call->host_input.data(), call->host_input.size());
  }
  return absl::OkStatus();
}

absl::StatusOr<RunResult> WorkerRuntime::RunCall(const Membership& membership,
                                                 uint64_t sequence,
                                                 const CollectiveSpec& spec,
                                                 const CallBuffers& buffers,
                                                 const RunOptions& options) {
  PreparedCall call;
  absl::Status prepared =
      PrepareCall(membership, sequence, spec, buffers, options, &call);
  if (!prepared.ok()) return prepared;
  v1::CollectiveResponse response;
  if (CallPortReady(call.deadline)) {
    absl::StatusOr<v1::CollectiveResponse> answered =
        call_port_->Call(std::move(call.request), call.deadline);
    if (!answered.ok()) return answered.status();
    response = *std::move(answered);
  } else {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(call.deadline));
    absl::Status status = FromCoordinator(
        coordinator_->Collective(&context, call.request, &response),
        options_.coordinator, CallName(membership, sequence), call.start);
    if (!status.ok()) return status;
  }
  return FinishCall(membership, sequence, spec, buffers, call, response);
}

absl::StatusOr<RunResult> WorkerRuntime::FinishCall(
    const Membership& membership, uint64_t sequence, const CollectiveSpec& spec,
    const CallBuffers& buffers, const PreparedCall& call,
    v1::CollectiveResponse& response) {
  RunResult result = PlanOf(sequence, response);
  std::string staged_output;
  std::string* host_output =
      buffers.on_device ? &staged_output : buffers.host_output;
  absl::Status status;
  if (result.algorithm == Algorithm::kInline) {
    *host_output = std::move(*response.mutable_inline_result());
    // The others have their results already; only this rank's copy fails.
    if (buffers.on_device && !host_output->empty()) {
      status = device_buffers_->CopyToDevice(call.device.index, *host_output,
                                             buffers.device_output);
    }
  } else {
    v1::CommitRequest commit;
    status =
        RunPlanned(membership, sequence, spec, &result, call.device, buffers,
                   call.host_input, host_output, call.deadline, &commit);
    if (status.ok()) status = Commit(commit, call.deadline);
  }
  return EndCall(status, buffers, host_output, result);
}

RunResult WorkerRuntime::PlanOf(uint64_t sequence,
                                const v1::CollectiveResponse& response) {
  RunResult result;
  result.sequence = sequence;
  result.algorithm = static_cast<Algorithm>(response.plan().algorithm());
  result.chunk_bytes = response.plan().chunk_bytes();
  return result;
}

void WorkerRuntime::PlaceOutput(const CallBuffers& buffers,
                                std::string* host_output) {
  if (buffers.host_output_place != nullptr && !host_output->empty()) {
    // The plan wrote the string (only same_host writes the place itself).
    std::memcpy(buffers.host_output_place, host_output->data(),
                host_output->size());
    host_output->clear();
  }
}

absl::StatusOr<RunResult> WorkerRuntime::EndCall(const absl::Status& status,
                                                 const CallBuffers& buffers,
                                                 std::string* host_output,
                                                 const RunResult& result) {
  if (!status.ok()) {
    host_output->clear();
    return status;
  }
  PlaceOutput(buffers, host_output);
  return result;
}

struct WorkerRuntime::PendingRun {
  Membership membership;
  uint64_t sequence = 0;
  CollectiveSpec spec;
  CallBuffers buffers;
  PreparedCall call;
  // The gRPC call, when the call port is not used; guarded by the
  // runtime's runs_mu_ (CloseRuns() cancels it).
  std::unique_ptr<grpc::ClientContext> context;
  v1::CollectiveResponse response;
  std::function<void(absl::StatusOr<RunResult>)> done;
};

void WorkerRuntime::RunAsync(
    const Membership& membership, uint64_t sequence, const CollectiveSpec& spec,
    absl::string_view input, std::string* output, const RunOptions& options,
    std::function<void(absl::StatusOr<RunResult>)> done) {
  auto run = std::make_unique<PendingRun>();
  run->membership = membership;
  run->sequence = sequence;
  run->spec = spec;
  run->buffers = HostBuffers(input, output, options);
  run->done = std::move(done);
  const absl::Time start = absl::Now();
  absl::Status prepared = PrepareCall(run->membership, sequence, spec,
                                      run->buffers, options, &run->call);
  if (!prepared.ok()) {
    run->done(Counted(spec, start, prepared));
    return;
  }
  const absl::Time deadline = run->call.deadline;
  const bool call_port = CallPortReady(deadline);
  {
    absl::MutexLock lock(&runs_mu_);
    if (runs_closed_) {
      prepared = absl::UnavailableError("this worker is shutting down");
    } else {
      if (!call_port) {
        run->context = std::make_unique<grpc::ClientContext>();
        run->context->set_deadline(absl::ToChronoTime(deadline));
      }
      runs_.insert(run.get());
    }
  }
  if (!prepared.ok()) {
    run->done(Counted(spec, start, prepared));
    return;
  }
  PendingRun* raw = run.release();
  if (call_port) {
    call_port_->CallAsync(
        std::move(raw->call.request), deadline,
        [this, raw](absl::StatusOr<v1::CollectiveResponse> answered) {
          if (answered.ok()) raw->response = *std::move(answered);
          OnRunAnswered(raw, answered.status());
        });
    return;
  }
  coordinator_->async()->Collective(
      raw->context.get(), &raw->call.request, &raw->response,
      [this, raw](grpc::Status answer) {
        OnRunAnswered(raw,
                      FromCoordinator(answer, options_.coordinator,
                                      CallName(raw->membership, raw->sequence),
                                      raw->call.start));
      });
}

void WorkerRuntime::OnRunAnswered(PendingRun* run, absl::Status answer) {
  {
    absl::MutexLock lock(&runs_mu_);
    runs_.erase(run);
    // CloseRuns() cancelled it.
    if (runs_closed_ && absl::IsCancelled(answer)) {
      answer = absl::UnavailableError(
          absl::StrCat("this worker is shutting down; ",
                       CallName(run->membership, run->sequence), " ended"));
    }
  }
  if (!answer.ok()) {
    EndRun(run, answer);
    return;
  }
  if (run->response.plan().algorithm() == v1::ALGORITHM_INLINE) {
    EndRun(run, FinishCall(run->membership, run->sequence, run->spec,
                           run->buffers, run->call, run->response));
    return;
  }
  planned_runs_.Spawn([this, run] { RunPlannedAsync(run); });
}

void WorkerRuntime::RunPlannedAsync(PendingRun* run) {
  RunResult result = PlanOf(run->sequence, run->response);
  std::string* host_output = run->buffers.host_output;
  const absl::Time deadline = run->call.deadline;
  v1::CommitRequest commit;
  absl::Status status = RunPlanned(
      run->membership, run->sequence, run->spec, &result, run->call.device,
      run->buffers, run->call.host_input, host_output, deadline, &commit);
  if (status.ok() && CallPortReady(deadline)) {
    // The verdict ends the run on the call port's completion thread: the
    // rank's answer needs no hand-off back to this one.
    call_port_->CommitAsync(
        commit, deadline, [this, run, result](absl::Status verdict) {
          EndRun(run, EndCall(verdict, run->buffers, run->buffers.host_output,
                              result));
        });
    return;
  }
  if (status.ok()) status = Commit(commit, deadline);
  EndRun(run, EndCall(status, run->buffers, host_output, result));
}

void WorkerRuntime::EndRun(PendingRun* run, absl::StatusOr<RunResult> result) {
  run->done(Counted(run->spec, run->call.start, std::move(result)));
  delete run;
}

void WorkerRuntime::CloseRuns() {
  absl::MutexLock lock(&runs_mu_);
  runs_closed_ = true;
  for (PendingRun* run : runs_) {
    if (run->context != nullptr) run->context->TryCancel();
  }
  runs_mu_.Await(absl::Condition(
      +[](absl::flat_hash_set<PendingRun*>* runs) { return runs->empty(); },
      &runs_));
}

absl::Status WorkerRuntime::RunPlanned(
    const Membership& membership, uint64_t sequence, const CollectiveSpec& spec,
    RunResult* plan, const Device& device, const CallBuffers& buffers,
    absl::string_view host_input, std::string* host_output, absl::Time deadline,
    v1::CommitRequest* commit) {
  // Waits on peers end a margin before the rank must answer: time to
  // report the failure and hear the group's verdict (answer_margin.h).
  const absl::Duration left = deadline - absl::Now();
  PeerTransportOptions transport_options;
  transport_options.group = membership.group;
  transport_options.epoch = membership.epoch;
  transport_options.sequence = sequence;
  transport_options.rank = membership.rank;
  transport_options.addresses = membership.addresses;
  transport_options.self_address = address_;
  transport_options.worker_names = membership.worker_names;
  transport_options.deadline = deadline - AnswerMargin(left);
  PeerTransport transport(std::move(transport_options), &inbox_, sender_.get());
  AlgorithmArgs args;
  args.spec = spec;
  args.chunk_bytes = std::max<uint64_t>(1, plan->chunk_bytes);
  args.transport = &transport;
  args.output = host_output;
  args.output_place = buffers.host_output_place;
  // Kinds whose output every rank holds identically are checked at the
  // commit: each rank hashes its output as it writes it.
  std::optional<ResultHash> hash;
  if (options_.check_results && (spec.kind == CollectiveKind::kAllReduce ||
                                 spec.kind == CollectiveKind::kAllGather ||
                                 spec.kind == CollectiveKind::kBroadcast)) {
    hash.emplace(spec.dtype);
    args.hash = &*hash;
  }
  args.corrupt_for_testing = corrupt_results_for_testing_.load();

  // A Cuda(n) rank reduces on its GPU under the ring and recursive doubling.
  const bool on_gpu = device.kind == DeviceKind::kCuda &&
                      KindReduces(spec.kind) &&
                      (plan->algorithm == Algorithm::kRing ||
                       plan->algorithm == Algorithm::kRecursiveDoubling);
  std::unique_ptr<DeviceReduceBuffer> gpu;
  std::string staged_input;
  absl::Status status;
  // A reduction in a wider type than the spec's (f16/bf16 in f32, integer
  // avg in 64 bits) converts on the host: the GPU buffer holds the wide
  // accumulators that travel between ranks.
  const CollectiveSpec work_spec = WorkSpec(spec);
  const bool widens = on_gpu && work_spec.dtype != spec.dtype;
  std::string host_copy;
  if (widens) {
    if (buffers.on_device) {
      status = device_buffers_->CopyFromDevice(
          device.index, buffers.device_input, buffers.host_input.size(),
          &host_copy);
      host_input = host_copy;
    }
    if (status.ok()) {
      status =
          ConvertBytes(spec.dtype, work_spec.dtype, host_input, &staged_input);
    }
    absl::StatusOr<std::unique_ptr<DeviceReduceBuffer>> made =
        status.ok()
            ? device_buffers_->FromHost(device.index, work_spec, staged_input)
            : absl::StatusOr<std::unique_ptr<DeviceReduceBuffer>>(status);
    if (made.ok()) {
      gpu = *std::move(made);
      args.work = gpu.get();
    } else {
      status = made.status();
    }
  } else if (on_gpu) {
    absl::StatusOr<std::unique_ptr<DeviceReduceBuffer>> made =
        buffers.on_device
            ? device_buffers_->FromDevice(device.index, spec,
                                          buffers.device_input,
                                          buffers.host_input.size())
            : device_buffers_->FromHost(device.index, spec, host_input);
    if (made.ok()) {
      gpu = *std::move(made);
      args.work = gpu.get();
    } else {
      status = made.status();
    }
  } else if (buffers.on_device && host_input.data() == buffers.device_input) {
    // Byte-moving kinds and the same_host plan run on host bytes.
    status = device_buffers_->CopyFromDevice(device.index, buffers.device_input,
                                             buffers.host_input.size(),
                                             &staged_input);
    host_input = staged_input;
  }
  args.input = gpu != nullptr ? absl::string_view() : host_input;

  if (status.ok()) {
    switch (plan->algorithm) {
      case Algorithm::kRing:
        status = RunRing(args);
        break;
      case Algorithm::kRecursiveDoubling:
        status = RunRecursiveDoubling(args);
        break;
      case Algorithm::kSameHost:
        status = RunSameHost(args, &plan->algorithm);
        break;
      default:
        status = absl::InternalError(absl::StrCat(
            "the coordinator planned ", AlgorithmName(plan->algorithm),
            ", which this worker does not run"));
    }
  }
  // all_reduce leaves its result in the GPU buffer; other results of a
  // device call are on the host. Either reaches its place before the commit,
  // so a failed copy is reported like any data-plane failure.
  // (A widened all_reduce rounds its result into the host output.)
  if (status.ok() && gpu != nullptr &&
      spec.kind == CollectiveKind::kAllReduce && !widens) {
    status = buffers.on_device ? gpu->CopyToDevice(buffers.device_output)
                               : gpu->CopyToHost(host_output);
  } else if (status.ok() && buffers.on_device && !host_output->empty()) {
    status = device_buffers_->CopyToDevice(device.index, *host_output,
                                           buffers.device_output);
  }
  gpu.reset();
  if (!status.ok()) {
    return ReportFailure(membership, sequence, status, deadline);
  }
  // A hash that missed part of the output (recursive doubling on a GPU
  // buffer hashes nothing) is not sent: the call is then not checked.
  std::optional<uint64_t> result_hash;
  if (hash.has_value() &&
      hash->bytes() ==
          OutputBytes(spec, membership.world_size, membership.rank)) {
    result_hash = hash->value();
  }
  // The output is final: it reaches the caller's place before the verdict.
  PlaceOutput(buffers, host_output);
  commit->set_group(membership.group);
  commit->set_epoch(membership.epoch);
  commit->set_rank(membership.rank);
  commit->set_sequence(sequence);
  if (result_hash.has_value()) commit->set_result_hash(*result_hash);
  return absl::OkStatus();
}

absl::Status WorkerRuntime::ReportRankGone(const Membership& membership,
                                           const absl::Status& why) {
  // Sequence 0: no collective of it failed; the rank left.
  return ReportFailure(membership, /*sequence=*/0, why,
                       absl::Now() + options_.rpc_timeout);
}

void WorkerRuntime::AbortLocally(const std::string& group, uint64_t epoch,
                                 const absl::Status& verdict) {
  inbox_.Abort(group, epoch, verdict);
  sender_->AbortGroup(group, epoch);
}

bool WorkerRuntime::CallPortReady(absl::Time deadline) {
  // Not ready (no port, or it cannot be reached, e.g. firewalled): the
  // gRPC paths carry the call instead.
  return call_port_ != nullptr && session_->call_port() > 0 &&
         call_port_->Ready(deadline).ok();
}

absl::Status WorkerRuntime::Commit(const v1::CommitRequest& request,
                                   absl::Time deadline) {
  if (CallPortReady(deadline)) return call_port_->Commit(request, deadline);
  v1::CommitResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  const absl::Time start = absl::Now();
  return FromCoordinator(
      coordinator_->Commit(&context, request, &response), options_.coordinator,
      absl::StrCat("the commit of collective #", request.sequence(),
                   " of group ", request.group()),
      start);
}

absl::Status WorkerRuntime::ReportFailure(const Membership& membership,
                                          uint64_t sequence,
                                          const absl::Status& failure,
                                          absl::Time answer_by) {
  // The group's abort already reached this worker: that is the verdict.
  if (absl::Status aborted =
          inbox_.AbortStatus(membership.group, membership.epoch);
      !aborted.ok()) {
    return aborted;
  }
  v1::ReportFailureRequest request;
  request.set_group(membership.group);
  request.set_epoch(membership.epoch);
  request.set_rank(membership.rank);
  request.set_sequence(sequence);
  request.set_code(static_cast<int>(failure.code()));
  request.set_message(std::string(failure.message()));
  // The report is not a wait: the coordinator answers at once, unless it
  // is gone or paused; the rank's answer must not wait longer than its
  // call may.
  const absl::Time now = absl::Now();
  const absl::Time deadline = std::min(
      now + options_.rpc_timeout, std::max(answer_by, now + kMinReportTime));
  v1::ReportFailureResponse response;
  absl::Status reported;
  if (CallPortReady(deadline)) {
    absl::StatusOr<v1::ReportFailureResponse> answered =
        call_port_->ReportFailure(request, deadline);
    reported = answered.status();
    if (answered.ok()) response = *std::move(answered);
  } else {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    reported = FromCoordinator(
        coordinator_->ReportFailure(&context, request, &response),
        options_.coordinator, "the failure report", now);
  }
  if (!reported.ok()) {
    LOG(WARNING) << "could not report "
                 << failure.ToString(absl::StatusToStringMode::kWithNoExtraData)
                 << ": " << reported;
    // The rank's own account, and why the group's verdict is missing.
    return RewordedStatus(
        failure, failure.code(),
        absl::StrCat(failure.message(), "; ", reported.message()));
  }
  if (!response.has_abort()) return failure;
  const absl::Status verdict =
      StatusWithDetail(static_cast<absl::StatusCode>(response.abort().code()),
                       response.abort().message(), response.abort().detail());
  AbortLocally(membership.group, membership.epoch, verdict);
  return verdict;
}

}  // namespace chorus
