#include "server/worker/dataplane/in_process_transport.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace chorus {

InProcessHub::InProcessHub(std::string group, int world_size)
    : group_(std::move(group)), world_size_(world_size), lost_(world_size) {}

std::string InProcessHub::PeerName(int rank) {
  return absl::StrCat("in-process rank ", rank);
}

void InProcessHub::LosePeer(int rank) {
  {
    absl::MutexLock lock(&mu_);
    lost_[rank] = true;
  }
  inbox_.PeerLost(group_, kEpoch,
                  PeerGoneError(group_, rank, "", PeerName(rank)));
}

void InProcessHub::Abort(const absl::Status& status) {
  inbox_.Abort(group_, kEpoch, status);
}

bool InProcessHub::IsLost(int rank) {
  absl::MutexLock lock(&mu_);
  return lost_[rank];
}

InProcessTransport::InProcessTransport(InProcessHub* hub, int rank,
                                       uint64_t sequence, absl::Time deadline)
    : hub_(hub),
      rank_(rank),
      sequence_(sequence),
      deadline_(deadline),
      sent_(hub->world_size(), 0),
      received_(hub->world_size(), 0) {}

MessageKey InProcessTransport::Key(int from, int to, uint32_t tag) const {
  MessageKey key;
  key.group = hub_->group();
  key.epoch = InProcessHub::kEpoch;
  key.sequence = sequence_;
  key.from_rank = from;
  key.to_rank = to;
  key.tag = tag;
  return key;
}

absl::Status InProcessTransport::Send(int to, absl::string_view data) {
  const uint32_t tag = sent_[to]++;
  for (int rank : {to, rank_}) {
    if (hub_->IsLost(rank)) {
      return UnreachableError(
          hub_->group(), to, "",
          absl::UnavailableError(absl::StrCat(
              "data-plane connection to ", InProcessHub::PeerName(to),
              " failed: ", InProcessHub::PeerName(rank), " is lost")));
    }
  }
  // Stream 0 is no stream the inbox counts: no flow control.
  hub_->inbox_.Deliver(0, Key(rank_, to, tag), std::string(data), nullptr);
  return absl::OkStatus();
}

absl::StatusOr<std::string> InProcessTransport::Recv(int from) {
  return RecvBy(from, deadline_);
}

absl::StatusOr<std::string> InProcessTransport::RecvBy(int from,
                                                       absl::Time deadline) {
  const uint32_t tag = received_[from];
  absl::StatusOr<std::string> message =
      hub_->inbox_.Take(Key(from, rank_, tag), std::min(deadline, deadline_));
  if (message.ok()) ++received_[from];
  return message;
}

absl::Status InProcessTransport::AwaitWord(int from,
                                           const std::atomic<uint64_t>& word,
                                           uint64_t target) {
  return hub_->inbox_.AwaitWord(Key(from, rank_, 0), word, target, deadline_);
}

}  // namespace chorus
