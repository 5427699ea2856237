#include "server/worker/dataplane/tcp_peer_pool.h"

#include <grpcpp/client_context.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/collective_metrics.h"
#include "common/grpc_status.h"
#include "common/net.h"
#include "common/revocation.h"
#include "common/tcp_socket.h"
#include "server/worker/dataplane/wire_frame.h"

namespace chorus {
namespace {

// How long opening a connection waits, the question for the port included.
// A failed gRPC connection attempt is retried after the channel's backoff
// (100 ms to 1 s); a peer still unreachable after this is reported rather
// than waited for.
constexpr absl::Duration kConnectTimeout = absl::Seconds(2);

// How long a goodbye frame may take to leave when closing.
constexpr absl::Duration kGoodbyeTimeout = absl::Milliseconds(200);

// ABORTED: a send to `address` ended because `group` was aborted.
absl::Status SendAborted(const std::string& address, const std::string& group) {
  return absl::AbortedError(absl::StrCat(
      "data-plane send to ", address, " ended: group ", group, " was aborted"));
}

}  // namespace

TcpPeerPool::TcpPeerPool(std::function<absl::Duration()> dead_peer_timeout)
    : dead_peer_timeout_(std::move(dead_peer_timeout)),
      shutdown_fd_(eventfd(0, EFD_CLOEXEC)) {}

TcpPeerPool::~TcpPeerPool() {
  Shutdown();
  CloseSocket(shutdown_fd_);
}

TcpPeerPool::Peer* TcpPeerPool::GetPeer(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Peer>& peer = peers_[address];
  if (peer == nullptr) {
    peer = std::make_unique<Peer>();
    peer->address = address;
    peer->stub = v1::Peer::NewStub(MakeChannel(address, Role::kWorker));
  }
  return peer.get();
}

PeerRegistration TcpPeerPool::Learned(Peer& peer) {
  absl::MutexLock lock(&peer.learned_mu);
  return peer.learned;
}

void TcpPeerPool::DropIfStaleLocked(Peer& peer) {
  if (peer.fd >= 0 && peer.connected_as != Learned(peer)) {
    // The old process is gone, or the coordinator evicted it and its
    // connection may sit in a partition's retransmission backoff.
    CloseLocked(peer, /*goodbye=*/false);
  } else if (peer.tls != nullptr &&
             !CheckNotRevoked(peer.tls->peer().certificate_id).ok()) {
    // Its certificate was revoked since; opening a connection again
    // refuses it (TlsStream::Connect).
    CloseLocked(peer, /*goodbye=*/false);
  }
}

void TcpPeerPool::LearnPeer(const std::string& address,
                            const PeerRegistration& identity) {
  Peer* peer = GetPeer(address);
  {
    absl::MutexLock lock(&peer->learned_mu);
    if (peer->learned == identity) return;
    peer->learned = identity;
  }
  if (peer->mu.TryLock()) {
    DropIfStaleLocked(*peer);
    peer->mu.Unlock();
  }
}

absl::Status TcpPeerPool::OpenLocked(Peer& peer, absl::Time deadline) {
  const absl::Time give_up = std::min(deadline, absl::Now() + kConnectTimeout);
  const PeerRegistration identity = Learned(peer);
  uint32_t port = identity.data_port;
  if (port == 0) {
    // A peer that registered no data port: asked on every (re)connection,
    // since a restarted peer listens elsewhere.
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(give_up));
    context.set_wait_for_ready(true);
    v1::DataPlaneInfo info;
    absl::Status asked = FromGrpcStatus(
        peer.stub->DataPlane(&context, v1::DataPlaneRequest(), &info));
    if (!asked.ok()) {
      return absl::UnavailableError(absl::IsDeadlineExceeded(asked)
                                        ? "cannot connect"
                                        : std::string(asked.message()));
    }
    if (info.tcp_port() == 0) {
      return absl::UnavailableError("the peer has no TCP data plane");
    }
    port = info.tcp_port();
  }
  absl::StatusOr<HostPort> where = SplitHostPort(peer.address);
  if (!where.ok()) return where.status();
  absl::StatusOr<int> fd =
      ConnectTcp(where->host, static_cast<int>(port), give_up);
  if (!fd.ok()) return absl::UnavailableError(fd.status().message());
  if (dead_peer_timeout_ != nullptr) {
    SetDeadPeerTimeout(*fd, dead_peer_timeout_());
  }
  peer.fd = *fd;
  peer.connected_as = identity;
  DataPlaneConnections("out")->Add();
  if (TlsEnabled()) {
    absl::StatusOr<std::unique_ptr<TlsStream>> tls = TlsStream::Connect(
        *fd, Role::kWorker, give_up, shutdown_fd_, identity.name);
    if (!tls.ok()) {
      CloseLocked(peer, /*goodbye=*/false);
      return absl::UnavailableError(tls.status().message());
    }
    peer.tls = *std::move(tls);
  }
  const absl::string_view hello = kWireHello;
  absl::Status sent = WriteFrameLocked(peer, &hello, 1, give_up, -1);
  if (!sent.ok()) {
    CloseLocked(peer, /*goodbye=*/false);
    return absl::UnavailableError(sent.message());
  }
  return absl::OkStatus();
}

