// Says what to change when a client and a server disagree about TLS. gRPC
// reports a plaintext client's connection to a server that wants mutual TLS
// as a bare "Socket closed", and a TLS client's connection to a plaintext
// server as "wrong version number"; ExplainTlsMismatch turns either into a
// status that names the party and the flag. For the first it asks the
// server itself: it sends a TLS ClientHello on a connection of its own and
// looks at the first bytes of the answer (a TLS record, or not).
//
// Stateless functions; thread-safe. A probe opens and closes one TCP
// connection and waits at most until its deadline.
#ifndef CHORUS_COMMON_TLS_MISMATCH_H_
#define CHORUS_COMMON_TLS_MISMATCH_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/transport_security.h"

namespace chorus {

// Returns whether the server at `host`:`port` answers a TLS ClientHello
// with a TLS record (a ServerHello or an alert), waiting until `deadline`;
// false when it cannot be reached, closes the connection, answers
// something else, or says nothing in time.
bool ServerSpeaksTls(const std::string& host, int port, absl::Time deadline);

// Returns `status`, what a call of this process to the server at `target`
// ("host:port") that plays `server_role` ended with, unchanged unless it is
// UNAVAILABLE because one side uses TLS and the other does not. Then
// FAILED_PRECONDITION: "the coordinator at HOST:PORT uses mutual TLS and
// this process has no certificates: ..." (TLS is off here and the server
// answers a ClientHello, asked within a second), or "... does not use TLS
// ..." (TLS is on here and the handshake met plaintext), each naming the
// flag that fixes it. A "unix:" target is always plaintext: unchanged.
absl::Status ExplainTlsMismatch(const absl::Status& status,
                                const std::string& target, Role server_role);

}  // namespace chorus

#endif  // CHORUS_COMMON_TLS_MISMATCH_H_
