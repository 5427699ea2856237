#include "tests/testing/raw_clients.h"

#include <fcntl.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "common/call_frame.h"
#include "common/tcp_socket.h"

namespace chorus::test {
namespace {

// How long a read waits for the server before it counts as still open:
// far longer than any handshake or greeting deadline of the daemons.
constexpr absl::Duration kPatience = absl::Seconds(30);

}  // namespace

RawClient::RawClient(int port, const std::string& tls_dir,
                     bool present_certificate) {
  absl::StatusOr<int> fd =
      ConnectTcp("127.0.0.1", port, absl::Now() + absl::Seconds(10));
  if (!fd.ok()) return;
  fd_ = *fd;
  fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
  if (tls_dir.empty()) {
    connected_ = true;
    return;
  }
  ctx_ = SSL_CTX_new(TLS_client_method());
  if (present_certificate) {
    SSL_CTX_use_certificate_chain_file(ctx_, (tls_dir + "/cert.pem").c_str());
    SSL_CTX_use_PrivateKey_file(ctx_, (tls_dir + "/key.pem").c_str(),
                                SSL_FILETYPE_PEM);
  }
  SSL_CTX_load_verify_locations(ctx_, (tls_dir + "/ca.pem").c_str(), nullptr);
  SSL_CTX_set_verify(ctx_, SSL_VERIFY_PEER, nullptr);
  ssl_ = SSL_new(ctx_);
  SSL_set_fd(ssl_, fd_);
  const timeval timeout = absl::ToTimeval(kPatience);
  setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  connected_ = SSL_connect(ssl_) == 1;
}

RawClient::~RawClient() {
  if (ssl_ != nullptr) SSL_free(ssl_);
  if (ctx_ != nullptr) SSL_CTX_free(ctx_);
  if (fd_ >= 0) close(fd_);
}

bool RawClient::Send(absl::string_view bytes) {
  if (!connected_) return false;
  if (ssl_ == nullptr) {
    return send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  return SSL_write(ssl_, bytes.data(), static_cast<int>(bytes.size())) ==
         static_cast<int>(bytes.size());
}

std::string RawClient::ReadFor(absl::Duration wait, bool* closed) {
  *closed = !connected_;
  if (!connected_) return "";
  const timeval timeout = absl::ToTimeval(wait);
  setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  char buffer[4096];
  if (ssl_ == nullptr) {
    const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
    if (n > 0) return std::string(buffer, static_cast<size_t>(n));
    *closed = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
    return "";
  }
  const int n = SSL_read(ssl_, buffer, sizeof(buffer));
  if (n > 0) return std::string(buffer, static_cast<size_t>(n));
  // A read timeout is EAGAIN under WANT_READ (or SYSCALL); anything else
  // (end of file, an alert) means the server closed.
  const int error = SSL_get_error(ssl_, n);
  *closed = !((error == SSL_ERROR_WANT_READ || error == SSL_ERROR_SYSCALL) &&
              (errno == EAGAIN || errno == EWOULDBLOCK));
  return "";
}

absl::StatusOr<v1::CallPortReply> CallPortExchange(
    int port, const std::string& tls_dir, bool present_certificate,
    const v1::CallPortRequest& request) {
  RawClient client(port, tls_dir, present_certificate);
  if (!client.connected()) return absl::UnavailableError("handshake failed");
  std::string bytes(kCallHello);
  AppendCallFrame(request.SerializeAsString(), &bytes);
  if (!client.Send(bytes)) return absl::UnavailableError("closed");
  CallFrameParser frames(1 << 20);
  std::string received;
  while (true) {
    bool closed = false;
    const std::string some = client.ReadFor(kPatience, &closed);
    if (some.empty()) {
      if (!closed) return absl::UnavailableError("still open after 30 s");
      break;
    }
    received += some;
    frames.Append(some);
    std::string payload;
    absl::StatusOr<bool> next = frames.Next(&payload);
    v1::CallPortReply reply;
    if (next.ok() && *next && reply.ParseFromString(payload)) return reply;
  }
  // Plaintext to a TLS port: a TLS alert record (content type 21) may
  // precede the close.
  if (received.empty() || !tls_dir.empty()) {
    return absl::UnavailableError("closed");
  }
  return absl::UnavailableError(received[0] == 21
                                    ? "closed after a TLS alert"
                                    : "closed after bytes that are no reply");
}

bool ClosedAfterSending(int port, const std::string& tls_dir,
                        const std::string& bytes) {
  RawClient client(port, tls_dir);
  if (!client.connected()) return true;
  if (!bytes.empty() && !client.Send(bytes)) return true;
  bool closed = false;
  while (!closed) {
    if (client.ReadFor(kPatience, &closed).empty()) break;
  }
  return closed;
}

}  // namespace chorus::test
