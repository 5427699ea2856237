#include "server/worker/dataplane/tcp_listener.h"

#include <arpa/inet.h>
#include <glog/logging.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/authorization.h"
#include "common/collective_metrics.h"
#include "common/revocation.h"
#include "common/tcp_socket.h"
#include "common/tls_stream.h"
#include "common/transport_security.h"
#include "server/worker/dataplane/frame_reader.h"
#include "server/worker/dataplane/recent_groups.h"

namespace chorus {
namespace {

// How long a connection may take to finish its whole TLS handshake; one
// that stalls or trickles is closed rather than holding its thread.
constexpr absl::Duration kHandshakeTimeout = absl::Seconds(5);

// How many connections may be in their TLS handshake at once (each holds a
// thread); a connection beyond that drops the oldest.
constexpr size_t kMaxHandshakes = 64;

// How long a frame for a group epoch this worker has not joined yet waits
// for the join's reply (which a peer's reply can beat by milliseconds).
constexpr absl::Duration kMembershipWait = absl::Seconds(30);

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

// Each connection counts itself as open while it exists.
struct TcpListener::Connection {
  Connection() { DataPlaneConnections("in")->Add(); }
  ~Connection() { DataPlaneConnections("in")->Sub(); }

  int fd = -1;
  std::string peer;
  std::thread thread;
  // Set once the TLS handshake is over (or at once without TLS).
  std::atomic<bool> shaken{false};
  // Set when the handshake was ended to make room for a newer one.
  std::atomic<bool> dropped{false};

