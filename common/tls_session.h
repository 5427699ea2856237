// TlsSession: mutual TLS (OpenSSL, TLS 1.3, the process's certificates as
// in tls_stream.h) for a connection whose bytes the caller moves itself:
// an event loop that reads a socket when epoll says so, or a client whose
// reads and writes run on different threads. Nothing here touches a socket.
// Bytes read from the socket go in with Open(), which runs the handshake and
// gives the application bytes they decrypt; application bytes go out with
// Seal(), which gives the records to write. What TLS itself needs written
// (the handshake) is handed out by Open(), or left for the next Seal(), so
// bytes reach the socket in the order TLS produced them.
//
// The accepting side requires a client certificate from the CA; the
// connecting side requires that the server's certificate names the role it
// dialed. Either way peer() then names who is at the other end.
//
// Lifecycle: made by Accept() or Connect() for one connection, used until it
// closes. Thread safety: every method may be called from any thread; a mutex
// keeps the records in order.
#ifndef CHORUS_COMMON_TLS_SESSION_H_
#define CHORUS_COMMON_TLS_SESSION_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/transport_security.h"

typedef struct ssl_st SSL;
typedef struct bio_st BIO;

namespace chorus {

class TlsSession {
 public:
  // A session for the server end of a connection just accepted. Returns
  // UNAVAILABLE when no TLS context can be built from the files;
  // FAILED_PRECONDITION when TLS is off.
  static absl::StatusOr<std::unique_ptr<TlsSession>> Accept();

  // A session for the client end of a new connection to a server whose
  // certificate must name `server_role`; its first handshake message is
  // ready in the output at once (take it with Open("", ...)). Codes as
  // Accept().
  static absl::StatusOr<std::unique_ptr<TlsSession>> Connect(Role server_role);

  ~TlsSession();
  TlsSession(const TlsSession&) = delete;
  TlsSession& operator=(const TlsSession&) = delete;

  // Takes `received` (bytes read from the socket, possibly none), advances
  // the handshake, and appends the application bytes they decrypt to
  // `plain` and what must be written to the socket to `to_send` (null
  // leaves that for the next Seal(), for a caller whose writes run
  // elsewhere: once the handshake is over TLS rarely has any). Returns
  // UNAVAILABLE when the handshake fails (no certificate, another CA's, an
  // expired one, one naming no Chorus identity or, on the connecting side,
  // not the role dialed), when a record does not decrypt, or when the peer
  // closed the session; the message says which. The session is unusable
  // after an error.
  absl::Status Open(absl::string_view received, std::string* plain,
                    std::string* to_send);

  // Encrypts `plain` and appends the records (after any handshake bytes
  // still due) to `to_send`. Returns FAILED_PRECONDITION before the
  // handshake finished, UNAVAILABLE after an error.
  absl::Status Seal(absl::string_view plain, std::string* to_send);

  // Whether the handshake finished and the peer was accepted.
  bool established() const;

  // The identity the peer's certificate names; nullopt before the
  // handshake finished.
  std::optional<Identity> peer() const;

 private:
  TlsSession(SSL* ssl, BIO* in, BIO* out) : ssl_(ssl), in_(in), out_(out) {}
  static absl::StatusOr<std::unique_ptr<TlsSession>> Make(bool server,
                                                          Role server_role);
  // Runs the handshake as far as the bytes received allow.
  absl::Status HandshakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends what TLS wants written to `to_send`.
  void TakeOutputLocked(std::string* to_send)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  SSL* const ssl_ ABSL_PT_GUARDED_BY(mu_);
  BIO* const in_ ABSL_PT_GUARDED_BY(mu_);   // owned by ssl_
  BIO* const out_ ABSL_PT_GUARDED_BY(mu_);  // owned by ssl_
  bool server_ = false;
  Role server_role_ = Role::kCoordinator;
  std::optional<Identity> peer_ ABSL_GUARDED_BY(mu_);
  // Set once the session failed; every later call returns it.
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace chorus

#endif  // CHORUS_COMMON_TLS_SESSION_H_
