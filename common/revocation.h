// Certificate revocation (--tls_crl): the CA's certificate revocation list,
// read when TLS is turned on and again whenever the file changes (looked at
// every --tls_refresh), and the check every door makes with it. Authorize()
// (authorization.h) refuses a revoked certificate on every gRPC call, every
// call-port request, every HTTP request and at the data port, so a revoked
// identity's connections that are already open are refused at their next
// call or frame and closed; new connections are refused after their
// handshake, and a worker does not send to a peer whose certificate was
// revoked.
//
// Certificates are known by "ISSUER_HASH:SERIAL" (hex), which a CRL names.
//
// Lifecycle: EnableRevocation once (EnableTls calls it when TlsFiles has a
// CRL); it polls the file on its own thread for the life of the process.
// Thread safety: every function may be called from any thread.
#ifndef CHORUS_COMMON_REVOCATION_H_
#define CHORUS_COMMON_REVOCATION_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

typedef struct x509_st X509;

namespace chorus {

// Starts refusing the certificates the CRL file at `crl_path` lists (PEM,
// one or more CRLs, each signed by a CA of the PEM bundle `ca_path`), and
// re-reads it every `refresh` when it changed; a changed file that does not
// parse or verify is logged and the list in use is kept. Returns
// INVALID_ARGUMENT naming the file when it holds no CRL, does not parse, or
// holds a CRL no CA of `ca_path` signed; FAILED_PRECONDITION when it
// already succeeded.
absl::Status EnableRevocation(const std::string& crl_path,
                              const std::string& ca_path,
                              absl::Duration refresh);

// Returns whether EnableRevocation succeeded.
bool RevocationEnabled();

// Returns the id of `cert`: "ISSUER_HASH:SERIAL".
std::string CertificateId(X509* cert);

// Returns the id of the PEM certificate `pem`; empty when it does not parse.
// Remembers the ids of the certificates it saw (gRPC hands over PEM on
// every call).
std::string CertificateIdOfPem(absl::string_view pem);

// OK when revocation is off or the certificate `id` is not revoked;
// UNAUTHENTICATED "the certificate (serial ...) was revoked" otherwise.
absl::Status CheckNotRevoked(absl::string_view id);

// Counts the lists taken in (1 after EnableRevocation; 0 without); a
// connection checked at one count need not be checked again until it moves.
uint64_t RevocationGeneration();

// Reads the file now if it changed (what the polling thread does), for
// tests. Returns whether a new list was taken in.
bool ReloadRevocationsNow();

}  // namespace chorus

#endif  // CHORUS_COMMON_REVOCATION_H_
