#include "common/net.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace chorus {
namespace {

// A connection whose data (a call, or the keepalive ping sent every
// kKeepaliveTime) stays unacknowledged for kKeepaliveTimeout is closed and
// reopened: gRPC sets TCP_USER_TIMEOUT to it and closes on an unanswered
// ping. Without it, a call sent into a network partition sits in TCP's
// retransmission backoff after the partition heals, and so does every later
// call on that connection, for seconds after a fresh connection would work.
constexpr int kKeepaliveTimeMs = 5000;
constexpr int kKeepaliveTimeoutMs = 2000;
// How long a server gives a new connection to finish its handshake.
constexpr int kServerHandshakeTimeoutMs = 5000;

}  // namespace

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           Role server_role) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetMaxReceiveMessageSize(kDefaultMaxMessageBytes);
  args.SetMaxSendMessageSize(kDefaultMaxMessageBytes);
  return grpc::CreateCustomChannel(target,
                                   absl::StartsWith(target, "unix:")
                                       ? grpc::InsecureChannelCredentials()
                                       : ChannelCredentialsFor(server_role),
                                   args);
}

absl::StatusOr<StartedServer> StartServer(const ServerOptions& options) {
  static const bool kInitOnce = [] {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    return true;
  }();
  (void)kInitOnce;

  StartedServer started;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen_address, ServerCredentials(),
                           &started.port);
  int unix_bound = 0;
  if (!options.unix_socket_path.empty()) {
    builder.AddListeningPort(absl::StrCat("unix:", options.unix_socket_path),
                             grpc::InsecureServerCredentials(), &unix_bound);
  }
  // Chorus channels ping every kKeepaliveTime, idle or not; the default
  // policy would answer that with GOAWAY (too_many_pings).
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
      kKeepaliveTimeMs / 2);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // A connection must finish its TLS handshake and HTTP/2 preface within
  // this (gRPC's default is 120 s), so clients that connect and stall hold
  // nothing for long.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             kServerHandshakeTimeoutMs);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  for (grpc::Service* service : options.services) {
    builder.RegisterService(service);
  }
  started.server = builder.BuildAndStart();
  if (started.server == nullptr || started.port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen_address));
  }
  if (!options.unix_socket_path.empty() && unix_bound == 0) {
    started.server->Shutdown();
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on the Unix socket ", options.unix_socket_path));
  }
  if (grpc::HealthCheckServiceInterface* health =
          started.server->GetHealthCheckService();
      health != nullptr) {
    for (const std::string& name : options.health_names) {
      health->SetServingStatus(name, true);
    }
  }
  return started;
}

std::chrono::system_clock::time_point DeadlineAfter(absl::Duration timeout) {
  return absl::ToChronoTime(absl::Now() + timeout);
}

}  // namespace chorus
