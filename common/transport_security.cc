#include "common/transport_security.h"

#include <arpa/inet.h>
#include <glog/logging.h>
#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/auth_context.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <grpcpp/server_context.h>
#include <netinet/in.h>

#include <algorithm>
#include <atomic>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/authorization.h"
#include "common/certificate_check.h"
#include "common/revocation.h"
#include "common/tcp_socket.h"

namespace chorus {
namespace {

constexpr absl::string_view kScheme = "chorus://";

struct TlsState {
  TlsFiles files;
  Identity identity;
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider;
};

// Written once by EnableTls before other threads look.
TlsState* tls_state = nullptr;

// Accepts a server whose certificate (already chained to the CA by gRPC)
// names `expected_`'s role.
class RoleVerifier : public grpc::experimental::ExternalCertificateVerifier {
 public:
  explicit RoleVerifier(Role expected) : expected_(expected) {}

  bool Verify(grpc::experimental::TlsCustomVerificationCheckRequest* request,
              std::function<void(grpc::Status)> callback,
              grpc::Status* sync_status) override {
    std::vector<std::string> names;
    for (const grpc::string_ref& uri : request->uri_names()) {
      names.emplace_back(uri.data(), uri.size());
      absl::StatusOr<Identity> identity = ParseIdentityUri(names.back());
      if (identity.ok() && identity->role == expected_) {
        const grpc::string_ref pem = request->peer_cert();
        const absl::Status kept = CheckNotRevoked(
            RevocationEnabled()
                ? CertificateIdOfPem(absl::string_view(pem.data(), pem.size()))
                : "");
        *sync_status =
            kept.ok()
                ? grpc::Status::OK
                : grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                               absl::StrCat("the server's ", kept.message()));
        return true;
      }
    }
    *sync_status = grpc::Status(
        grpc::StatusCode::UNAUTHENTICATED,
        absl::StrCat(
            "the server's certificate names ",
            names.empty() ? "no Chorus identity" : absl::StrJoin(names, ", "),
            ", not ", expected_ == Role::kAdmin ? "an " : "a ",
            RoleName(expected_)));
    return true;
  }

  void Cancel(grpc::experimental::TlsCustomVerificationCheckRequest*) override {
  }

 private:
  const Role expected_;
};

// Whether the numeric address `host` (as gRPC reports peers) is loopback:
// 127.0.0.0/8, ::1, or 127.0.0.0/8 mapped into IPv6.
bool IsLoopbackAddress(const std::string& host) {
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, host.c_str(), &v6) != 1) return false;
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

std::vector<std::string> PropertyValues(const grpc::AuthContext& auth,
                                        const char* name) {
  std::vector<std::string> values;
  for (const grpc::string_ref& value : auth.FindPropertyValues(name)) {
    values.emplace_back(value.data(), value.size());
  }
  return values;
}

}  // namespace

std::string RoleWithArticle(Role role) {
  return absl::StrCat(role == Role::kAdmin ? "an " : "a ", RoleName(role));
}

TlsFiles TlsFilesInDir(const std::string& dir) {
  TlsFiles files;
  files.ca_path = absl::StrCat(dir, "/ca.pem");
  files.cert_path = absl::StrCat(dir, "/cert.pem");
  files.key_path = absl::StrCat(dir, "/key.pem");
  return files;
}

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kCoordinator:
      return "coordinator";
    case Role::kWorker:
      return "worker";
    case Role::kAdmin:
      return "admin";
    case Role::kClient:
      return "client";
  }
  return "unknown";
}

std::string Identity::Uri() const {
  if (role == Role::kCoordinator) return absl::StrCat(kScheme, "coordinator");
  const std::string job_part =
      job.empty() ? "" : absl::StrCat("job/", job, "/");
  return absl::StrCat(kScheme, job_part, RoleName(role), "/", name);
}

namespace {

// Whether `s` is a name or job as identities spell them.
bool IsIdentityWord(absl::string_view s) {
  if (s.empty() || s.size() > 128) return false;
  for (char c : s) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' &&
        c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<Identity> ParseIdentityUri(absl::string_view uri) {
  absl::string_view rest = uri;
  if (!absl::ConsumePrefix(&rest, kScheme)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", uri, "' is not a chorus:// identity"));
  }
  if (rest == "coordinator") return Identity{Role::kCoordinator, "", ""};
  std::string job;
  if (absl::ConsumePrefix(&rest, "job/")) {
    const size_t slash = rest.find('/');
    if (slash != absl::string_view::npos &&
        IsIdentityWord(rest.substr(0, slash))) {
      job = std::string(rest.substr(0, slash));
      rest.remove_prefix(slash + 1);
    }
  }
  for (Role role : {Role::kWorker, Role::kAdmin, Role::kClient}) {
    absl::string_view name = rest;
    if (role == Role::kAdmin && !job.empty()) continue;
    if (absl::ConsumePrefix(&name, absl::StrCat(RoleName(role), "/")) &&
        IsIdentityWord(name)) {
      return Identity{role, std::string(name), job};
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "'", uri,
      "' is not chorus://coordinator, chorus://worker/NAME, "
      "chorus://admin/NAME, chorus://client/NAME, chorus://job/JOB/worker/NAME "
      "or chorus://job/JOB/client/NAME"));
}

absl::StatusOr<Identity> EnableTls(const TlsFiles& files) {
  if (tls_state != nullptr) {
    return absl::FailedPreconditionError("TLS is already on");
  }
  absl::StatusOr<std::vector<std::string>> uris =
      CheckCertificateFiles(files.ca_path, files.cert_path, files.key_path);
  if (!uris.ok()) return uris.status();
  std::vector<Identity> identities;
  for (const std::string& uri : *uris) {
    absl::StatusOr<Identity> identity = ParseIdentityUri(uri);
    if (identity.ok()) identities.push_back(*std::move(identity));
  }
  if (identities.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        files.cert_path, " must name exactly one chorus:// identity as a URI ",
        "subject alternative name (scripts/dev_certs.sh makes such "
        "certificates); it names ",
        uris->empty() ? "no URI" : absl::StrJoin(*uris, ", ")));
  }
  if (!files.crl_path.empty()) {
    if (absl::Status revocation = EnableRevocation(
            files.crl_path, files.ca_path, files.refresh_interval);
        !revocation.ok()) {
      return revocation;
    }
  }
  auto* state = new TlsState;
  state->files = files;
  state->identity = identities.front();
  const unsigned refresh = static_cast<unsigned>(
      std::max<int64_t>(1, absl::ToInt64Seconds(files.refresh_interval)));
  state->provider =
      std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
          files.key_path, files.cert_path, files.ca_path, refresh);
  tls_state = state;
  return state->identity;
}

