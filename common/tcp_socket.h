// Small wrappers over POSIX TCP sockets for the data plane and the
// coordinator's call port: listening,
// connecting with a deadline, and whole-buffer reads and writes. Writes and
// connects wait in poll() until the socket is ready or the deadline passes;
// nothing spins.
//
// Stateless functions; thread-safe. File descriptors returned are owned by
// the caller (close them with CloseSocket).
#ifndef CHORUS_COMMON_TCP_SOCKET_H_
#define CHORUS_COMMON_TCP_SOCKET_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace chorus {

struct HostPort {
  std::string host;  // without IPv6 brackets
  int port = 0;
};

// Splits "host:port" or "[v6]:port". Returns INVALID_ARGUMENT when there is
// no port or it is not a number in [0, 65535].
absl::StatusOr<HostPort> SplitHostPort(absl::string_view address);

struct Listener {
  int fd = -1;
  int port = 0;
};

// Listens on `host` ("0.0.0.0", "::", a name or an address) at `port` (0
// picks a free one). Returns UNAVAILABLE naming the address when it cannot
// be bound.
absl::StatusOr<Listener> ListenTcp(const std::string& host, int port);

// Listens on a Unix domain socket at `path` (which must not exist), mode
// 0600: only its owner may connect. Returns the listening descriptor (port
// 0), INVALID_ARGUMENT for a path too long for a socket address, or
// UNAVAILABLE naming the path.
absl::StatusOr<Listener> ListenUnix(const std::string& path);

// Connects to host:port, waiting until `deadline` at most. The socket
// returned is non-blocking and has TCP_NODELAY set. Returns UNAVAILABLE or
// DEADLINE_EXCEEDED naming the address.
absl::StatusOr<int> ConnectTcp(const std::string& host, int port,
                               absl::Time deadline);

// Returns the local address (numeric; IPv6 without brackets) that this
// host's routes give connections to `host`:`port`: what a peer sees as the
// source of such a connection. Found by connecting a UDP socket, which sends
// nothing. Returns UNAVAILABLE when `host` does not resolve or no route
// leads there.
absl::StatusOr<std::string> LocalAddressTowards(const std::string& host,
                                                int port);

// Returns true when `host` is a loopback address, or a name that resolves
// to loopback addresses only (e.g. "localhost", or a hostname mapped to
// 127.0.1.1 by /etc/hosts); false when it resolves to any other address or
// does not resolve.
bool IsLoopbackHost(const std::string& host);

// Makes a connection that stops carrying data fail within about `timeout`
// rather than after the kernel's retransmission backoff (up to 15 minutes):
// sets TCP_USER_TIMEOUT (unacknowledged data older than `timeout` closes
// the connection with ETIMEDOUT) and keepalive probes that find an idle
// connection to a vanished peer within about `timeout` as well. Does
// nothing for a zero or infinite timeout.
void SetDeadPeerTimeout(int fd, absl::Duration timeout);

// Returns true when the peer of the connected socket `fd` has closed its
// end or the connection failed (a peek without waiting sees end of file or
// an error other than "no data yet"); false while it looks open. Any data
// waiting stays unread.
bool PeerClosed(int fd);

// Returns the UNAVAILABLE status of a connection that broke with `error`
// (an errno value), as WriteAll and TlsStream::WriteAll report it.
absl::Status BrokenConnectionError(int error);

// Returns true when `status` is a write's failure because the connection's
// dead-peer timeout (SetDeadPeerTimeout) gave up on it: the peer had
// acknowledged nothing for that long.
bool IsDeadPeerTimeout(const absl::Status& status);

// Writes every byte of `parts` (in order) to the non-blocking socket `fd`,
// waiting for room until `deadline`, or until `cancel_fd` (an eventfd, or
// -1 for none) becomes readable. Never raises SIGPIPE. Returns UNAVAILABLE
// when the connection broke, DEADLINE_EXCEEDED when the peer did not take
// the bytes in time, CANCELLED when `cancel_fd` fired; in each case part of
// the data may have been written.
absl::Status WriteAll(int fd, const absl::string_view* parts, size_t count,
                      absl::Time deadline, int cancel_fd = -1);

// Reads what the non-blocking socket `fd` has (at least one byte, at most
// `size`) into `out`, waiting until `deadline` or until `cancel_fd` (an
// eventfd, or -1) becomes readable. Returns the byte count; UNAVAILABLE when
// the connection closed or failed, DEADLINE_EXCEEDED, or CANCELLED.
absl::StatusOr<size_t> ReadSome(int fd, char* out, size_t size,
                                absl::Time deadline, int cancel_fd);

// Returns whether `fd` (or `other_fd`, when not negative) can be read
// without blocking now: data, end of stream or an error waits there.
bool ReadableNow(int fd, int other_fd = -1);

// ReadSome() for a reader that expects nothing yet (it has just read all
// there was): waits for data first, sparing the read that would find none.
// Same results.
absl::StatusOr<size_t> ReadSomeWhenReady(int fd, char* out, size_t size,
                                         absl::Time deadline, int cancel_fd);

// Waits until `fd` is ready for `events` (POLLIN, POLLOUT), `deadline`
// passes, or `cancel_fd` (an eventfd, or -1) becomes readable. Returns OK
// (ready, or an error the next call on `fd` reports), DEADLINE_EXCEEDED or
// CANCELLED.
absl::Status WaitForSocket(int fd, short events, absl::Time deadline,
                           int cancel_fd = -1);

// Reads exactly `size` bytes from the blocking socket `fd` into `out`.
// Returns false when the connection closed or failed first.
bool ReadFull(int fd, char* out, size_t size);

// Ends reads and writes on `fd` in every thread (they return at once).
void ShutdownSocket(int fd);
void CloseSocket(int fd);

}  // namespace chorus

#endif  // CHORUS_COMMON_TCP_SOCKET_H_