absl::Status TcpPeerPool::WriteLocked(Peer& peer, const MessageKey& key,
                                      absl::string_view data,
                                      absl::Time deadline) {
  absl::StatusOr<std::string> header = EncodeFrameHeader(key, data.size());
  if (!header.ok()) return header.status();
  // Without TLS, header and data leave in one sendmsg, the data from the
  // caller's buffer.
  const absl::string_view parts[2] = {*header, data};
  return WriteFrameLocked(peer, parts, 2, deadline, shutdown_fd_);
}

absl::Status TcpPeerPool::WriteCuttableLocked(Peer& peer, const MessageKey& key,
                                              absl::string_view data,
                                              absl::Time deadline, bool* cut) {
  {
    absl::MutexLock writing(&peer.writing_mu);
    peer.writing_fd = peer.fd;
    peer.writing_group = key.group;
    peer.writing_epoch = key.epoch;
    peer.cut = false;
  }
  // An abort that came before the write was marked above cut nothing; it
  // is in the list by now.
  if (AbortedLocked(peer, key)) {
    absl::MutexLock writing(&peer.writing_mu);
    peer.writing_fd = -1;
    *cut = false;
    return absl::AbortedError(
        absl::StrCat("group ", key.group, " was aborted; nothing sent"));
  }
  absl::Status written = WriteLocked(peer, key, data, deadline);
  absl::MutexLock writing(&peer.writing_mu);
  peer.writing_fd = -1;
  *cut = peer.cut;
  return written;
}

bool TcpPeerPool::AbortedLocked(Peer& peer, const MessageKey& key) {
  const uint64_t aborts = aborts_.load(std::memory_order_acquire);
  if (aborts == 0) return false;
  if (aborts == peer.checked_aborts && key.epoch == peer.checked_epoch &&
      key.group == peer.checked_group) {
    return peer.checked_aborted;
  }
  peer.checked_aborts = aborts;
  peer.checked_epoch = key.epoch;
  if (peer.checked_group != key.group) peer.checked_group = key.group;
  peer.checked_aborted = WasAborted(key.group, key.epoch);
  return peer.checked_aborted;
}

bool TcpPeerPool::WasAborted(const std::string& group, uint64_t epoch) {
  absl::MutexLock lock(&aborted_mu_);
  return std::any_of(aborted_.begin(), aborted_.end(), [&](const auto& a) {
    return a.second == epoch && a.first == group;
  });
}

void TcpPeerPool::AbortGroup(const std::string& group, uint64_t epoch) {
  {
    // Before the scan below: a send that marks its write after the scan
    // finds the group here.
    absl::MutexLock lock(&aborted_mu_);
    aborted_.emplace_back(group, epoch);
    if (aborted_.size() > kAbortsRemembered) aborted_.pop_front();
    aborts_.fetch_add(1, std::memory_order_release);
  }
  absl::MutexLock lock(&mu_);
  for (auto& [address, peer] : peers_) {
    absl::MutexLock writing(&peer->writing_mu);
    if (peer->writing_fd >= 0 && peer->writing_epoch == epoch &&
        peer->writing_group == group) {
      peer->cut = true;
      // Wakes the writer's wait; the writer closes the socket.
      shutdown(peer->writing_fd, SHUT_RDWR);
    }
  }
}

