#include "server/worker/call_port_dial.h"

#include <glog/logging.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/call_frame.h"
#include "common/tcp_socket.h"
#include "common/transport_security.h"

namespace chorus {
namespace {

// Runs the client side of the TLS handshake on the connected socket `fd`
// until `deadline` (or `cancel_fd`). Returns the session, whose peer is the
// coordinator; UNAVAILABLE when the handshake fails or the connection
// closes, DEADLINE_EXCEEDED, CANCELLED.
absl::StatusOr<std::shared_ptr<TlsSession>> ClientHandshake(int fd,
                                                            absl::Time deadline,
                                                            int cancel_fd) {
  absl::StatusOr<std::unique_ptr<TlsSession>> session =
      TlsSession::Connect(Role::kCoordinator);
  if (!session.ok()) return session.status();
  // The port sends nothing before the client's hello, so no application
  // bytes arrive during the handshake.
  std::string plain;
  std::string to_send;
  absl::Status step = (*session)->Open("", &plain, &to_send);
  while (true) {
    if (!to_send.empty()) {
      const absl::string_view bytes = to_send;
      absl::Status sent = WriteAll(fd, &bytes, 1, deadline, cancel_fd);
      if (!sent.ok() && step.ok()) step = sent;
      to_send.clear();
    }
    if (!step.ok()) return step;
    if ((*session)->established())
      return std::shared_ptr<TlsSession>(*std::move(session));
    char buffer[16 << 10];
    absl::StatusOr<size_t> got =
        ReadSome(fd, buffer, sizeof(buffer), deadline, cancel_fd);
    if (!got.ok()) return got.status();
    step = (*session)->Open(absl::string_view(buffer, *got), &plain, &to_send);
  }
}

// Sends the hello on the new `connection` (sealed with its TLS session,
// if any) by `deadline`. Returns UNAVAILABLE when it cannot go out.
absl::Status Greet(const CallPortConnection& connection, absl::Time deadline,
                   int cancel_fd) {
  std::string hello(kCallHello);
  if (connection.tls != nullptr) {
    std::string sealed;
    if (absl::Status status = connection.tls->Seal(hello, &sealed);
        !status.ok()) {
      return status;
    }
    hello = std::move(sealed);
  }
  const absl::string_view greeting = hello;
  if (absl::Status sent =
          WriteAll(connection.fd, &greeting, 1, deadline, cancel_fd);
      !sent.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "cannot greet the coordinator's call port: ", sent.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CallPortConnection> DialCallPort(const std::string& address,
                                                absl::Time deadline,
                                                int cancel_fd) {
  absl::StatusOr<HostPort> target = SplitHostPort(address);
  if (!target.ok()) return target.status();
  // A coordinator that does not answer should not hold a caller (or
  // CallPortClient::Shutdown(), which waits for callers) for a whole call's
  // deadline.
  const absl::Time connect_by =
      std::min(deadline, absl::Now() + absl::Seconds(5));
  absl::StatusOr<int> connected =
      ConnectTcp(target->host, target->port, connect_by);
  if (!connected.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot reach the coordinator's call port at ", address,
                     ": ", connected.status().message()));
  }
  CallPortConnection connection;
  connection.fd = *connected;
  if (TlsEnabled()) {
    absl::StatusOr<std::shared_ptr<TlsSession>> session =
        ClientHandshake(connection.fd, connect_by, cancel_fd);
    if (!session.ok()) {
      CloseSocket(connection.fd);
      LOG(WARNING) << "the coordinator's call port at " << address
                   << " refused TLS: " << session.status().message()
                   << "; calls go over gRPC";
      return absl::FailedPreconditionError(
          absl::StrCat("TLS with the coordinator's call port at ", address,
                       " failed: ", session.status().message()));
    }
    connection.tls = *std::move(session);
  }
  if (absl::Status greeted = Greet(connection, deadline, cancel_fd);
      !greeted.ok()) {
    CloseSocket(connection.fd);
    return greeted;
  }
  return connection;
}

}  // namespace chorus
