#include "common/tls_mismatch.h"

#include <openssl/bio.h>
#include <openssl/ssl.h>

#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/tcp_socket.h"

namespace chorus {
namespace {

// How long ExplainTlsMismatch waits for the server's answer to its probe.
constexpr absl::Duration kProbeWait = absl::Seconds(1);

// Where the certificates come from, for the messages.
constexpr char kCertificates[] =
    "a directory with ca.pem, cert.pem and key.pem of the cluster's CA "
    "(scripts/dev_certs.sh makes them)";

struct SslCtxFree {
  void operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }
};
struct SslFree {
  void operator()(SSL* ssl) const { SSL_free(ssl); }
};

// Returns the first message of a TLS handshake (a ClientHello) as a client
// of no identity writes it, or "" when OpenSSL cannot make one.
std::string ClientHello() {
  std::unique_ptr<SSL_CTX, SslCtxFree> ctx(SSL_CTX_new(TLS_client_method()));
  if (ctx == nullptr) return "";
  std::unique_ptr<SSL, SslFree> ssl(SSL_new(ctx.get()));
  BIO* in = BIO_new(BIO_s_mem());
  BIO* out = BIO_new(BIO_s_mem());
  if (ssl == nullptr || in == nullptr || out == nullptr) {
    BIO_free(in);
    BIO_free(out);
    return "";
  }
  SSL_set_bio(ssl.get(), in, out);  // the SSL owns both
  SSL_set_connect_state(ssl.get());
  SSL_do_handshake(ssl.get());  // writes the hello, then wants to read
  std::string hello(BIO_ctrl_pending(out), '\0');
  if (!hello.empty() &&
      BIO_read(out, hello.data(), static_cast<int>(hello.size())) <= 0) {
    return "";
  }
  return hello;
}

}  // namespace

bool ServerSpeaksTls(const std::string& host, int port, absl::Time deadline) {
  const std::string hello = ClientHello();
  if (hello.empty()) return false;
  absl::StatusOr<int> fd = ConnectTcp(host, port, deadline);
  if (!fd.ok()) return false;
  const absl::string_view part = hello;
  // A TLS record starts with its type (22 handshake, 21 alert) and the
  // major version 3.
  char header[2] = {0, 0};
  size_t got = 0;
  bool tls = false;
  if (WriteAll(*fd, &part, 1, deadline).ok()) {
    while (got < sizeof(header)) {
      absl::StatusOr<size_t> read =
          ReadSome(*fd, header + got, sizeof(header) - got, deadline, -1);
      if (!read.ok()) break;
      got += *read;
    }
    tls = got == sizeof(header) && (header[0] == 22 || header[0] == 21) &&
          header[1] == 3;
  }
  CloseSocket(*fd);
  return tls;
}

absl::Status ExplainTlsMismatch(const absl::Status& status,
                                const std::string& target, Role server_role) {
  if (!absl::IsUnavailable(status) || absl::StartsWith(target, "unix:")) {
    return status;
  }
  const std::string who =
      absl::StrCat("the ", RoleName(server_role), " at ", target);
  if (TlsEnabled()) {
    // What OpenSSL says when the first bytes back are no TLS record.
    if (!absl::StrContains(status.message(), "wrong version number")) {
      return status;
    }
    return absl::FailedPreconditionError(absl::StrCat(
        who,
        " does not use TLS (it runs without --tls_dir) and this process "
        "does: give both --tls_dir, ",
        kCertificates, ", or neither"));
  }
  absl::StatusOr<HostPort> address = SplitHostPort(target);
  if (!address.ok() || !ServerSpeaksTls(address->host, address->port,
                                        absl::Now() + kProbeWait)) {
    return status;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      who,
      " uses mutual TLS and this process has no certificates: give it "
      "--tls_dir=DIR (tls_dir= in Python), ",
      kCertificates));
}

}  // namespace chorus
