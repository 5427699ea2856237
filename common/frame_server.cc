#include "common/frame_server.h"

#include <errno.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/adaptive_spin.h"
#include "common/call_frame.h"
#include "common/http_message.h"
#include "common/tls_session.h"

namespace chorus {

namespace {

// The connections with replies held back while the serving thread takes a
// read's frames (FrameServer::TakeFrames); null on every other thread, and
// on the serving thread between reads.
thread_local std::vector<std::shared_ptr<FrameServer::Connection>>* held =
    nullptr;

}  // namespace

struct FrameServer::Connection
    : std::enable_shared_from_this<FrameServer::Connection> {
  Connection(int fd, int epoll_fd, uint64_t max_frame_bytes, bool http)
      : fd(fd), epoll_fd(epoll_fd), http(http), frames(max_frame_bytes) {}

  // Queues `bytes` (encrypted first with TLS) and writes what the socket
  // takes now; the serving thread writes the rest when the socket has room
  // again. On the serving thread while it takes frames, only the first
  // reply to each connection is written at once, the later ones once the
  // frames are taken.
  void Send(absl::string_view bytes) {
    absl::MutexLock lock(&mu);
    if (closed) return;
    if (tls == nullptr) {
      out.append(bytes.data(), bytes.size());
    } else if (!tls->Seal(bytes, &out).ok()) {
      return;  // the serving thread closes it on its next read
    }
    if (held != nullptr) {
      if (holding) return;
      holding = true;
      held->push_back(shared_from_this());
    }
    FlushLocked();
  }

  // Writes the replies held back by Send.
  void Release() {
    absl::MutexLock lock(&mu);
    holding = false;
    if (!closed) FlushLocked();
  }

  // Decrypts `received` into `plain` and sends what the handshake needs.
  // Returns an error when the TLS session failed.
  absl::Status Open(absl::string_view received, std::string* plain) {
    absl::MutexLock lock(&mu);
    const absl::Status opened = tls->Open(received, plain, &out);
    if (!closed) FlushLocked();
    if (opened.ok() && !peer.has_value()) peer = tls->peer();
    return opened;
  }

  // Writes what the socket takes of `out`; returns whether all went.
  bool FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    size_t written = 0;
    while (written < out.size()) {
      const ssize_t n = send(fd, out.data() + written, out.size() - written,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        written += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      // Broken: the serving thread sees the hang-up and closes it.
      written = out.size();
    }
    out.erase(0, written);
    const bool want = !out.empty();
    if (want != want_write) {
      want_write = want;
      epoll_event event{};
      event.events = want ? (EPOLLIN | EPOLLOUT) : EPOLLIN;
      event.data.fd = fd;
      epoll_ctl(epoll_fd, EPOLL_CTL_MOD, fd, &event);
    }
    return !want;
  }

  const int fd;
  const int epoll_fd;
  // Replies are HTTP responses, sent as they are (not in call frames).
  const bool http;
  // Set before the serving thread watches the connection.
  std::unique_ptr<TlsSession> tls;
  // Used by the serving thread only: the hello (or HTTP request head) so
  // far; whether it is whole; whether the connection closes once its
  // replies are written (it reads nothing more meanwhile).
  std::string hello;
  bool greeted = false;
  bool finishing = false;
  CallFrameParser frames;
  // Who the client's certificate names, once its handshake is over.
  std::optional<Identity> peer;

  absl::Mutex mu;
  std::string out ABSL_GUARDED_BY(mu);
  bool want_write ABSL_GUARDED_BY(mu) = false;
  bool closed ABSL_GUARDED_BY(mu) = false;
  // In the serving thread's `held` list.
  bool holding ABSL_GUARDED_BY(mu) = false;
};

namespace {

void SetNonBlocking(int fd) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
}

}  // namespace

