// TlsStream: mutual TLS (OpenSSL, TLS 1.3) over one TCP connection of the
// data plane, with the process's certificates (transport_security.h). The
// connecting side checks that the listener's certificate names the role it
// expects; the accepting side requires a client certificate from the CA and
// reports the identity it names. No session tickets are sent, so once the
// handshake is over a peer that closes its end shows as end of file to
// PeerClosed (tcp_socket.h).
//
// Reads go through a 256 KiB buffer and writes collect their records for
// one send per 256 KiB, so a large frame costs few system calls. Every
// write to the socket, TLS's own too (the handshake, an alert), is sent
// with MSG_NOSIGNAL: a closed connection is an error, never SIGPIPE.
//
// The OpenSSL context is tls_context.h's: renewed certificates apply to new
// connections without a restart.
//
// Lifecycle: made by Connect or Accept over a socket the caller keeps
// owning (and closes after the stream is gone).
// Thread safety: one thread at a time per stream; Connect and Accept may run
// concurrently.
#ifndef CHORUS_COMMON_TLS_STREAM_H_
#define CHORUS_COMMON_TLS_STREAM_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/tls_context.h"
#include "common/transport_security.h"

typedef struct ssl_st SSL;

namespace chorus {

class TlsStream {
 public:
  // Runs the client handshake on the non-blocking socket `fd`, waiting
  // until `deadline` or `cancel_fd` (-1: none). Returns UNAVAILABLE when
  // the handshake fails or the listener's certificate does not name
  // `server_role`, or (when `server_name` is not empty) that name of this
  // process's job (the message says which it names), DEADLINE_EXCEEDED,
  // CANCELLED;
  // FAILED_PRECONDITION when TLS is off.
  static absl::StatusOr<std::unique_ptr<TlsStream>> Connect(
      int fd, Role server_role, absl::Time deadline, int cancel_fd = -1,
      absl::string_view server_name = {});

  // Runs the server handshake on the blocking socket `fd`, all of it by
  // `deadline` (the socket is non-blocking meanwhile, blocking again after).
  // Returns UNAVAILABLE when it fails (no or a foreign client certificate,
  // one naming no Chorus identity, or the socket was shut down meanwhile),
  // DEADLINE_EXCEEDED; FAILED_PRECONDITION when TLS is off.
  static absl::StatusOr<std::unique_ptr<TlsStream>> Accept(int fd,
                                                           absl::Time deadline);

  ~TlsStream();
  TlsStream(const TlsStream&) = delete;
  TlsStream& operator=(const TlsStream&) = delete;

  // The identity the peer's certificate names.
  const Identity& peer() const { return peer_; }

  // Writes every byte of `parts` in order on a non-blocking socket, as
  // WriteAll in tcp_socket.h (same codes; UNAVAILABLE also when TLS fails).
  // The records are sealed in memory and sent kSendBytes at a time. After
  // an error the stream is unusable: close the connection.
  absl::Status WriteAll(const absl::string_view* parts, size_t count,
                        absl::Time deadline, int cancel_fd = -1);

  // Reads exactly `size` bytes on a blocking socket. Returns false when the
  // connection closed or failed first.
  bool ReadFull(char* out, size_t size);

 private:
  TlsStream(SSL* ssl, int fd, Identity peer)
      : ssl_(ssl), fd_(fd), peer_(std::move(peer)) {}

  // How many bytes of records collect before they are sent.
  static constexpr size_t kSendBytes = 256 << 10;

  // Sends the records sealed so far and empties their buffer.
  absl::Status SendSealed(absl::Time deadline, int cancel_fd);

  SSL* const ssl_;
  const int fd_;
  // Whether the SSL writes its records to sealed_ (from the first
  // WriteAll on; the handshake wrote to the socket).
  bool buffering_ = false;
  // Records sealed and not yet sent.
  std::string sealed_;
  const Identity peer_;
};

}  // namespace chorus

#endif  // CHORUS_COMMON_TLS_STREAM_H_
