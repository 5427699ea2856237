#include "common/tls_stream.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/revocation.h"
#include "common/tcp_socket.h"

namespace chorus {
namespace {

// How much a stream reads from its socket at once.
constexpr int kReadBufferBytes = 256 << 10;

// A write-only BIO on the socket its data pointer holds (as an intptr_t)
// that sends with MSG_NOSIGNAL: what TLS writes on its own (the handshake,
// the alert it sends when a read ends a session, e.g. after this process
// shut the socket down) must not raise SIGPIPE in a process that has not
// ignored it (chorusctl, an application embedding a worker). OpenSSL's
// socket BIO uses write(), which does.
int SendNoSignal(BIO* bio, const char* data, int size) {
  BIO_clear_retry_flags(bio);
  const int fd =
      static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(bio)));
  const ssize_t sent = send(fd, data, static_cast<size_t>(size), MSG_NOSIGNAL);
  if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    BIO_set_retry_write(bio);
  }
  return static_cast<int>(sent);
}

long SendControl(BIO*, int command, long, void*) {
  return command == BIO_CTRL_FLUSH ? 1 : 0;
}

const BIO_METHOD* SendNoSignalMethod() {
  static const BIO_METHOD* method = [] {
    BIO_METHOD* made = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK,
                                    "send without SIGPIPE");
    if (made != nullptr) {
      BIO_meth_set_write(made, SendNoSignal);
      BIO_meth_set_ctrl(made, SendControl);
    }
    return made;
  }();
  return method;
}

// Gives `ssl` the socket `fd`: writes go straight to it (SendNoSignal),
// reads through a buffer that takes what the socket has, many records at
// once, and hands them to TLS a header and a body at a time. (OpenSSL's own
// read-ahead moves the rest of its buffer to the front before each record,
// which costs more than the decryption for a large buffer.) Returns false
// when out of memory.
bool AttachSocket(SSL* ssl, int fd) {
  const BIO_METHOD* send_method = SendNoSignalMethod();
  BIO* socket = BIO_new_socket(fd, BIO_NOCLOSE);
  BIO* buffer = BIO_new(BIO_f_buffer());
  BIO* out = send_method != nullptr ? BIO_new(send_method) : nullptr;
  if (socket == nullptr || buffer == nullptr || out == nullptr ||
      BIO_set_read_buffer_size(buffer, kReadBufferBytes) != 1) {
    BIO_free(socket);
    BIO_free(buffer);
    BIO_free(out);
    return false;
  }
  BIO_set_data(out, reinterpret_cast<void*>(static_cast<intptr_t>(fd)));
  BIO_set_init(out, 1);
  BIO_push(buffer, socket);
  SSL_set_bio(ssl, buffer, out);
  SSL_set_read_ahead(ssl, 0);
  return true;
}

// A write-only BIO that appends what TLS writes to the std::string its data
// pointer names: the records of a TlsStream wait there for one large send.
int AppendRecords(BIO* bio, const char* data, int size) {
  static_cast<std::string*>(BIO_get_data(bio))
      ->append(data, static_cast<size_t>(size));
  return size;
}

long RecordsControl(BIO*, int command, long, void*) {
  return command == BIO_CTRL_FLUSH ? 1 : 0;
}

const BIO_METHOD* RecordBufferMethod() {
  static const BIO_METHOD* method = [] {
    BIO_METHOD* made =
        BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "records");
    if (made != nullptr) {
      BIO_meth_set_write(made, AppendRecords);
      BIO_meth_set_ctrl(made, RecordsControl);
    }
    return made;
  }();
  return method;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TlsStream>> TlsStream::Connect(
    int fd, Role server_role, absl::Time deadline, int cancel_fd,
    absl::string_view server_name) {
  if (!TlsEnabled()) return absl::FailedPreconditionError("TLS is off");
  std::string why;
  SSL* ssl = NewTlsConnection(&why);
  if (ssl == nullptr) {
    return absl::UnavailableError(absl::StrCat("TLS: ", why));
  }
  if (!AttachSocket(ssl, fd)) {
    SSL_free(ssl);
    return absl::UnavailableError("TLS: out of memory");
  }
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
  } else if (peer.ok() && !CheckNotRevoked(peer->certificate_id).ok()) {
    peer = absl::UnavailableError(
        absl::StrCat("the peer's certificate (", peer->Uri(), ") ",
                     CheckNotRevoked(peer->certificate_id).message()));
  } else if (peer.ok() && !server_name.empty() &&
             (peer->name != server_name || peer->job != OwnIdentity().job)) {
    Identity expected{server_role, std::string(server_name), OwnIdentity().job};
    peer = absl::UnavailableError(absl::StrCat("the peer's certificate names ",
                                               peer->Uri(), ", not ",
                                               expected.Uri()));
  }
  if (!peer.ok()) {
    SSL_free(ssl);
    return peer.status();
  }
  return std::unique_ptr<TlsStream>(new TlsStream(ssl, fd, *std::move(peer)));
}

