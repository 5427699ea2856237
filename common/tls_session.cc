#include "common/tls_session.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <climits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/tls_context.h"

namespace chorus {

absl::StatusOr<std::unique_ptr<TlsSession>> TlsSession::Make(bool server,
                                                             Role server_role) {
  if (!TlsEnabled()) return absl::FailedPreconditionError("TLS is off");
  std::string why;
  SSL* ssl = NewTlsConnection(&why);
  if (ssl == nullptr) {
    return absl::UnavailableError(absl::StrCat("TLS: ", why));
  }
  BIO* in = BIO_new(BIO_s_mem());
  BIO* out = BIO_new(BIO_s_mem());
  if (in == nullptr || out == nullptr) {
    BIO_free(in);
    BIO_free(out);
    SSL_free(ssl);
    return absl::UnavailableError("TLS: out of memory");
  }
  // An empty memory BIO means "no bytes yet", not end of file.
  BIO_set_mem_eof_return(in, -1);
  SSL_set_bio(ssl, in, out);
  // The bytes are in memory already: reading ahead would only copy them
  // once more.
  SSL_set_read_ahead(ssl, 0);
  if (server) {
    SSL_set_accept_state(ssl);
  } else {
    SSL_set_connect_state(ssl);
  }
  std::unique_ptr<TlsSession> session(new TlsSession(ssl, in, out));
  session->server_ = server;
  session->server_role_ = server_role;
  return session;
}

absl::StatusOr<std::unique_ptr<TlsSession>> TlsSession::Accept() {
  return Make(/*server=*/true, Role::kCoordinator);
}

absl::StatusOr<std::unique_ptr<TlsSession>> TlsSession::Connect(
    Role server_role) {
  return Make(/*server=*/false, server_role);
}

TlsSession::~TlsSession() { SSL_free(ssl_); }

bool TlsSession::established() const {
  absl::MutexLock lock(&mu_);
  return peer_.has_value();
}

std::optional<Identity> TlsSession::peer() const {
  absl::MutexLock lock(&mu_);
  return peer_;
}

absl::Status TlsSession::HandshakeLocked() {
  const int result = SSL_do_handshake(ssl_);
  if (result != 1) {
    const int error = SSL_get_error(ssl_, result);
    if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
      ERR_clear_error();
      return absl::OkStatus();  // more bytes needed
    }
    return absl::UnavailableError(
        absl::StrCat("TLS handshake failed: ", TlsHandshakeError(ssl_)));
  }
  absl::StatusOr<Identity> identity = PeerIdentity(ssl_);
  if (!identity.ok()) return identity.status();
  if (!server_ && identity->role != server_role_) {
    return absl::UnavailableError(absl::StrCat("the peer's certificate names ",
                                               identity->Uri(), ", not ",
                                               RoleWithArticle(server_role_)));
  }
  peer_ = *std::move(identity);
  return absl::OkStatus();
}

void TlsSession::TakeOutputLocked(std::string* to_send) {
  const size_t pending = BIO_ctrl_pending(out_);
  if (pending == 0) return;
  const size_t at = to_send->size();
  to_send->resize(at + pending);
  const int got =
      BIO_read(out_, to_send->data() + at,
               static_cast<int>(std::min<size_t>(pending, INT_MAX)));
  to_send->resize(at + static_cast<size_t>(std::max(got, 0)));
}

absl::Status TlsSession::Open(absl::string_view received, std::string* plain,
                              std::string* to_send) {
  absl::MutexLock lock(&mu_);
  if (!failed_.ok()) return failed_;
  while (!received.empty()) {
    const int step =
        static_cast<int>(std::min<size_t>(received.size(), INT_MAX));
    const int put = BIO_write(in_, received.data(), step);
    if (put <= 0) {
      failed_ = absl::UnavailableError("TLS: out of memory");
      return failed_;
    }
    received.remove_prefix(static_cast<size_t>(put));
  }
  absl::Status status;
  if (!peer_.has_value()) status = HandshakeLocked();
  if (status.ok() && peer_.has_value()) {
    char buffer[16 << 10];
    // Until the bytes given are used up: one more SSL_read only to hear
    // "want more" costs as much as a small record.
    while (BIO_ctrl_pending(in_) > 0 || SSL_has_pending(ssl_) == 1) {
      const int n = SSL_read(ssl_, buffer, sizeof(buffer));
      if (n > 0) {
        plain->append(buffer, static_cast<size_t>(n));
        continue;
      }
      const int error = SSL_get_error(ssl_, n);
      if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
        ERR_clear_error();
      } else if (error == SSL_ERROR_ZERO_RETURN) {
        status = absl::UnavailableError("the peer closed the TLS session");
      } else {
        status = absl::UnavailableError(
            absl::StrCat("TLS: ", TlsHandshakeError(ssl_)));
      }
      break;
    }
  }
  // Even a failed handshake may have an alert to send.
  if (to_send != nullptr) TakeOutputLocked(to_send);
  if (!status.ok()) failed_ = status;
  return status;
}

absl::Status TlsSession::Seal(absl::string_view plain, std::string* to_send) {
  absl::MutexLock lock(&mu_);
  if (!failed_.ok()) return failed_;
  if (!peer_.has_value()) {
    return absl::FailedPreconditionError("the TLS handshake is not over");
  }
  while (!plain.empty()) {
    const int step = static_cast<int>(std::min<size_t>(plain.size(), INT_MAX));
    const int written = SSL_write(ssl_, plain.data(), step);
    if (written <= 0) {
      failed_ = absl::UnavailableError(absl::StrCat("TLS: ", OpenSslError()));
      TakeOutputLocked(to_send);
      return failed_;
    }
    plain.remove_prefix(static_cast<size_t>(written));
    // Records leave the memory buffer as they are made, so a large
    // payload is not held twice in it.
    TakeOutputLocked(to_send);
  }
  return absl::OkStatus();
}

}  // namespace chorus
