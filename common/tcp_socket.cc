#include "common/tcp_socket.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace chorus {
namespace {

// Milliseconds poll() may wait before `deadline` (at least 1 while any time
// is left, so a wait never turns into a spin).
int PollTimeout(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(
      absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))),
      1 << 30));
}

enum class Wait { kReady, kDeadline, kCancelled };

// Waits until `fd` is ready for `events`, the deadline passes or
// `cancel_fd` (if not -1) is readable.
Wait WaitFor(int fd, short events, absl::Time deadline, int cancel_fd = -1) {
  while (true) {
    pollfd p[2] = {{fd, events, 0}, {cancel_fd, POLLIN, 0}};
    const int n = poll(p, cancel_fd < 0 ? 1 : 2, PollTimeout(deadline));
    if (n > 0 && cancel_fd >= 0 && (p[1].revents & POLLIN)) {
      return Wait::kCancelled;
    }
    if (n > 0) return Wait::kReady;
    if (n == 0 && absl::Now() >= deadline) return Wait::kDeadline;
    if (n < 0 && errno != EINTR) return Wait::kReady;  // the next call says
  }
}

std::string ErrnoText(int error) { return std::strerror(error); }

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

absl::StatusOr<HostPort> SplitHostPort(absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("address \"", address, "\" has no port"));
  }
  HostPort out;
  absl::string_view host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  out.host = std::string(host);
  if (!absl::SimpleAtoi(address.substr(colon + 1), &out.port) || out.port < 0 ||
      out.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("address \"", address, "\" has no valid port"));
  }
  return out;
}

absl::StatusOr<Listener> ListenTcp(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(),
                             service.c_str(), &hints, &found);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot resolve data-plane address ", host, ": ", gai_strerror(rc)));
  }
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd =
        socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 128) != 0) {
      why = ErrnoText(errno);
      close(fd);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t length = sizeof(bound);
    getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
    Listener listener;
    listener.fd = fd;
    listener.port =
        bound.ss_family == AF_INET6
            ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
            : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    freeaddrinfo(found);
    return listener;
  }
  freeaddrinfo(found);
  return absl::UnavailableError(
      absl::StrCat("cannot listen on ", host, ":", port, ": ", why));
}

absl::StatusOr<Listener> ListenUnix(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path \"", path, "\" is empty or longer than ",
                     sizeof(address.sun_path) - 1, " bytes"));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot make a socket for ",
                                               path, ": ", ErrnoText(errno)));
  }
  // Owner only from the start: the mode is set before it listens.
  if (bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) !=
          0 ||
      chmod(path.c_str(), 0600) != 0 || listen(fd, 128) != 0) {
    const std::string why = ErrnoText(errno);
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", path, ": ", why));
  }
  Listener listener;
  listener.fd = fd;
  return listener;
}

namespace {

// Resolves `host`:`port` for sockets of `socktype`. Returns the addresses
// (the caller frees them with freeaddrinfo) or UNAVAILABLE naming the
// address.
absl::StatusOr<addrinfo*> Resolve(const std::string& host, int port,
                                  int socktype) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = socktype;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ":",
                                               port, ": ", gai_strerror(rc)));
  }
  return found;
}

}  // namespace

absl::StatusOr<int> ConnectTcp(const std::string& host, int port,
                               absl::Time deadline) {
  const std::string where = absl::StrCat(host, ":", port);
  absl::StatusOr<addrinfo*> resolved = Resolve(host, port, SOCK_STREAM);
  if (!resolved.ok()) return resolved.status();
  addrinfo* found = *resolved;
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd =
        socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
               a->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        why = ErrnoText(errno);
        close(fd);
        continue;
      }
      if (WaitFor(fd, POLLOUT, deadline) == Wait::kDeadline) {
        close(fd);
        freeaddrinfo(found);
        return absl::DeadlineExceededError(
            absl::StrCat("connecting to ", where, " timed out"));
      }
      int error = 0;
      socklen_t length = sizeof(error);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
      if (error != 0) {
        why = ErrnoText(error);
        close(fd);
        continue;
      }
    }
    SetNoDelay(fd);
    freeaddrinfo(found);
    return fd;
  }
  freeaddrinfo(found);
  return absl::UnavailableError(
      absl::StrCat("cannot connect to ", where, ": ", why));
}

absl::StatusOr<std::string> LocalAddressTowards(const std::string& host,
                                                int port) {
  const std::string where = absl::StrCat(host, ":", port);
  absl::StatusOr<addrinfo*> resolved = Resolve(host, port, SOCK_DGRAM);
  if (!resolved.ok()) return resolved.status();
  addrinfo* found = *resolved;
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) != 0) {
      why = ErrnoText(errno);
      close(fd);
      continue;
    }
    close(fd);
    char text[NI_MAXHOST] = {};
    if (getnameinfo(reinterpret_cast<sockaddr*>(&local), length, text,
                    sizeof(text), nullptr, 0, NI_NUMERICHOST) != 0) {
      continue;
    }
    freeaddrinfo(found);
    return std::string(text);
  }
  freeaddrinfo(found);
  return absl::UnavailableError(absl::StrCat("no route to ", where, ": ", why));
}

