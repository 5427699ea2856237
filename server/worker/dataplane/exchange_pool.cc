#include "server/worker/dataplane/exchange_pool.h"

#include <grpcpp/client_context.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/common/net.h"

namespace chorus {
namespace {

// Streams are long-lived and shared by every collective between two
// workers; each still carries a deadline, far enough out that ending it
// (which the receiver reads as a lost peer) never interrupts a job.
constexpr absl::Duration kStreamLifetime = absl::Hours(24 * 365);

// How long opening a stream waits for its channel to connect. A failed
// connection attempt is retried after the channel's backoff (100 ms to 1 s);
// a peer still unreachable after this is reported rather than waited for.
constexpr absl::Duration kConnectTimeout = absl::Seconds(2);

}  // namespace

ExchangePool::~ExchangePool() { Shutdown(); }

ExchangePool::Peer* ExchangePool::GetPeer(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Peer>& peer = peers_[address];
  if (peer == nullptr) {
    peer = std::make_unique<Peer>();
    peer->address = address;
    peer->channel = MakeChannel(address, Role::kWorker);
    peer->stub = v1::Peer::NewStub(peer->channel);
  }
  return peer.get();
}

absl::Status ExchangePool::OpenLocked(Peer& peer, absl::Time deadline) {
  const absl::Time give_up = std::min(deadline, absl::Now() + kConnectTimeout);
  // A fresh channel may need a moment (and a retried attempt) to connect;
  // wait for it rather than fail the collective on a transient error.
  if (!peer.channel->WaitForConnected(absl::ToChronoTime(give_up))) {
    return absl::UnavailableError("cannot connect");
  }
  peer.context = std::make_unique<grpc::ClientContext>();
  peer.context->set_deadline(DeadlineAfter(kStreamLifetime));
  peer.writer = peer.stub->Exchange(peer.context.get(), &peer.ack);
  return absl::OkStatus();
}

absl::Status ExchangePool::WriteLocked(Peer& peer, const MessageKey& key,
                                       absl::string_view data) {
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
  return absl::UnavailableError(status.error_message().empty()
                                    ? "connection lost"
                                    : status.error_message());
}

void ExchangePool::CloseLocked(Peer& peer) {
  if (peer.writer == nullptr) return;
  peer.writer->WritesDone();
  peer.writer->Finish().IgnoreError();
  peer.writer.reset();
  peer.context.reset();
}

absl::Status ExchangePool::Send(const std::string& address,
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
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (peer->writer == nullptr) {
      absl::Status opened = OpenLocked(*peer, deadline);
      if (!opened.ok()) {
        why = std::string(opened.message());
        break;
      }
    }
    // A failed write ends the stream; try a fresh one once.
    absl::Status written = WriteLocked(*peer, key, data);
    if (written.ok()) return written;
    why = std::string(written.message());
  }
  return absl::UnavailableError(
      absl::StrCat("data-plane connection to ", address, " failed: ", why));
}

void ExchangePool::Shutdown() {
  shut_down_.store(true);
  absl::MutexLock lock(&mu_);
  for (auto& [address, peer] : peers_) {
    absl::MutexLock peer_lock(&peer->mu);
    CloseLocked(*peer);
  }
  peers_.clear();
}

}  // namespace chorus