bool TlsEnabled() { return tls_state != nullptr; }

const Identity& OwnIdentity() {
  static const Identity kNone;
  return tls_state != nullptr ? tls_state->identity : kNone;
}

const TlsFiles& ActiveTlsFiles() {
  static const TlsFiles kNone;
  return tls_state != nullptr ? tls_state->files : kNone;
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(
    Role server_role) {
  if (tls_state == nullptr) return grpc::InsecureChannelCredentials();
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(tls_state->provider);
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  // The identity, not the address dialed, is what a Chorus peer proves: the
  // verifier checks the role, the services check names.
  options.set_check_call_host(false);
  options.set_certificate_verifier(
      grpc::experimental::ExternalCertificateVerifier::Create<RoleVerifier>(
          server_role));
  return grpc::experimental::TlsCredentials(options);
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials() {
  if (tls_state == nullptr) return grpc::InsecureServerCredentials();
  grpc::experimental::TlsServerCredentialsOptions options(tls_state->provider);
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(options);
}

absl::StatusOr<Caller> CallerOf(const grpc::ServerContextBase& context) {
  Caller caller;
  const std::string peer = context.peer();
  caller.unix_socket = absl::StartsWith(peer, "unix:");
  absl::string_view address = peer;
  if (tls_state == nullptr && (absl::ConsumePrefix(&address, "ipv4:") ||
                               absl::ConsumePrefix(&address, "ipv6:"))) {
    absl::StatusOr<HostPort> split = SplitHostPort(std::string(address));
    caller.loopback = split.ok() && IsLoopbackAddress(split->host);
  }
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (tls_state == nullptr || caller.unix_socket || auth == nullptr ||
      !auth->IsPeerAuthenticated()) {
    if (tls_state != nullptr && !caller.unix_socket) {
      return absl::UnauthenticatedError(
          "this server needs a TLS client certificate");
    }
    return caller;
  }
  std::vector<std::string> uris =
      PropertyValues(*auth, GRPC_PEER_URI_PROPERTY_NAME);
  if (uris.empty()) uris = PropertyValues(*auth, GRPC_X509_SAN_PROPERTY_NAME);
  for (const std::string& uri : uris) {
    absl::StatusOr<Identity> identity = ParseIdentityUri(uri);
    if (identity.ok()) {
      caller.authenticated = true;
      caller.identity = *std::move(identity);
      if (RevocationEnabled()) {
        const std::vector<std::string> pem =
            PropertyValues(*auth, GRPC_X509_PEM_CERT_PROPERTY_NAME);
        if (!pem.empty()) {
          caller.identity.certificate_id = CertificateIdOfPem(pem.front());
        }
      }
      return caller;
    }
  }
  return absl::UnauthenticatedError(
      "the client's certificate names no chorus:// identity");
}

absl::StatusOr<Identity> RequireIdentity(const grpc::ServerContextBase& context,
                                         absl::string_view entry) {
  if (tls_state == nullptr) return absl::FailedPreconditionError("TLS is off");
  absl::StatusOr<Caller> caller = CallerOf(context);
  if (!caller.ok()) return caller.status();
  if (!caller->authenticated) {
    return absl::PermissionDeniedError(
        absl::StrCat(entry, " needs a certificate; the caller has none"));
  }
  if (absl::Status allowed = Authorize(entry, caller->identity);
      !allowed.ok()) {
    return allowed;
  }
  return caller->identity;
}

absl::Status RequireRole(const grpc::ServerContextBase& context,
                         absl::string_view entry) {
  if (tls_state == nullptr) return absl::OkStatus();
  return RequireIdentity(context, entry).status();
}

absl::Status CheckPlaintextListen(absl::string_view what,
                                  const std::string& host, bool insecure) {
  if (tls_state != nullptr || IsLoopbackHost(host)) return absl::OkStatus();
  if (insecure) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      LOG(WARNING) << "serving " << what << " host " << host
                   << " without TLS (--insecure): anyone who can reach it can "
                      "act as any worker or rank";
    }
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      what, " host '", host,
      "' is reachable from the network and TLS is off: give --tls_dir "
      "(scripts/dev_certs.sh makes certificates), listen on a loopback "
      "address, or pass --insecure to serve in plaintext anyway"));
}

}  // namespace chorus
