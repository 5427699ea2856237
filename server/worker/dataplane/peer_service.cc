#include "server/worker/dataplane/peer_service.h"

#include <algorithm>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace chorus {
namespace {

// How many recent group epochs a stream remembers, to abort them if it
// breaks.
constexpr size_t kRememberedGroups = 64;

// Reads one stream until the sender closes it. If the stream breaks instead
// (the peer died or the connection was lost), every group epoch it recently
// carried is marked lost in the inbox, so ranks waiting for that peer's data
// learn at once (and report it) instead of at their deadline.
class ExchangeReactor final : public grpc::ServerReadReactor<v1::Chunk> {
 public:
  ExchangeReactor(Inbox* inbox, std::string peer)
      : inbox_(inbox), peer_(std::move(peer)), stream_(inbox->NewStream()) {
    StartRead(&chunk_);
  }

  void OnCancel() override {
    std::vector<Carried> groups;
    {
      absl::MutexLock lock(&mu_);
      groups.assign(recent_.begin(), recent_.end());
    }
    for (const Carried& c : groups) {
      inbox_->PeerLost(
          c.group, c.epoch,
          absl::UnavailableError(absl::StrCat(
              "rank ", c.from_rank, " of group ", c.group,
              " is gone: its data-plane stream from ", peer_, " broke")));
    }
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    MessageKey key;
    key.group = chunk_.group();
    key.epoch = chunk_.epoch();
    key.sequence = chunk_.sequence();
    key.from_rank = chunk_.from_rank();
    key.to_rank = chunk_.to_rank();
    key.tag = chunk_.tag();
    Remember(key.group, key.epoch, key.from_rank);
    std::string data = std::move(*chunk_.mutable_data());
    // Reading resumes from here, or from the inbox once the rank took
    // enough of this stream's data.
    if (inbox_->Deliver(stream_, key, std::move(data),
                        [this] { StartRead(&chunk_); })) {
      StartRead(&chunk_);
    }
  }

  void OnDone() override {
    inbox_->CloseStream(stream_);
    delete this;
  }

 private:
  // A group epoch the stream carried, and the rank it carried data from.
  struct Carried {
    std::string group;
    uint64_t epoch = 0;
    int from_rank = 0;
    bool operator==(const Carried& o) const {
      return group == o.group && epoch == o.epoch && from_rank == o.from_rank;
    }
  };

  void Remember(const std::string& group, uint64_t epoch, int from_rank) {
    absl::MutexLock lock(&mu_);
    Carried entry{group, epoch, from_rank};
    if (!recent_.empty() && recent_.back() == entry) return;
    auto it = std::find(recent_.begin(), recent_.end(), entry);
    if (it != recent_.end()) recent_.erase(it);
    recent_.push_back(std::move(entry));
    if (recent_.size() > kRememberedGroups) recent_.pop_front();
  }

  Inbox* const inbox_;
  const std::string peer_;
  const Inbox::StreamId stream_;
  v1::Chunk chunk_;
  absl::Mutex mu_;
  std::deque<Carried> recent_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerReadReactor<v1::Chunk>* PeerService::Exchange(
    grpc::CallbackServerContext* context, v1::ChunkAck* response) {
  return new ExchangeReactor(inbox_, context->peer());
}

}  // namespace chorus
