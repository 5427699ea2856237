#include "server/worker/dataplane/peer_pool.h"

#include <grpcpp/client_context.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/common/grpc_status.h"
#include "server/common/net.h"
#include "server/common/tcp_socket.h"
#include "server/worker/dataplane/wire_frame.h"

namespace chorus {
namespace {

// Streams are long-lived and shared by every collective between two
// workers; each still carries a deadline, far enough out that ending it
// (which the receiver reads as a lost peer) never interrupts a job.
constexpr absl::Duration kStreamLifetime = absl::Hours(24 * 365);

// How long opening a connection waits. A failed gRPC connection attempt is
// retried after the channel's backoff (100 ms to 1 s); a peer still
// unreachable after this is reported rather than waited for.
constexpr absl::Duration kConnectTimeout = absl::Seconds(2);

// How long a goodbye frame may take to leave when closing.
constexpr absl::Duration kGoodbyeTimeout = absl::Milliseconds(200);

}  // namespace

PeerPool::PeerPool(bool use_tcp)
    : use_tcp_(use_tcp), shutdown_fd_(eventfd(0, EFD_CLOEXEC)) {}

PeerPool::~PeerPool() {
  Shutdown();
  CloseSocket(shutdown_fd_);
}

PeerPool::Peer* PeerPool::GetPeer(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Peer>& peer = peers_[address];
  if (peer == nullptr) {
    peer = std::make_unique<Peer>();
    peer->address = address;
    peer->channel = MakeChannel(address);
    peer->stub = v1::Peer::NewStub(peer->channel);
  }
  return peer.get();
}

absl::Status PeerPool::OpenLocked(Peer& peer, absl::Time deadline) {
  const absl::Time give_up = std::min(deadline, absl::Now() + kConnectTimeout);
  if (use_tcp_) {
    // Asked on every (re)connection: a restarted peer listens elsewhere.
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(give_up));
    context.set_wait_for_ready(true);
    v1::DataPlaneInfo info;
    absl::Status asked = FromGrpcStatus(
        peer.stub->DataPlane(&context, v1::DataPlaneRequest(), &info));
    if (asked.ok() && info.tcp_port() != 0) {
      return OpenTcpLocked(peer, static_cast<int>(info.tcp_port()), give_up);
    }
    if (!asked.ok() && !absl::IsUnimplemented(asked)) {
      return absl::UnavailableError(absl::IsDeadlineExceeded(asked)
                                        ? "cannot connect"
                                        : std::string(asked.message()));
    }
    // The peer takes data through gRPC only.
  }
  // A fresh channel may need a moment (and a retried attempt) to connect;
  // wait for it rather than fail the collective on a transient error.
  if (!peer.channel->WaitForConnected(absl::ToChronoTime(give_up))) {
    return absl::UnavailableError("cannot connect");
  }
  peer.route = Route::kGrpc;
  peer.context = std::make_unique<grpc::ClientContext>();
  peer.context->set_deadline(DeadlineAfter(kStreamLifetime));
  peer.writer = peer.stub->Exchange(peer.context.get(), &peer.ack);
  return absl::OkStatus();
}

absl::Status PeerPool::OpenTcpLocked(Peer& peer, int port,
                                     absl::Time deadline) {
  absl::StatusOr<HostPort> where = SplitHostPort(peer.address);
  if (!where.ok()) return where.status();
  absl::StatusOr<int> fd = ConnectTcp(where->host, port, deadline);
  if (!fd.ok()) return absl::UnavailableError(fd.status().message());
  const absl::string_view hello = kWireHello;
  absl::Status sent = WriteAll(*fd, &hello, 1, deadline);
  if (!sent.ok()) {
    CloseSocket(*fd);
    return absl::UnavailableError(sent.message());
  }
  peer.route = Route::kTcp;
  peer.fd = *fd;
  return absl::OkStatus();
}

absl::Status PeerPool::WriteLocked(Peer& peer, const MessageKey& key,
                                   absl::string_view data,
                                   absl::Time deadline) {
  if (peer.route == Route::kTcp) {
    absl::StatusOr<std::string> header = EncodeFrameHeader(key, data.size());
    if (!header.ok()) return header.status();
    const absl::string_view parts[2] = {*header, data};
    return WriteAll(peer.fd, parts, 2, deadline, shutdown_fd_);
  }
  v1::Chunk chunk;
  chunk.set_group(key.group);
  chunk.set_epoch(key.epoch);
  chunk.set_sequence(key.sequence);
  chunk.set_from_rank(key.from_rank);
  chunk.set_to_rank(key.to_rank);
  chunk.set_tag(key.tag);
  chunk.set_data(data.data(), data.size());
  if (peer.writer->Write(chunk)) return absl::OkStatus();
  grpc::Status status = peer.writer->Finish();
  peer.writer.reset();
  peer.context.reset();
  peer.route = Route::kUnknown;
  return absl::UnavailableError(status.error_message().empty()
                                    ? "connection lost"
                                    : status.error_message());
}

void PeerPool::CloseLocked(Peer& peer, bool goodbye) {
  if (peer.fd >= 0) {
    if (goodbye) {
      const std::string frame = EncodeGoodbyeFrame();
      const absl::string_view part = frame;
      WriteAll(peer.fd, &part, 1, absl::Now() + kGoodbyeTimeout).IgnoreError();
    }
    CloseSocket(peer.fd);
    peer.fd = -1;
  }
  if (peer.writer != nullptr) {
    peer.writer->WritesDone();
    peer.writer->Finish().IgnoreError();
    peer.writer.reset();
    peer.context.reset();
  }
  peer.route = Route::kUnknown;
}

absl::Status PeerPool::Send(const std::string& address, const MessageKey& key,
                            absl::string_view data, absl::Time deadline) {
  if (shut_down_.load()) {
    return absl::UnavailableError(
        absl::StrCat("data-plane connection to ", address,
                     ": this worker is shutting down"));
  }
  Peer* peer = GetPeer(address);
  absl::MutexLock lock(&peer->mu);
  std::string why;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (peer->route == Route::kUnknown) {
      absl::Status opened = OpenLocked(*peer, deadline);
      if (!opened.ok()) {
        why = std::string(opened.message());
        break;
      }
    }
    absl::Status written = WriteLocked(*peer, key, data, deadline);
    if (written.ok()) return written;
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
    // The connection broke; try a fresh one once.
    why = std::string(written.message());
  }
  return absl::UnavailableError(
      absl::StrCat("data-plane connection to ", address, " failed: ", why));
}

void PeerPool::Shutdown() {
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
