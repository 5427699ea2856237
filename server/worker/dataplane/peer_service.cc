#include "server/worker/dataplane/peer_service.h"

#include <utility>

namespace chorus {
namespace {

// Reads one stream until the sender closes it.
class ExchangeReactor final : public grpc::ServerReadReactor<v1::Chunk> {
 public:
  explicit ExchangeReactor(Inbox* inbox)
      : inbox_(inbox), stream_(inbox->NewStream()) {
    StartRead(&chunk_);
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
  Inbox* const inbox_;
  const Inbox::StreamId stream_;
  v1::Chunk chunk_;
};

}  // namespace

grpc::ServerReadReactor<v1::Chunk>* PeerService::Exchange(
    grpc::CallbackServerContext* context, v1::ChunkAck* response) {
  return new ExchangeReactor(inbox_);
}

}  // namespace chorus
