#include "server/worker/dataplane/tcp_listener.h"

#include <arpa/inet.h>
#include <glog/logging.h>
#include <netinet/in.h>
#include <poll.h>
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
#include "server/worker/dataplane/socket_source.h"

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

  // Held by whoever reads the socket: the connection's thread, or a rank's
  // thread that reads the frame it waits for (ReadForWaiter). Taken before
  // `mu` when both are.
  absl::Mutex read_mu ABSL_ACQUIRED_BEFORE(mu);
  // Set when the connection's thread stopped reading.
  bool reads_over ABSL_GUARDED_BY(read_mu) = false;
  std::unique_ptr<SocketSource> source ABSL_GUARDED_BY(read_mu);
  RecentGroups recent ABSL_GUARDED_BY(read_mu);
  Inbox::StreamId stream = 0;
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
  connection->stream = inbox_->NewStream();
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
    if (Deliver(connection, *inbox_, key, std::move(data))) return true;
    absl::MutexLock lock(&connection->mu);
    connection->mu.Await(absl::Condition(
        +[](Connection* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu) {
          return !c->paused || c->stopping;
        },
        connection.get()));
    return !connection->stopping;
  };
  std::string why;
  const StreamEnd end = ReadFrames(connection, tls.get(), on_message, &why);
  if (end == StreamEnd::kMalformed) {
    LOG(WARNING) << "data plane: closing the connection from "
                 << connection->peer << ": " << why;
  }
  bool stopping;
  {
    absl::MutexLock lock(&connection->mu);
    stopping = connection->stopping;
  }
  {
    absl::MutexLock lock(&connection->read_mu);
    connection->reads_over = true;
    if (end != StreamEnd::kGoodbye && !stopping) {
      connection->recent.MarkLost(*inbox_, directory_, connection->peer);
    }
  }
  inbox_->CloseStream(connection->stream);
  EndConnection(*connection);
}

StreamEnd TcpListener::ReadFrames(const std::shared_ptr<Connection>& connection,
                                  TlsStream* tls,
                                  const FrameCallback& on_message,
                                  std::string* why) {
  Connection& c = *connection;
  {
    absl::MutexLock lock(&c.read_mu);
    c.source = std::make_unique<SocketSource>(c.fd, tls);
    if (std::optional<StreamEnd> end = ReadHello(*c.source, why)) return *end;
  }
  if (tls == nullptr) {
    inbox_->SetStreamPoll(c.stream, [connection, inbox = inbox_] {
      return ReadForWaiter(connection, *inbox);
    });
  }
  while (true) {
    {
      // A frame a waiting rank read may have filled the stream's share.
      absl::MutexLock lock(&c.mu);
      c.mu.Await(absl::Condition(
          +[](Connection* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu) {
            return !c->paused || c->stopping;
          },
          &c));
      if (c.stopping) return StreamEnd::kStopped;
    }
    {
      absl::MutexLock lock(&c.read_mu);
      if (c.source->HasBuffered() || ReadableNow(c.fd)) {
        MessageKey key;
        std::string data;
        if (std::optional<StreamEnd> end =
                ReadFrame(*c.source, &key, &data, why, &inbox_->payloads())) {
          return *end;
        }
        // Delivered under the read lock: frames reach the inbox in order.
        if (!on_message(key, std::move(data))) return StreamEnd::kStopped;
        c.recent.Remember(key);
        continue;
      }
    }
    // Nothing to read: wait for the socket (a waiting rank may read first).
    (void)WaitForSocket(c.fd, POLLIN, absl::InfiniteFuture());
  }
}

bool TcpListener::Deliver(const std::shared_ptr<Connection>& connection,
                          Inbox& inbox, const MessageKey& key,
                          std::string data) {
  {
    absl::MutexLock lock(&connection->mu);
    connection->paused = true;
  }
  auto resume = [connection] {
    absl::MutexLock lock(&connection->mu);
    connection->paused = false;
  };
  if (!inbox.Deliver(connection->stream, key, std::move(data), resume)) {
    return false;
  }
  absl::MutexLock lock(&connection->mu);
  connection->paused = false;
  return true;
}

Inbox::PollResult TcpListener::ReadForWaiter(
    const std::shared_ptr<Connection>& connection, Inbox& inbox) {
  using PollResult = Inbox::PollResult;
  Connection& c = *connection;
  // Its thread is reading it.
  if (!c.read_mu.TryLock()) return PollResult::kLeftToStream;
  bool paused;
  {
    absl::MutexLock lock(&c.mu);
    paused = c.paused || c.stopping;
  }
  PollResult result = PollResult::kLeftToStream;
  if (!c.reads_over && !paused) {
    switch (c.source->ReceiveWholeFrame()) {
      case SocketSource::Intake::kWholeFrame: {
        MessageKey key;
        std::string data;
        // The whole frame is buffered: this neither blocks nor fails.
        if (!ReadFrame(*c.source, &key, &data, nullptr, nullptr)) {
          c.recent.Remember(key);
          Deliver(connection, inbox, key, std::move(data));
          result = PollResult::kDelivered;
        }
        break;
      }
      case SocketSource::Intake::kNothingYet:
        result = PollResult::kNothingYet;
        break;
      case SocketSource::Intake::kLeftToReader:
        break;
    }
  }
  c.read_mu.Unlock();
  return result;
}

void TcpListener::EndConnection(Connection& connection) {
  // The peer sees the end now; the descriptor is closed when reaped.
  ShutdownSocket(connection.fd);
  absl::MutexLock lock(&connection.mu);
  connection.ended = true;
}

}  // namespace chorus
