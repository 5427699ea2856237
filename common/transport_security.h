// Transport security of the process: whether Chorus's gRPC channels and
// servers speak mutual TLS, with which files, and who is at the other end.
//
// Lifecycle: a daemon or tool calls EnableTls once at startup, before it makes
// its first channel or server (MakeChannel and StartServer in net.h read it);
// without that call everything is plaintext, as on loopback. Certificates are
// read by gRPC's file watcher and reloaded when their files change, without a
// restart.
//
// Identities are URI subject alternative names of the certificates:
// chorus://coordinator, chorus://worker/NAME, chorus://admin/NAME and
// chorus://client/NAME (scripts/dev_certs.sh makes them). Workers and clients
// of a job other than the default one carry it:
// chorus://job/JOB/worker/NAME, chorus://job/JOB/client/NAME; a job's groups
// and workers are its own (README, Security). A channel accepts a
// server only with a certificate from the configured CA that names the role it
// dialed; a server accepts a client only with a certificate from that CA, and
// the services check the caller's role and name per call (CallerOf).
//
// Thread safety: EnableTls must finish before other threads use this file;
// everything else is safe to call from any thread.
#ifndef CHORUS_COMMON_TRANSPORT_SECURITY_H_
#define CHORUS_COMMON_TRANSPORT_SECURITY_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace grpc {
class AuthContext;
class ChannelCredentials;
class ServerCredentials;
class ServerContextBase;
}  // namespace grpc

namespace chorus {

// The part a process plays, as its certificate names it.
enum class Role { kCoordinator, kWorker, kAdmin, kClient };

// Returns "coordinator", "worker", "admin" or "client".
absl::string_view RoleName(Role role);

// Returns the role's name with its article: "a worker", "an admin".
std::string RoleWithArticle(Role role);

// Who a certificate names.
struct Identity {
  Role role = Role::kClient;
  // The worker's, admin's or client's name; empty for the coordinator.
  std::string name;
  // The job a worker or client belongs to; empty for the default job (and
  // for the coordinator and admins, which serve every job).
  std::string job;
  // Which certificate proved it, as the revocation list knows certificates
  // (revocation.h); empty where none was looked at.
  std::string certificate_id;

  // Returns the identity's URI, e.g. "chorus://worker/w0" or
  // "chorus://job/train/client/c0".
  std::string Uri() const;
};

// Parses "chorus://coordinator", "chorus://worker/NAME", "chorus://admin/NAME",
// "chorus://client/NAME", "chorus://job/JOB/worker/NAME" or
// "chorus://job/JOB/client/NAME" (names and jobs: letters, digits, '.', '_'
// and '-'). INVALID_ARGUMENT for anything else.
absl::StatusOr<Identity> ParseIdentityUri(absl::string_view uri);

struct TlsFiles {
  std::string ca_path;    // PEM certificates of the CA peers must chain to
  std::string cert_path;  // PEM certificate chain of this process
  std::string key_path;   // PEM private key of cert_path
  // PEM certificate revocation list of the CA (revocation.h); empty: none.
  std::string crl_path;
  // How often gRPC re-reads the files for changes (and the CRL is looked at).
  absl::Duration refresh_interval = absl::Seconds(10);
};

// Returns DIR/ca.pem, DIR/cert.pem and DIR/key.pem.
TlsFiles TlsFilesInDir(const std::string& dir);

// Turns on mutual TLS with `files` for every channel and server made after
// it, after checking that the files parse, that the key matches the
// certificate, that the certificate chains to the CA and is valid now, and
// that it names exactly one Chorus identity. Returns that identity, or
// INVALID_ARGUMENT naming the file and what is wrong with it;
// FAILED_PRECONDITION when TLS is already on.
absl::StatusOr<Identity> EnableTls(const TlsFiles& files);

// Returns whether EnableTls succeeded in this process.
bool TlsEnabled();

// Returns this process's identity; only meaningful when TlsEnabled().
const Identity& OwnIdentity();

// Returns the files EnableTls was given; only meaningful when TlsEnabled().
const TlsFiles& ActiveTlsFiles();

// Returns credentials for a channel to a server that must present a
// certificate naming `server_role`; insecure credentials without TLS.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(
    Role server_role);

// Returns credentials for a server that requires and verifies client
// certificates; insecure credentials without TLS.
std::shared_ptr<grpc::ServerCredentials> ServerCredentials();

// Who made a call.
struct Caller {
  // False on a plaintext connection (no TLS in this process, or a Unix
  // socket); then `identity` is meaningless.
  bool authenticated = false;
  Identity identity;
  // True when the call came over a Unix domain socket.
  bool unix_socket = false;
  // With TLS off, true when it came over TCP from a loopback address.
  bool loopback = false;
};

// Returns the caller of the call of `context`. UNAUTHENTICATED when TLS is
// on, the call came over TCP, and the client's certificate names no Chorus
// identity.
absl::StatusOr<Caller> CallerOf(const grpc::ServerContextBase& context);

// With TLS on, returns the identity of the caller when the authorization
// table (authorization.h) lets its certificate's role use `entry` (a
// method's "chorus.v1.Service/Method"); PERMISSION_DENIED naming the caller
// and what the entry needs otherwise (also for an unauthenticated caller),
// UNAUTHENTICATED as CallerOf. FAILED_PRECONDITION with TLS off.
absl::StatusOr<Identity> RequireIdentity(const grpc::ServerContextBase& context,
                                         absl::string_view entry);

// RequireIdentity's status, and OK with TLS off (anyone may call).
absl::Status RequireRole(const grpc::ServerContextBase& context,
                         absl::string_view entry);

// The rule that keeps Chorus secure by default: a daemon may serve a
// non-loopback `host` in plaintext only when `insecure` was asked for
// explicitly. Returns OK for loopback hosts, for any host with TLS on, and
// with `insecure` (logging a warning once); FAILED_PRECONDITION saying how to
// turn TLS on otherwise. `what` names the listener ("--listen").
absl::Status CheckPlaintextListen(absl::string_view what,
                                  const std::string& host, bool insecure);

}  // namespace chorus

#endif  // CHORUS_COMMON_TRANSPORT_SECURITY_H_
