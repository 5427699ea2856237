#include "server/worker/dataplane/peer_transport.h"

#include <utility>

namespace chorus {

PeerTransport::PeerTransport(PeerTransportOptions options, Inbox* inbox,
                             PeerSender* sender)
    : options_(std::move(options)),
      inbox_(inbox),
      sender_(sender),
      sent_(options_.addresses.size(), 0),
      received_(options_.addresses.size(), 0) {}

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

absl::Status PeerTransport::Send(int to, absl::string_view data) {
  const uint32_t tag = sent_[to]++;
  const std::string& address = options_.addresses[to];
  if (address == options_.self_address) {
    inbox_->Deliver(0, Key(options_.rank, to, tag), std::string(data), nullptr);
    return absl::OkStatus();
  }
  absl::Status status = sender_->Send(address, Key(options_.rank, to, tag),
                                      data, options_.deadline);
  if (!status.ok()) return UnreachableError(options_.group, to, status);
  return absl::OkStatus();
}

absl::StatusOr<std::string> PeerTransport::Recv(int from) {
  const uint32_t tag = received_[from]++;
  return inbox_->Take(Key(from, options_.rank, tag), options_.deadline);
}

}  // namespace chorus
