#include "server/worker/dataplane/peer_service.h"

#include <string>
#include <utility>

#include "server/common/grpc_status.h"
#include "server/common/refused_reactor.h"
#include "server/common/transport_security.h"
#include "server/worker/dataplane/recent_groups.h"

namespace chorus {

// Reads one stream until the sender closes it. If the stream breaks instead
// (the peer died or the connection was lost), every group epoch it recently
// carried is marked lost in the inbox.
class ExchangeReactor final : public grpc::ServerReadReactor<v1::Chunk> {
 public:
  ExchangeReactor(PeerService* service, Inbox* inbox, std::string peer)
      : service_(service),
        inbox_(inbox),
        peer_(std::move(peer)),
        stream_(inbox->NewStream()) {
    StartRead(&chunk_);
  }

  void OnCancel() override { recent_.MarkLost(*inbox_, peer_); }

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
    recent_.Remember(key);
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
    PeerService* service = service_;
    delete this;
    service->StreamEnded();
  }

 private:
  PeerService* const service_;
  Inbox* const inbox_;
  const std::string peer_;
  const Inbox::StreamId stream_;
  v1::Chunk chunk_;
  RecentGroups recent_;
};

grpc::ServerReadReactor<v1::Chunk>* PeerService::Exchange(
    grpc::CallbackServerContext* context, v1::ChunkAck* response) {
  if (absl::Status allowed =
          RequireRole(*context, Role::kWorker, "Peer.Exchange");
      !allowed.ok()) {
    return new RefusedReactor<grpc::ServerReadReactor<v1::Chunk>>(
        ToGrpcStatus(allowed));
  }
  {
    absl::MutexLock lock(&mu_);
    ++live_streams_;
  }
  return new ExchangeReactor(this, inbox_, context->peer());
}

void PeerService::StreamEnded() {
  absl::MutexLock lock(&mu_);
  --live_streams_;
}

void PeerService::WaitForStreams() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* live) { return *live == 0; }, &live_streams_));
}

grpc::ServerUnaryReactor* PeerService::DataPlane(
    grpc::CallbackServerContext* context, const v1::DataPlaneRequest* request,
    v1::DataPlaneInfo* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status allowed = RequireRole(*context, Role::kWorker, "Peer.DataPlane");
  if (allowed.ok()) response->set_tcp_port(tcp_port_);
  reactor->Finish(ToGrpcStatus(allowed));
  return reactor;
}

}  // namespace chorus
