#include "server/worker/dataplane/tcp_listener.h"

#include <arpa/inet.h>
#include <glog/logging.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/tcp_socket.h"
#include "server/worker/dataplane/frame_reader.h"
#include "server/worker/dataplane/recent_groups.h"

namespace chorus {
namespace {

std::string PeerName(const sockaddr_storage& address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&address);
    inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
    return absl::StrCat("[", text, "]:", ntohs(a->sin6_port));
  }
  const auto* a = reinterpret_cast<const sockaddr_in*>(&address);
  inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
  return absl::StrCat(text, ":", ntohs(a->sin_port));
}

}  // namespace

struct TcpListener::Connection {
  int fd = -1;
  std::string peer;
  std::thread thread;

  absl::Mutex mu;
  bool ended ABSL_GUARDED_BY(mu) = false;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  // Set while the inbox holds the connection back.
  bool paused ABSL_GUARDED_BY(mu) = false;
};

absl::StatusOr<std::unique_ptr<TcpListener>> TcpListener::Start(
    const std::string& host, int port, Inbox* inbox) {
  absl::StatusOr<Listener> listener = ListenTcp(host, port);
  if (!listener.ok()) return listener.status();
  std::unique_ptr<TcpListener> out(
      new TcpListener(listener->fd, listener->port, inbox));
  out->accept_thread_ = std::thread([raw = out.get()] { raw->AcceptLoop(); });
  return out;
}

TcpListener::TcpListener(int fd, int port, Inbox* inbox)
    : fd_(fd), port_(port), inbox_(inbox) {}

TcpListener::~TcpListener() { Shutdown(); }

void TcpListener::Shutdown() {
  std::list<std::shared_ptr<Connection>> connections;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    connections.swap(connections_);
  }
  ShutdownSocket(fd_);
  if (accept_thread_.joinable()) accept_thread_.join();
  CloseSocket(fd_);
  for (const auto& connection : connections) {
    {
      absl::MutexLock lock(&connection->mu);
      connection->stopping = true;
    }
    ShutdownSocket(connection->fd);
  }
  for (const auto& connection : connections) {
    if (connection->thread.joinable()) connection->thread.join();
    CloseSocket(connection->fd);
  }
}

void TcpListener::ReapLocked() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    bool ended;
    {
      absl::MutexLock lock(&(*it)->mu);
      ended = (*it)->ended;
    }
    if (!ended) {
      ++it;
      continue;
    }
    (*it)->thread.join();
    CloseSocket((*it)->fd);
    it = connections_.erase(it);
  }
}

void TcpListener::AcceptLoop() {
  while (true) {
    sockaddr_storage address{};
    socklen_t length = sizeof(address);
    const int fd = accept4(fd_, reinterpret_cast<sockaddr*>(&address), &length,
                           SOCK_CLOEXEC);
    const int error = fd < 0 ? errno : 0;
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      CloseSocket(fd);
      return;
    }
    if (fd < 0) {
      if (error == EINTR || error == ECONNABORTED) continue;
      if (error == EMFILE || error == ENFILE || error == ENOBUFS ||
          error == ENOMEM) {
        // Out of descriptors or memory: the connection stays queued; try
        // again a little later (or stop when shut down) rather than spin.
        LOG(WARNING) << "data plane: accept failed: " << std::strerror(error);
        mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                             absl::Milliseconds(100));
        if (stopping_) return;
        continue;
      }
      LOG(ERROR) << "data plane: accept failed, no longer accepting: "
                 << std::strerror(error);
      return;
    }
    ReapLocked();
    auto connection = std::make_shared<Connection>();
    connection->fd = fd;
    connection->peer = PeerName(address);
    connection->thread = std::thread([this, connection] { Serve(connection); });
    connections_.push_back(std::move(connection));
  }
}

namespace {

// Reads a connection's bytes; counts them as the peer's.
class SocketSource final : public ByteSource {
 public:
  explicit SocketSource(int fd) : fd_(fd) {}
  bool Read(char* out, size_t size) override {
    return ReadFull(fd_, out, size);
  }

 private:
  const int fd_;
};

}  // namespace

void TcpListener::Serve(const std::shared_ptr<Connection>& connection) {
  const Inbox::StreamId stream = inbox_->NewStream();
  RecentGroups recent;
  SocketSource source(connection->fd);
  auto on_message = [&](MessageKey key, std::string data) {
    recent.Remember(key);
    {
      absl::MutexLock lock(&connection->mu);
      connection->paused = true;
    }
    auto resume = [connection] {
      absl::MutexLock lock(&connection->mu);
      connection->paused = false;
    };
    const bool more = inbox_->Deliver(stream, key, std::move(data), resume);
    absl::MutexLock lock(&connection->mu);
    if (more) connection->paused = false;
    connection->mu.Await(absl::Condition(
        +[](Connection* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu) {
          return !c->paused || c->stopping;
        },
        connection.get()));
    return !connection->stopping;
  };
  std::string why;
  const StreamEnd end = ReadFrameStream(source, on_message, &why);
  if (end == StreamEnd::kMalformed) {
    LOG(WARNING) << "data plane: closing the connection from "
                 << connection->peer << ": " << why;
  }
  bool stopping;
  {
    absl::MutexLock lock(&connection->mu);
    stopping = connection->stopping;
  }
  if (end != StreamEnd::kGoodbye && !stopping) {
    recent.MarkLost(*inbox_, connection->peer);
  }
  inbox_->CloseStream(stream);
  absl::MutexLock lock(&connection->mu);
  connection->ended = true;
}

}  // namespace chorus
