// The one place where Chorus builds gRPC channels and servers, with the
// transport security transport_security.h configures (mutual TLS, or
// plaintext where none is configured).
//
// Functions are thread-safe. A started server runs until Shutdown() on it.
#ifndef CHORUS_COMMON_NET_H_
#define CHORUS_COMMON_NET_H_

#include <grpcpp/channel.h>
#include <grpcpp/server.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/transport_security.h"

namespace grpc {
class Service;
}  // namespace grpc

namespace chorus {

// Largest message a Chorus server or channel accepts by default.
inline constexpr int kDefaultMaxMessageBytes = 64 << 20;

// Returns a channel to `target` ("host:port", or "unix:PATH") that
// reconnects quickly after the peer restarts (reconnect backoff capped at one
// second) and replaces a connection that stopped carrying data (keepalive
// pings every 5 s; a ping or call unacknowledged for 2 s closes it), so calls
// after a network partition heals do not wait out TCP's retransmission
// backoff. With TLS on, the server must present a certificate of the CA that
// names `server_role`; a Unix socket target is always plaintext (the socket's
// file permissions guard it).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           Role server_role);

struct ServerOptions {
  // "host:port"; port 0 picks a free port. Served with TLS when it is on.
  std::string listen_address;
  // When set, also serve on this Unix domain socket (plaintext; only this
  // user may connect). Services tell the two apart with CallerOf.
  std::string unix_socket_path;
  // Services to serve; not owned, must outlive the server.
  std::vector<grpc::Service*> services;
  // Full names of the services ("chorus.v1.Coordinator") the health
  // service reports SERVING, besides "" (the whole server).
  std::vector<std::string> health_names;
  int max_message_bytes = kDefaultMaxMessageBytes;
};

struct StartedServer {
  std::unique_ptr<grpc::Server> server;
  // The port actually bound.
  int port = 0;
};

// Builds and starts a server, accepting MakeChannel's keepalive pings and
// closing a connection whose handshake (TLS and HTTP/2 preface) takes over
// 5 s, with the grpc.health.v1 health service (SERVING
// for "" and every name in options.health_names; NOT_FOUND for any other
// name) and server reflection. Returns UNAVAILABLE when an address cannot be
// bound.
absl::StatusOr<StartedServer> StartServer(const ServerOptions& options);

// Returns the deadline `timeout` from now, for a client context.
std::chrono::system_clock::time_point DeadlineAfter(absl::Duration timeout);

}  // namespace chorus

#endif  // CHORUS_COMMON_NET_H_
