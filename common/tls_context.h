// The OpenSSL side of Chorus's own TLS connections (the TCP data plane and
// the coordinator's call port; gRPC has its own): one context built from
// the process's TLS files (transport_security.h) and rebuilt when one of
// them changes (checked once per new connection), so renewed certificates
// apply to new connections without a restart. The context speaks TLS 1.3
// only, requires a peer certificate from the CA, and sends no session
// tickets.
//
// Thread safety: every function may be called from any thread.
#ifndef CHORUS_COMMON_TLS_CONTEXT_H_
#define CHORUS_COMMON_TLS_CONTEXT_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/transport_security.h"

typedef struct ssl_st SSL;

namespace chorus {

// Returns a new SSL on the current context (the caller frees it); null,
// with `why` saying so, when no context could be built from the files.
SSL* NewTlsConnection(std::string* why);

// Returns why the handshake on `ssl` failed: the peer certificate's
// verification error, else the newest OpenSSL error of this thread.
std::string TlsHandshakeError(SSL* ssl);

// Returns the newest OpenSSL error of this thread as text (and clears the
// queue); "the connection closed" when there is none.
std::string OpenSslError();

// Returns the chorus:// identity the certificate the peer of `ssl` presented
// names (after a handshake that verified it); UNAVAILABLE when it presented
// none or it names none.
absl::StatusOr<Identity> PeerIdentity(const SSL* ssl);

}  // namespace chorus

#endif  // CHORUS_COMMON_TLS_CONTEXT_H_
