// The one place where Chorus builds gRPC channels and servers, so transport
// security and authentication can be added here without touching call sites.
//
// Functions are thread-safe. A started server runs until Shutdown() on it.
#ifndef CHORUS_SERVER_COMMON_NET_H_
#define CHORUS_SERVER_COMMON_NET_H_

#include <grpcpp/channel.h>
#include <grpcpp/server.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace grpc {
class Service;
}  // namespace grpc

namespace chorus {

// Largest message a Chorus server or channel accepts by default.
inline constexpr int kDefaultMaxMessageBytes = 64 << 20;

// Returns a channel to `target` ("host:port") that reconnects quickly after
// the peer restarts (reconnect backoff capped at one second).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target);

struct ServerOptions {
  // "host:port"; port 0 picks a free port.
  std::string listen_address;
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

// Builds and starts a server with the grpc.health.v1 health service (SERVING
// for "" and every name in options.health_names; NOT_FOUND for any other
// name) and server reflection. Returns UNAVAILABLE when the address cannot be
// bound.
absl::StatusOr<StartedServer> StartServer(const ServerOptions& options);

// Returns the deadline `timeout` from now, for a client context.
std::chrono::system_clock::time_point DeadlineAfter(absl::Duration timeout);

}  // namespace chorus

#endif  // CHORUS_SERVER_COMMON_NET_H_
