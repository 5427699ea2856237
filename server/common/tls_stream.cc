#include "server/common/tls_stream.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/common/tcp_socket.h"

namespace chorus {

absl::StatusOr<std::unique_ptr<TlsStream>> TlsStream::Connect(
    int fd, Role server_role, absl::Time deadline, int cancel_fd) {
  if (!TlsEnabled()) return absl::FailedPreconditionError("TLS is off");
  std::string why;
  SSL* ssl = NewTlsConnection(&why);
  if (ssl == nullptr) {
    return absl::UnavailableError(absl::StrCat("TLS: ", why));
  }
  SSL_set_fd(ssl, fd);
  while (true) {
    const int result = SSL_connect(ssl);
    if (result == 1) break;
    const int error = SSL_get_error(ssl, result);
    if (error != SSL_ERROR_WANT_READ && error != SSL_ERROR_WANT_WRITE) {
      why = TlsHandshakeError(ssl);
      SSL_free(ssl);
      return absl::UnavailableError(
          absl::StrCat("TLS handshake failed: ", why));
    }
    absl::Status waited =
        WaitForSocket(fd, error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT,
                      deadline, cancel_fd);
    if (!waited.ok()) {
      SSL_free(ssl);
      return waited;
    }
  }
  absl::StatusOr<Identity> peer = PeerIdentity(ssl);
  if (peer.ok() && peer->role != server_role) {
    peer = absl::UnavailableError(absl::StrCat("the peer's certificate names ",
                                               peer->Uri(), ", not ",
                                               RoleWithArticle(server_role)));
  }
  if (!peer.ok()) {
    SSL_free(ssl);
    return peer.status();
  }
  return std::unique_ptr<TlsStream>(new TlsStream(ssl, fd, *std::move(peer)));
}

absl::StatusOr<std::unique_ptr<TlsStream>> TlsStream::Accept(int fd) {
  if (!TlsEnabled()) return absl::FailedPreconditionError("TLS is off");
  std::string why;
  SSL* ssl = NewTlsConnection(&why);
  if (ssl == nullptr) {
    return absl::UnavailableError(absl::StrCat("TLS: ", why));
  }
  SSL_set_fd(ssl, fd);
  if (SSL_accept(ssl) != 1) {
    why = TlsHandshakeError(ssl);
    SSL_free(ssl);
    return absl::UnavailableError(absl::StrCat("TLS handshake failed: ", why));
  }
  absl::StatusOr<Identity> peer = PeerIdentity(ssl);
  if (!peer.ok()) {
    SSL_free(ssl);
    return peer.status();
  }
  return std::unique_ptr<TlsStream>(new TlsStream(ssl, fd, *std::move(peer)));
}

TlsStream::~TlsStream() { SSL_free(ssl_); }

absl::Status TlsStream::WriteAll(const absl::string_view* parts, size_t count,
                                 absl::Time deadline, int cancel_fd) {
  for (size_t i = 0; i < count; ++i) {
    absl::string_view left = parts[i];
    while (!left.empty()) {
      const int step = static_cast<int>(std::min<size_t>(left.size(), INT_MAX));
      errno = 0;  // SSL_ERROR_SYSCALL below reads it
      const int written = SSL_write(ssl_, left.data(), step);
      if (written > 0) {
        left.remove_prefix(static_cast<size_t>(written));
        continue;
      }
      const int error = SSL_get_error(ssl_, written);
      if (error == SSL_ERROR_SYSCALL && errno != 0) {
        // The socket failed (reset, or the dead-peer timeout): said as a
        // plain TCP write would say it.
        ERR_clear_error();
        return BrokenConnectionError(errno);
      }
      if (error != SSL_ERROR_WANT_READ && error != SSL_ERROR_WANT_WRITE) {
        return absl::UnavailableError(OpenSslError());
      }
      absl::Status waited =
          WaitForSocket(fd_, error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT,
                        deadline, cancel_fd);
      if (absl::IsDeadlineExceeded(waited)) {
        return absl::DeadlineExceededError(
            "the peer took no data before the deadline");
      }
      if (!waited.ok()) return waited;
    }
  }
  return absl::OkStatus();
}

bool TlsStream::ReadFull(char* out, size_t size) {
  while (size > 0) {
    const int step = static_cast<int>(std::min<size_t>(size, INT_MAX));
    const int n = SSL_read(ssl_, out, step);
    if (n <= 0) {
      ERR_clear_error();
      return false;
    }
    out += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace chorus