bool IsLoopbackHost(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  bool any = false;
  bool all_loopback = true;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
      any = true;
      // 127.0.0.0/8.
      all_loopback &= (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    } else if (a->ai_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
      any = true;
      all_loopback &= IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr) != 0;
    }
  }
  freeaddrinfo(found);
  return any && all_loopback;
}

void SetDeadPeerTimeout(int fd, absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration() || timeout == absl::InfiniteDuration()) {
    return;
  }
  const int ms = static_cast<int>(
      std::min<int64_t>(absl::ToInt64Milliseconds(timeout), 1 << 30));
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof(ms));
  // Probe after half the timeout of silence, then every quarter: a
  // vanished peer is found about `timeout` after the last data.
  const int seconds = std::max(1, ms / 1000);
  const int idle = std::max(1, seconds / 2);
  const int interval = std::max(1, seconds / 4);
  const int count = 2;
  const int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
}

bool PeerClosed(int fd) {
  char byte;
  while (true) {
    const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) return false;
    if (n == 0) return true;
    if (errno == EINTR) continue;
    return errno != EAGAIN && errno != EWOULDBLOCK;
  }
}

absl::Status BrokenConnectionError(int error) {
  return absl::UnavailableError(ErrnoText(error));
}

bool IsDeadPeerTimeout(const absl::Status& status) {
  return absl::IsUnavailable(status) &&
         status.message() == ErrnoText(ETIMEDOUT);
}

absl::Status WriteAll(int fd, const absl::string_view* parts, size_t count,
                      absl::Time deadline, int cancel_fd) {
  std::vector<iovec> pending;
  pending.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    if (parts[i].empty()) continue;
    pending.push_back(
        iovec{const_cast<char*>(parts[i].data()), parts[i].size()});
  }
  size_t first = 0;
  while (first < pending.size()) {
    msghdr message{};
    message.msg_iov = pending.data() + first;
    message.msg_iovlen = std::min<size_t>(pending.size() - first, IOV_MAX);
    const ssize_t n = sendmsg(fd, &message, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        return BrokenConnectionError(errno);
      }
      const Wait waited = WaitFor(fd, POLLOUT, deadline, cancel_fd);
      if (waited == Wait::kDeadline) {
        return absl::DeadlineExceededError(
            "the peer took no data before the deadline");
      }
      if (waited == Wait::kCancelled) {
        return absl::CancelledError("this worker is shutting down");
      }
      continue;
    }
    size_t written = static_cast<size_t>(n);
    while (first < pending.size() && written >= pending[first].iov_len) {
      written -= pending[first].iov_len;
      ++first;
    }
    if (first < pending.size()) {
      pending[first].iov_base =
          static_cast<char*>(pending[first].iov_base) + written;
      pending[first].iov_len -= written;
    }
  }
  return absl::OkStatus();
}

namespace {

// ReadSome() and ReadSomeWhenReady(): `wait_first` waits before the first
// read.
absl::StatusOr<size_t> Read(int fd, char* out, size_t size, absl::Time deadline,
                            int cancel_fd, bool wait_first) {
  while (true) {
    if (wait_first) {
      const Wait waited = WaitFor(fd, POLLIN, deadline, cancel_fd);
      if (waited == Wait::kDeadline) {
        return absl::DeadlineExceededError("no data before the deadline");
      }
      if (waited == Wait::kCancelled) {
        return absl::CancelledError("the reader was cancelled");
      }
    }
    const ssize_t n = recv(fd, out, size, 0);
    if (n > 0) return static_cast<size_t>(n);
    if (n == 0) return absl::UnavailableError("the connection was closed");
    if (errno == EINTR) {
      wait_first = false;
      continue;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(ErrnoText(errno));
    }
    wait_first = true;
  }
}

}  // namespace

absl::StatusOr<size_t> ReadSome(int fd, char* out, size_t size,
                                absl::Time deadline, int cancel_fd) {
  return Read(fd, out, size, deadline, cancel_fd, /*wait_first=*/false);
}

absl::StatusOr<size_t> ReadSomeWhenReady(int fd, char* out, size_t size,
                                         absl::Time deadline, int cancel_fd) {
  return Read(fd, out, size, deadline, cancel_fd, /*wait_first=*/true);
}

bool ReadableNow(int fd, int other_fd) {
  pollfd p[2] = {{fd, POLLIN, 0}, {other_fd, POLLIN, 0}};
  return poll(p, other_fd < 0 ? 1 : 2, 0) > 0;
}

absl::Status WaitForSocket(int fd, short events, absl::Time deadline,
                           int cancel_fd) {
  switch (WaitFor(fd, events, deadline, cancel_fd)) {
    case Wait::kReady:
      return absl::OkStatus();
    case Wait::kDeadline:
      return absl::DeadlineExceededError("the peer did not answer in time");
    case Wait::kCancelled:
      return absl::CancelledError("this worker is shutting down");
  }
  return absl::OkStatus();
}

bool ReadFull(int fd, char* out, size_t size) {
  while (size > 0) {
    const ssize_t n = recv(fd, out, size, MSG_WAITALL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    out += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

void ShutdownSocket(int fd) {
  if (fd >= 0) shutdown(fd, SHUT_RDWR);
}

void CloseSocket(int fd) {
  if (fd >= 0) close(fd);
}

}  // namespace chorus
