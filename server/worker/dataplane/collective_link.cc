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
  absl::Status status = pool_->Send(address, Key(options_.rank, to, tag), data,
                                    options_.deadline);
  if (!status.ok()) {
    const absl::StatusCode code =
        absl::IsDeadlineExceeded(status) || absl::IsInvalidArgument(status)
            ? status.code()
            : absl::StatusCode::kUnavailable;
    return absl::Status(code,
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
