// Dialing the coordinator's call port for CallPortClient
// (call_port_client.h): a new TCP connection to the port, the TLS handshake
// when TLS is on in the process (the port must present the coordinator's
// certificate), and the hello that opens the stream of call frames
// (common/call_frame.h).
//
// Stateless; thread-safe. The caller owns the connection it is given.
#ifndef CHORUS_SERVER_WORKER_CALL_PORT_DIAL_H_
#define CHORUS_SERVER_WORKER_CALL_PORT_DIAL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls_session.h"

namespace chorus {

// A connection to the call port that has said hello: calls may go out.
struct CallPortConnection {
  int fd = -1;  // owned: close with CloseSocket
  // The connection's TLS session; null without TLS.
  std::shared_ptr<TlsSession> tls;
};

// Connects to the call port at `address` ("host:port"), within 5 s and
// before `deadline`, and greets it; `cancel_fd` (an eventfd, or -1), once
// readable, ends the waits early. Returns the connection, or
// FAILED_PRECONDITION when the port cannot be reached or its TLS handshake
// fails (worth no new try for a while), INVALID_ARGUMENT for an address
// that does not parse, UNAVAILABLE when the hello cannot be sealed or
// written.
absl::StatusOr<CallPortConnection> DialCallPort(const std::string& address,
                                                absl::Time deadline,
                                                int cancel_fd);

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_CALL_PORT_DIAL_H_