void FrameServer::Replier::Send(absl::string_view payload) const {
  std::shared_ptr<Connection> to = to_.lock();
  if (to == nullptr) return;
  if (to->http) {
    to->Send(payload);
    return;
  }
  std::string frame;
  AppendCallFrame(payload, &frame);
  to->Send(frame);
}

absl::StatusOr<std::unique_ptr<FrameServer>> FrameServer::Start(
    int listen_fd, Options options, Handler handler) {
  if (options.tls && !TlsEnabled()) {
    close(listen_fd);
    return absl::FailedPreconditionError(
        absl::StrCat(options.name, ": TLS asked for but not enabled"));
  }
  std::unique_ptr<FrameServer> server(
      new FrameServer(std::move(options), std::move(handler)));
  server->listen_fd_ = listen_fd;
  SetNonBlocking(server->listen_fd_);
  server->epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  server->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (server->epoll_fd_ < 0 || server->wake_fd_ < 0) {
    return absl::InternalError(
        absl::StrCat(server->options_.name, ": ", std::strerror(errno)));
  }
  for (int fd : {server->listen_fd_, server->wake_fd_}) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = fd;
    epoll_ctl(server->epoll_fd_, EPOLL_CTL_ADD, fd, &event);
  }
  server->thread_ = std::thread([s = server.get()] { s->Serve(); });
  return server;
}

FrameServer::~FrameServer() {
  Shutdown();
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void FrameServer::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) < 0) {
    LOG(WARNING) << options_.name << ": cannot wake the serving thread";
  }
  if (thread_.joinable()) thread_.join();
  // New connections are refused from now on instead of left unserved.
  if (listen_fd_ >= 0) close(listen_fd_);
  listen_fd_ = -1;
}

void FrameServer::Serve() {
  std::vector<epoll_event> events(64);
  const int most = static_cast<int>(events.size());
  AdaptiveSpin spin(options_.spin);
  while (true) {
    const int wait_ms = CloseOverdue();
    // The next frame often comes within microseconds (a rank's next call,
    // the other ranks of a match): polling first saves a wake-up.
    int n = 0;
    if (!spin.Spin([&] {
          n = epoll_wait(epoll_fd_, events.data(), most, 0);
          return n != 0;
        })) {
      n = epoll_wait(epoll_fd_, events.data(), most, wait_ms);
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      LOG(ERROR) << options_.name << ": epoll_wait: " << std::strerror(errno);
      break;
    }
    bool stop = false;
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_fd_) {
        stop = true;
      } else if (fd == listen_fd_) {
        Accept();
      } else if (auto it = connections_.find(fd); it != connections_.end()) {
        const std::shared_ptr<Connection> connection = it->second;
        if ((events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0) {
          const Next next = ReadFrom(connection);
          if (next != Next::kKeep) {
            if (next == Next::kFinish) {
              Finish(connection);
            } else {
              Close(fd);
            }
            continue;
          }
        }
        if ((events[i].events & EPOLLOUT) != 0 && Flush(*connection) &&
            connection->finishing) {
          Close(fd);
        }
      }
    }
    if (stop) break;
  }
  std::vector<int> open;
  for (const auto& [fd, connection] : connections_) open.push_back(fd);
  for (int fd : open) Close(fd);
}

void FrameServer::Accept() {
  while (true) {
    const int fd =
        accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (errno == EMFILE || errno == ENFILE) {
        // Out of descriptors: the pending connection would wake this
        // thread forever. Stop watching the listener until one closes.
        LOG(WARNING) << options_.name
                     << ": out of file descriptors; not accepting until a "
                        "connection closes";
        epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
        accept_paused_ = true;
      }
      return;  // EAGAIN: none left
    }
    // Replies are small and wanted at once (fails harmlessly on a Unix
    // socket).
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto connection = std::make_shared<Connection>(
        fd, epoll_fd_, options_.max_frame_bytes,
        options_.framing == Framing::kHttpRequests);
    if (options_.tls) {
      absl::StatusOr<std::unique_ptr<TlsSession>> tls = TlsSession::Accept();
      if (!tls.ok()) {
        LOG(WARNING) << options_.name
                     << ": closed a connection: " << tls.status().message();
        close(fd);
        continue;
      }
      connection->tls = *std::move(tls);
    }
    if (ungreeted_ >= options_.max_ungreeted) CloseOldestUngreeted();
    connections_[fd] = connection;
    ++ungreeted_;
    greeting_.emplace_back(absl::Now() + options_.greeting_timeout, connection);
    open_connections_.store(connections_.size(), std::memory_order_relaxed);
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event);
  }
}

