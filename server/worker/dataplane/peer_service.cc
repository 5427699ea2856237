#include "server/worker/dataplane/peer_service.h"

#include <atomic>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/grpc_status.h"
#include "server/common/refused_reactor.h"
#include "server/common/transport_security.h"
#include "server/worker/dataplane/recent_groups.h"

namespace chorus {

// Reads one stream until the sender closes it. If the stream breaks instead
// (the peer died or the connection was lost), every group epoch it recently
// carried is marked lost in the inbox. With TLS (`caller` set), each chunk
// is delivered only if the caller holds its sending rank (PeerDirectory);
// a chunk for an epoch this worker has not learned yet waits for it.
class ExchangeReactor final : public grpc::ServerReadReactor<v1::Chunk> {
 public:
  ExchangeReactor(PeerService* service, Inbox* inbox, std::string peer,
                  std::optional<std::string> caller)
      : service_(service),
        inbox_(inbox),
        peer_(std::move(peer)),
        caller_(std::move(caller)),
        stream_(inbox->NewStream()) {
    StartRead(&chunk_);
  }

  void OnCancel() override {
    cancelled_.store(true);
    const uint64_t waiting = waiting_.exchange(0);
    recent_.MarkLost(*inbox_, service_->directory_, peer_);
    // A chunk waiting for its epoch has no read pending that would end.
    if (waiting != 0 && service_->directory_->Cancel(waiting)) {
      Finish(grpc::Status::CANCELLED);
    }
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    if (!caller_.has_value() ||
        admitted_.Covers(chunk_.group(), chunk_.epoch(), chunk_.from_rank())) {
      DeliverChunk();
      return;
    }
    PeerDirectory::Verdict verdict;
    const uint64_t token = service_->directory_->WaitFor(
        chunk_.group(), chunk_.epoch(), chunk_.from_rank(), *caller_, &verdict,
        [this](PeerDirectory::Verdict known) { OnVerdict(known); });
    if (token == 0) {
      OnVerdict(verdict);
      return;
    }
    waiting_.store(token);
    if (cancelled_.load() && service_->directory_->Cancel(token)) {
      Finish(grpc::Status::CANCELLED);
    }
  }

  void OnDone() override {
    inbox_->CloseStream(stream_);
    PeerService* service = service_;
    delete this;
    service->StreamEnded();
  }

 private:
  void OnVerdict(PeerDirectory::Verdict verdict) {
    if (verdict == PeerDirectory::Verdict::kMember) {
      admitted_.Set(chunk_.group(), chunk_.epoch(), chunk_.from_rank());
      DeliverChunk();
      return;
    }
    Finish(grpc::Status(
        grpc::StatusCode::PERMISSION_DENIED,
        absl::StrCat("worker \"", *caller_, "\" does not hold rank ",
                     chunk_.from_rank(), " of group ", chunk_.group(),
                     " at epoch ", chunk_.epoch(),
                     " with this worker, so it may not send its data")));
  }

  void DeliverChunk() {
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

  PeerService* const service_;
  Inbox* const inbox_;
  const std::string peer_;
  // The calling worker's name with TLS; nullopt without.
  const std::optional<std::string> caller_;
  const Inbox::StreamId stream_;
  v1::Chunk chunk_;
  RecentGroups recent_;
  // One chunk is in flight at a time, so this needs no lock.
  PeerDirectory::Admitted admitted_;
  // The directory's token of a chunk waiting for its epoch (0: none), and
  // whether the call was cancelled.
  std::atomic<uint64_t> waiting_{0};
  std::atomic<bool> cancelled_{false};
};

grpc::ServerReadReactor<v1::Chunk>* PeerService::Exchange(
    grpc::CallbackServerContext* context, v1::ChunkAck* response) {
  std::optional<std::string> caller;
  if (TlsEnabled()) {
    absl::StatusOr<Identity> identity =
        RequireIdentity(*context, Role::kWorker, "Peer.Exchange");
    if (!identity.ok()) {
      return new RefusedReactor<grpc::ServerReadReactor<v1::Chunk>>(
          ToGrpcStatus(identity.status()));
    }
    caller = identity->name;
  }
  {
    absl::MutexLock lock(&mu_);
    ++live_streams_;
  }
  return new ExchangeReactor(this, inbox_, context->peer(), std::move(caller));
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