  absl::Mutex mu;
  bool ended ABSL_GUARDED_BY(mu) = false;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  // Set while the inbox holds the connection back.
  bool paused ABSL_GUARDED_BY(mu) = false;
  // The directory's verdict on a frame waiting for its epoch.
  std::optional<PeerDirectory::Verdict> admitted ABSL_GUARDED_BY(mu);
};

absl::StatusOr<std::unique_ptr<TcpListener>> TcpListener::Start(
    const std::string& host, int port, Inbox* inbox, PeerDirectory* directory) {
  if (TlsEnabled() && directory == nullptr) {
    return absl::InvalidArgumentError(
        "a TLS data plane needs the directory of group members");
  }
  absl::StatusOr<Listener> listener = ListenTcp(host, port);
  if (!listener.ok()) {
    return absl::Status(
        listener.status().code(),
        absl::StrCat("data plane: ", listener.status().message()));
  }
  std::unique_ptr<TcpListener> out(
      new TcpListener(listener->fd, listener->port, inbox, directory));
  out->accept_thread_ = std::thread([raw = out.get()] { raw->AcceptLoop(); });
  return out;
}

TcpListener::TcpListener(int fd, int port, Inbox* inbox,
                         PeerDirectory* directory)
    : fd_(fd), port_(port), inbox_(inbox), directory_(directory) {}

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

void TcpListener::MakeRoomForHandshakeLocked(
    const std::shared_ptr<Connection>& connection) {
  handshaking_.erase(
      std::remove_if(handshaking_.begin(), handshaking_.end(),
                     [](const std::weak_ptr<Connection>& weak) {
                       const std::shared_ptr<Connection> held = weak.lock();
                       return held == nullptr || held->shaken.load();
                     }),
      handshaking_.end());
  if (handshaking_.size() >= kMaxHandshakes) {
    // Its handshake ends at once; its thread ends the connection.
    const std::shared_ptr<Connection> oldest = handshaking_.front().lock();
    LOG_EVERY_N(WARNING, 100)
        << "data plane: " << kMaxHandshakes << " connections are in their "
        << "TLS handshake; dropping the oldest, from " << oldest->peer;
    oldest->dropped = true;
    ShutdownSocket(oldest->fd);
    handshaking_.pop_front();
  }
  handshaking_.push_back(connection);
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
    if (TlsEnabled()) MakeRoomForHandshakeLocked(connection);
    connection->thread = std::thread([this, connection] { Serve(connection); });
    connections_.push_back(std::move(connection));
  }
}

namespace {

// Reads a connection's bytes, through TLS when `tls` is set.
class SocketSource final : public ByteSource {
 public:
  SocketSource(int fd, TlsStream* tls) : fd_(fd), tls_(tls) {}
  bool Read(char* out, size_t size) override {
    if (tls_ != nullptr) return tls_->ReadFull(out, size);  // buffers itself
    // A frame's header, group and small payload usually came in one
    // segment: one receive into the buffer serves all three.
    const size_t buffered = std::min(size, end_ - begin_);
    std::memcpy(out, buffer_.data() + begin_, buffered);
    begin_ += buffered;
    out += buffered;
    size -= buffered;
    if (size == 0) return true;
    // A large payload goes straight to where it belongs.
    if (size >= kBufferBytes / 2) return ReadFull(fd_, out, size);
    begin_ = 0;
    end_ = 0;
    while (end_ < size) {
      const ssize_t n =
          recv(fd_, buffer_.data() + end_, kBufferBytes - end_, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      end_ += static_cast<size_t>(n);
    }
    std::memcpy(out, buffer_.data(), size);
    begin_ = size;
    return true;
  }

 private:
  static constexpr size_t kBufferBytes = 64 << 10;
  const int fd_;
  TlsStream* const tls_;
  // Bytes received and not yet read: buffer_[begin_, end_).
  std::vector<char> buffer_ = std::vector<char>(kBufferBytes);
  size_t begin_ = 0;
  size_t end_ = 0;
};

}  // namespace

bool TcpListener::Admit(const std::shared_ptr<Connection>& connection,
                        const std::string& caller, const MessageKey& key) {
  PeerDirectory::Verdict verdict;
  const uint64_t token =
      directory_->WaitFor(key.group, key.epoch, key.from_rank, caller, &verdict,
                          [connection](PeerDirectory::Verdict known) {
                            absl::MutexLock lock(&connection->mu);
                            connection->admitted = known;
                          });
  if (token != 0) {
    std::optional<PeerDirectory::Verdict> known;
    bool stopping;
    {
      absl::MutexLock lock(&connection->mu);
      connection->mu.AwaitWithTimeout(
          absl::Condition(
              +[](Connection* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu) {
                return c->admitted.has_value() || c->stopping;
              },
              connection.get()),
          kMembershipWait);
      known = connection->admitted;
      connection->admitted.reset();
      stopping = connection->stopping;
    }
    if (!known.has_value()) {
      // Stopping, or this worker never learned the epoch: refuse. A verdict
      // that arrives after this is dropped with the connection.
      directory_->Cancel(token);
      if (!stopping) {
        LOG(WARNING) << "data plane: closing the connection from "
                     << connection->peer << ": group " << key.group << " epoch "
                     << key.epoch << " is not one of this "
                     << "worker's after " << kMembershipWait;
      }
      return false;
    }
    verdict = *known;
  }
  if (verdict == PeerDirectory::Verdict::kMember) return true;
  LOG(WARNING) << "data plane: closing the connection from " << connection->peer
               << ": worker \"" << caller << "\" does not hold rank "
               << key.from_rank << " of group " << key.group << " at epoch "
               << key.epoch;
  return false;
}

bool TcpListener::StillTrusted(const Connection& connection,
                               const TlsStream& tls, uint64_t* checked) {
  if (*checked == RevocationGeneration()) return true;
  *checked = RevocationGeneration();
  const absl::Status kept = CheckNotRevoked(tls.peer().certificate_id);
  if (kept.ok()) return true;
  LOG(WARNING) << "data plane: closing the connection from " << connection.peer
               << ": " << kept.message();
  return false;
}

void TcpListener::Serve(const std::shared_ptr<Connection>& connection) {
  std::unique_ptr<TlsStream> tls;
  if (TlsEnabled()) {
    absl::StatusOr<std::unique_ptr<TlsStream>> accepted =
        TlsStream::Accept(connection->fd, absl::Now() + kHandshakeTimeout);
    connection->shaken = true;
    if (accepted.ok()) {
      if (absl::Status allowed =
              Authorize("data port: frames", (*accepted)->peer());
          !allowed.ok()) {
        accepted = allowed;
      }
    }
    if (!accepted.ok()) {
      // One line in ten under a flood; the drops were counted already.
      if (!connection->dropped) {
        LOG_EVERY_N(WARNING, 10)
            << "data plane: refused the connection from " << connection->peer
            << " (" << google::COUNTER
            << " refused so far): " << accepted.status().message();
      }
      EndConnection(*connection);
      return;
    }
    tls = *std::move(accepted);
  }
  const Inbox::StreamId stream = inbox_->NewStream();
  RecentGroups recent;
  SocketSource source(connection->fd, tls.get());
  PeerDirectory::Admitted admitted;
  // The revocation list this connection was last checked against.
  uint64_t checked = RevocationGeneration();
  auto on_message = [&](MessageKey key, std::string data) {
    if (tls != nullptr && !StillTrusted(*connection, *tls, &checked)) {
      return false;
    }
    if (tls != nullptr &&
        !admitted.Covers(key.group, key.epoch, key.from_rank)) {
      if (!Admit(connection, tls->peer().name, key)) return false;
      admitted.Set(key.group, key.epoch, key.from_rank);
    }
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
  const StreamEnd end =
      ReadFrameStream(source, on_message, &why, &inbox_->payloads());
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
    recent.MarkLost(*inbox_, directory_, connection->peer);
  }
  inbox_->CloseStream(stream);
  EndConnection(*connection);
}

void TcpListener::EndConnection(Connection& connection) {
  // The peer sees the end now; the descriptor is closed when reaped.
  ShutdownSocket(connection.fd);
  absl::MutexLock lock(&connection.mu);
  connection.ended = true;
}

}  // namespace chorus