bool FrameServer::Flush(Connection& connection) {
  absl::MutexLock lock(&connection.mu);
  return !connection.closed && connection.FlushLocked();
}

void FrameServer::Finish(const std::shared_ptr<Connection>& connection) {
  if (Flush(*connection)) {
    Close(connection->fd);
    return;
  }
  // Closed once its replies are written, or when this runs out.
  lingering_.emplace_back(absl::Now() + options_.greeting_timeout, connection);
}

FrameServer::Next FrameServer::ReadFrom(
    const std::shared_ptr<Connection>& connection) {
  char buffer[64 << 10];
  // At most this much per wake-up, so one busy connection does not starve
  // the others (epoll reports it again while data is left).
  size_t budget = 1 << 20;
  std::string plain;
  while (budget > 0) {
    const ssize_t n = recv(connection->fd, buffer, sizeof(buffer), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Next::kKeep;
    if (n <= 0) return Next::kClose;  // closed by the peer, or failed
    budget -= std::min(budget, static_cast<size_t>(n));
    absl::string_view bytes(buffer, static_cast<size_t>(n));
    if (connection->tls != nullptr) {
      plain.clear();
      if (absl::Status opened = connection->Open(bytes, &plain); !opened.ok()) {
        LOG(WARNING) << options_.name
                     << ": closed a connection: " << opened.message();
        return Next::kClose;
      }
      bytes = plain;
    }
    // A finishing connection reads only to see its client close.
    if (!connection->finishing && !Take(connection, bytes)) {
      return connection->finishing ? Next::kFinish : Next::kClose;
    }
    // A short read took all there was: epoll reports the connection again
    // when more comes, so a read that would find nothing is spared.
    if (static_cast<size_t>(n) < sizeof(buffer)) return Next::kKeep;
  }
  return Next::kKeep;
}

bool FrameServer::Take(const std::shared_ptr<Connection>& connection,
                       absl::string_view bytes) {
  if (options_.framing == Framing::kHttpRequests) {
    return TakeHttpHead(connection, bytes);
  }
  const std::string& hello = options_.hello;
  if (!connection->greeted) {
    const size_t take =
        std::min(bytes.size(), hello.size() - connection->hello.size());
    connection->hello.append(bytes.data(), take);
    bytes.remove_prefix(take);
    if (!absl::StartsWith(hello, connection->hello)) {
      return false;  // not a Chorus client: nothing to say to it
    }
    if (connection->hello.size() < hello.size()) return true;
    connection->greeted = true;
    --ungreeted_;
  }
  connection->frames.Append(bytes);
  return TakeFrames(connection);
}

bool FrameServer::TakeHttpHead(const std::shared_ptr<Connection>& connection,
                               absl::string_view bytes) {
  // Bytes after the head (a body, a pipelined request) are not read.
  const size_t before = connection->hello.size();
  connection->hello.append(
      bytes.data(), std::min(bytes.size(), kMaxHttpHeadBytes + 1 - before));
  const size_t end = HttpHeadEnd(connection->hello);
  if (end == 0) {
    // Not whole yet; one over the limit is closed with nothing said.
    return connection->hello.size() <= kMaxHttpHeadBytes;
  }
  connection->hello.resize(end);
  connection->greeted = true;
  --ungreeted_;
  const Identity* peer =
      connection->peer.has_value() ? &*connection->peer : nullptr;
  // One request per connection: it closes once the response is written.
  handler_(std::move(connection->hello),
           Replier{std::weak_ptr<Connection>(connection)}, peer);
  connection->finishing = true;
  return false;
}

bool FrameServer::TakeFrames(const std::shared_ptr<Connection>& connection) {
  std::vector<std::shared_ptr<Connection>> replied;
  held = &replied;
  const bool keep = HandleFrames(connection);
  held = nullptr;
  for (const std::shared_ptr<Connection>& to : replied) to->Release();
  return keep;
}

bool FrameServer::HandleFrames(const std::shared_ptr<Connection>& connection) {
  const Replier reply{std::weak_ptr<Connection>(connection)};
  std::string payload;
  while (true) {
    absl::StatusOr<bool> next = connection->frames.Next(&payload);
    if (!next.ok()) {
      reply.Send(options_.error_payload(next.status()));
      connection->finishing = true;
      return false;
    }
    if (!*next) return true;
    const Identity* peer =
        connection->peer.has_value() ? &*connection->peer : nullptr;
    if (!handler_(std::move(payload), reply, peer)) {
      connection->finishing = true;
      return false;
    }
    payload.clear();
  }
}

bool FrameServer::IsOpen(const std::shared_ptr<Connection>& connection) {
  // Its descriptor not yet another connection's.
  if (connection == nullptr) return false;
  auto open = connections_.find(connection->fd);
  return open != connections_.end() && open->second == connection;
}

void FrameServer::CloseOldestUngreeted() {
  while (!greeting_.empty()) {
    const std::shared_ptr<Connection> oldest = greeting_.front().second.lock();
    greeting_.pop_front();
    if (!IsOpen(oldest) || oldest->greeted) continue;
    LOG_EVERY_N(WARNING, 100)
        << options_.name << ": " << options_.max_ungreeted
        << " connections have not greeted yet; closed the oldest";
    Close(oldest->fd);
    return;
  }
}

int FrameServer::CloseOverdue() {
  const absl::Time now = absl::Now();
  int wait_ms = -1;
  // Rounded up, so the wake-up comes after the deadline.
  auto until = [&](absl::Time deadline) {
    const int ms = static_cast<int>(
        absl::ToInt64Milliseconds(deadline - now + absl::Milliseconds(1)));
    wait_ms = wait_ms < 0 ? ms : std::min(wait_ms, ms);
  };
  while (!greeting_.empty()) {
    auto& [deadline, waiting] = greeting_.front();
    const std::shared_ptr<Connection> connection = waiting.lock();
    if (IsOpen(connection) && !connection->greeted) {
      if (deadline > now) {
        until(deadline);
        break;
      }
      LOG(WARNING) << options_.name << ": closed a connection that sent no "
                   << (options_.tls && !connection->peer.has_value()
                           ? "TLS handshake"
                           : "hello")
                   << " within " << options_.greeting_timeout;
      Close(connection->fd);
    }
    greeting_.pop_front();
  }
  while (!lingering_.empty()) {
    auto& [deadline, waiting] = lingering_.front();
    const std::shared_ptr<Connection> connection = waiting.lock();
    if (IsOpen(connection)) {
      if (deadline > now) {
        until(deadline);
        break;
      }
      Close(connection->fd);  // its client does not read its replies
    }
    lingering_.pop_front();
  }
  return wait_ms;
}

void FrameServer::Close(int fd) {
  auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  if (!it->second->greeted) --ungreeted_;
  {
    absl::MutexLock lock(&it->second->mu);
    it->second->closed = true;
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    close(fd);
  }
  connections_.erase(it);
  open_connections_.store(connections_.size(), std::memory_order_relaxed);
  if (accept_paused_ && listen_fd_ >= 0) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = listen_fd_;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &event);
    accept_paused_ = false;
  }
}

}  // namespace chorus