absl::StatusOr<std::unique_ptr<TlsStream>> TlsStream::Accept(
    int fd, absl::Time deadline) {
  if (!TlsEnabled()) return absl::FailedPreconditionError("TLS is off");
  std::string why;
  SSL* ssl = NewTlsConnection(&why);
  if (ssl == nullptr) {
    return absl::UnavailableError(absl::StrCat("TLS: ", why));
  }
  if (!AttachSocket(ssl, fd)) {
    SSL_free(ssl);
    return absl::UnavailableError("TLS: out of memory");
  }
  // The whole handshake runs non-blocking under one deadline, so a client
  // that trickles its bytes cannot stretch it; the stream reads blocking.
  const int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  absl::Status shaken = absl::OkStatus();
  while (true) {
    const int result = SSL_accept(ssl);
    if (result == 1) break;
    const int error = SSL_get_error(ssl, result);
    if (error != SSL_ERROR_WANT_READ && error != SSL_ERROR_WANT_WRITE) {
      shaken = absl::UnavailableError(
          absl::StrCat("TLS handshake failed: ", TlsHandshakeError(ssl)));
      break;
    }
    shaken = WaitForSocket(fd, error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT,
                           deadline);
    if (!shaken.ok()) break;
  }
  fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  absl::StatusOr<Identity> peer =
      shaken.ok() ? PeerIdentity(ssl) : absl::StatusOr<Identity>(shaken);
  if (!peer.ok()) {
    SSL_free(ssl);
    return peer.status();
  }
  return std::unique_ptr<TlsStream>(new TlsStream(ssl, fd, *std::move(peer)));
}

TlsStream::~TlsStream() { SSL_free(ssl_); }

absl::Status TlsStream::WriteAll(const absl::string_view* parts, size_t count,
                                 absl::Time deadline, int cancel_fd) {
  if (!buffering_) {
    // From now on records collect in memory and leave in large sends: one
    // system call (and one wake-up of the reader) per kSendBytes rather
    // than one per 16 KiB record. Reads stay on the socket.
    const BIO_METHOD* method = RecordBufferMethod();
    BIO* bio = method != nullptr ? BIO_new(method) : nullptr;
    if (bio == nullptr) return absl::UnavailableError("TLS: out of memory");
    BIO_set_data(bio, &sealed_);
    BIO_set_init(bio, 1);
    SSL_set0_wbio(ssl_, bio);  // the SSL owns it
    buffering_ = true;
  }
  for (size_t i = 0; i < count; ++i) {
    absl::string_view left = parts[i];
    while (!left.empty()) {
      // Below kSendBytes here: a batch that reached it was sent.
      const size_t step = std::min(left.size(), kSendBytes - sealed_.size());
      const int written = SSL_write(ssl_, left.data(), static_cast<int>(step));
      if (written <= 0) {
        return absl::UnavailableError(absl::StrCat("TLS: ", OpenSslError()));
      }
      left.remove_prefix(static_cast<size_t>(written));
      if (sealed_.size() >= kSendBytes) {
        absl::Status sent = SendSealed(deadline, cancel_fd);
        if (!sent.ok()) return sent;
      }
    }
  }
  return SendSealed(deadline, cancel_fd);
}

absl::Status TlsStream::SendSealed(absl::Time deadline, int cancel_fd) {
  if (sealed_.empty()) return absl::OkStatus();
  const absl::string_view records = sealed_;
  absl::Status sent = chorus::WriteAll(fd_, &records, 1, deadline, cancel_fd);
  // Records that did not leave are not sent later: the caller closes the
  // connection after a failed write.
  sealed_.clear();
  return sent;
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