absl::Status TcpPeerPool::WriteFrameLocked(Peer& peer,
                                           const absl::string_view* parts,
                                           size_t count, absl::Time deadline,
                                           int cancel_fd) {
  if (peer.tls != nullptr) {
    return peer.tls->WriteAll(parts, count, deadline, cancel_fd);
  }
  return WriteAll(peer.fd, parts, count, deadline, cancel_fd);
}

void TcpPeerPool::CloseLocked(Peer& peer, bool goodbye) {
  if (peer.fd < 0) return;
  if (goodbye) {
    const std::string frame = EncodeGoodbyeFrame();
    const absl::string_view part = frame;
    WriteFrameLocked(peer, &part, 1, absl::Now() + kGoodbyeTimeout, -1)
        .IgnoreError();
  }
  peer.tls.reset();
  CloseSocket(peer.fd);
  peer.fd = -1;
  DataPlaneConnections("out")->Sub();
}

absl::Status TcpPeerPool::Send(const std::string& address,
                               const MessageKey& key, absl::string_view data,
                               absl::Time deadline) {
  if (shut_down_.load()) {
    return absl::UnavailableError(
        absl::StrCat("data-plane connection to ", address,
                     ": this worker is shutting down"));
  }
  Peer* peer = GetPeer(address);
  absl::MutexLock lock(&peer->mu);
  std::string why;
  // A connection the peer closed since the last collective (the peer
  // restarted) takes frames without complaint and drops them: replace it
  // first. Checked once per collective, not per frame. This is not one of
  // the two attempts below.
  const bool new_collective = peer->last_sequence != key.sequence ||
                              peer->last_epoch != key.epoch ||
                              peer->last_group != key.group;
  if (new_collective) DropIfStaleLocked(*peer);
  if (peer->fd >= 0 && new_collective && PeerClosed(peer->fd)) {
    CloseLocked(*peer, /*goodbye=*/false);
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (peer->fd < 0) {
      absl::Status opened = OpenLocked(*peer, deadline);
      if (!opened.ok()) {
        why = std::string(opened.message());
        break;
      }
    }
    bool cut = false;
    absl::Status written =
        WriteCuttableLocked(*peer, key, data, deadline, &cut);
    // Aborted before anything was written: the connection is intact.
    if (absl::IsAborted(written)) return written;
    if (!written.ok() && cut) {
      CloseLocked(*peer, /*goodbye=*/false);
      return SendAborted(address, key.group);
    }
    if (written.ok()) {
      if (new_collective) {
        peer->last_group = key.group;
        peer->last_epoch = key.epoch;
        peer->last_sequence = key.sequence;
      }
      return written;
    }
    if (absl::IsInvalidArgument(written)) return written;
    // A frame cut short cannot be resumed: the receiver drops the
    // connection and its data, and so does this end.
    CloseLocked(*peer, /*goodbye=*/false);
    if (absl::IsCancelled(written)) {
      return absl::UnavailableError(absl::StrCat(
          "data-plane connection to ", address, ": ", written.message()));
    }
    if (absl::IsDeadlineExceeded(written)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "data-plane connection to ", address, ": ", written.message()));
    }
    why = std::string(written.message());
    if (IsDeadPeerTimeout(written)) {
      // The dead-peer timeout: the peer acknowledged nothing for a lease.
      // A fresh connection would wait for it as long, and its connect
      // could not be cut by AbortGroup().
      return absl::UnavailableError(absl::StrCat(
          "data-plane connection to ", address,
          " failed: the peer acknowledged nothing within the dead-peer "
          "timeout (",
          why, ")"));
    }
    // The connection broke (the peer restarted?); try a fresh one once,
    // unless the group was aborted meanwhile.
    if (AbortedLocked(*peer, key)) {
      return SendAborted(address, key.group);
    }
  }
  return absl::UnavailableError(
      absl::StrCat("data-plane connection to ", address, " failed: ", why));
}

void TcpPeerPool::Shutdown() {
  shut_down_.store(true);
  if (shutdown_fd_ >= 0) {
    const uint64_t one = 1;
    // Level-triggered and never read: every later wait sees it too.
    if (write(shutdown_fd_, &one, sizeof(one)) < 0) {
      // Only fails if the counter would overflow; it is readable then.
    }
  }
  absl::MutexLock lock(&mu_);
  for (auto& [address, peer] : peers_) {
    absl::MutexLock peer_lock(&peer->mu);
    CloseLocked(*peer, /*goodbye=*/true);
  }
  peers_.clear();
}

}  // namespace chorus
