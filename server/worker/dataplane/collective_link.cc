#include "server/worker/dataplane/collective_link.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace chorus {

CollectiveLink::CollectiveLink(LinkOptions options, Inbox* inbox,
                               PeerPool* pool)
    : options_(std::move(options)),
      inbox_(inbox),
      pool_(pool),
      sent_(options_.addresses.size(), 0),
      received_(options_.addresses.size(), 0) {}

MessageKey CollectiveLink::Key(int from, int to, uint32_t tag) const {
  MessageKey key;
  key.group = options_.group;
  key.epoch = options_.epoch;
  key.sequence = options_.sequence;
  key.from_rank = from;
  key.to_rank = to;
  key.tag = tag;
  return key;
}

absl::Status CollectiveLink::Send(int to, absl::string_view data) {
  const uint32_t tag = sent_[to]++;
  const std::string& address = options_.addresses[to];
  if (address == options_.self_address) {
    inbox_->Deliver(0, Key(options_.rank, to, tag), std::string(data), nullptr);
    return absl::OkStatus();
  }
  v1::Chunk chunk;
  chunk.set_group(options_.group);
  chunk.set_epoch(options_.epoch);
  chunk.set_sequence(options_.sequence);
  chunk.set_from_rank(options_.rank);
  chunk.set_to_rank(to);
  chunk.set_tag(tag);
  chunk.set_data(data.data(), data.size());
  absl::Status status = pool_->Send(address, chunk, options_.deadline);
  if (!status.ok()) {
    return absl::UnavailableError(
        absl::StrCat("rank ", to, " of group ", options_.group,
                     " unreachable: ", status.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> CollectiveLink::Recv(int from) {
  const uint32_t tag = received_[from]++;
  return inbox_->Take(Key(from, options_.rank, tag), options_.deadline);
}

}  // namespace chorus
