#include "server/worker/dataplane/peer_transport.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace chorus {

PeerTransport::PeerTransport(PeerTransportOptions options, Inbox* inbox,
                             PeerSender* sender)
    : options_(std::move(options)), inbox_(inbox), sender_(sender) {}

namespace {

CounterFamily* SentBytes() {
  static CounterFamily* const family = DefaultMetrics().Counters(
      "chorus_peer_sent_bytes_total",
      "Data-plane payload bytes sent to each peer worker.", {"peer"});
  return family;
}

CounterFamily* ReceivedBytes() {
  static CounterFamily* const family = DefaultMetrics().Counters(
      "chorus_peer_received_bytes_total",
      "Data-plane payload bytes received from each peer worker.", {"peer"});
  return family;
}

}  // namespace

absl::string_view PeerTransport::WorkerName(int rank) const {
  if (rank >= 0 && rank < static_cast<int>(options_.worker_names.size()) &&
      !options_.worker_names[rank].empty()) {
    return options_.worker_names[rank];
  }
  auto found = peers_.find(rank);
  return found == peers_.end() ? absl::string_view()
                               : absl::string_view(found->second.name);
}

Counter* PeerTransport::PeerBytes(Counter** counter, CounterFamily* family,
                                  int rank) {
  if (*counter == nullptr) {
    const absl::string_view name = WorkerName(rank);
    *counter = family->With(
        {name.empty() ? options_.addresses[rank] : std::string(name)});
  }
  return *counter;
}

MessageKey PeerTransport::Key(int from, int to, uint32_t tag) const {
  MessageKey key;
  key.group = options_.group;
  key.epoch = options_.epoch;
  key.sequence = options_.sequence;
  key.from_rank = from;
  key.to_rank = to;
  key.tag = tag;
  return key;
}

absl::StatusOr<const std::string*> PeerTransport::AddressOf(int to,
                                                            Peer& peer) {
  if (!options_.addresses[to].empty()) return &options_.addresses[to];
  if (!peer.address.empty() || !options_.resolve) return &peer.address;
  absl::StatusOr<PeerDirectory::RankPeer> resolved = options_.resolve(to);
  if (!resolved.ok()) return resolved.status();
  peer.name = std::move(resolved->name);
  peer.address = std::move(resolved->address);
  return &peer.address;
}

absl::Status PeerTransport::Send(int to, absl::string_view data) {
  Peer& peer = peers_[to];
  const uint32_t tag = peer.sent++;
  absl::StatusOr<const std::string*> resolved = AddressOf(to, peer);
  if (!resolved.ok()) {
    return absl::Status(
        resolved.status().code(),
        absl::StrCat("cannot learn where rank ", to, " of group ",
                     options_.group, " is: ", resolved.status().message()));
  }
  const std::string& address = **resolved;
  if (address == options_.self_address) {
    inbox_->Deliver(0, Key(options_.rank, to, tag), std::string(data), nullptr);
    return absl::OkStatus();
  }
  absl::Status status = sender_->Send(address, Key(options_.rank, to, tag),
                                      data, options_.deadline);
  if (!status.ok()) {
    return UnreachableError(options_.group, to, WorkerName(to), status);
  }
  if (DefaultMetrics().enabled()) {
    PeerBytes(&peer.sent_bytes, SentBytes(), to)->Add(data.size());
  }
  return absl::OkStatus();
}

void PeerTransport::Recycle(std::string message) {
  inbox_->payloads().Give(std::move(message));
}

absl::StatusOr<std::string> PeerTransport::Recv(int from) {
  return RecvBy(from, options_.deadline);
}

absl::StatusOr<std::string> PeerTransport::RecvBy(int from,
                                                  absl::Time deadline) {
  Peer& peer = peers_[from];
  absl::StatusOr<std::string> message =
      inbox_->Take(Key(from, options_.rank, peer.received),
                   std::min(deadline, options_.deadline), WorkerName(from));
  if (!message.ok()) return message;
  ++peer.received;
  if (options_.addresses[from] != options_.self_address &&
      DefaultMetrics().enabled()) {
    PeerBytes(&peer.received_bytes, ReceivedBytes(), from)
        ->Add(message->size());
  }
  return message;
}

absl::Status PeerTransport::AwaitWord(int from,
                                      const std::atomic<uint64_t>& word,
                                      uint64_t target) {
  return inbox_->AwaitWord(Key(from, options_.rank, 0), word, target,
                           options_.deadline, WorkerName(from));
}

}  // namespace chorus
