#include "server/worker/dataplane/peer_pool.h"

#include <grpcpp/client_context.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/common/net.h"

namespace chorus {
namespace {

// Streams are long-lived and shared by every collective between two
// workers; each still carries a deadline, far enough out that ending it
// (which the receiver reads as a lost peer) never interrupts a job.
constexpr absl::Duration kStreamLifetime = absl::Hours(24 * 365);

}  // namespace

PeerPool::~PeerPool() { Shutdown(); }

PeerPool::Stream* PeerPool::GetStream(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Stream>& stream = streams_[address];
  if (stream == nullptr) {
    stream = std::make_unique<Stream>();
    stream->stub = v1::Peer::NewStub(MakeChannel(address));
  }
  return stream.get();
}

void PeerPool::OpenLocked(Stream& stream) {
  stream.context = std::make_unique<grpc::ClientContext>();
  stream.context->set_deadline(DeadlineAfter(kStreamLifetime));
  stream.writer = stream.stub->Exchange(stream.context.get(), &stream.ack);
}

void PeerPool::CloseLocked(Stream& stream) {
  if (stream.writer == nullptr) return;
  stream.writer->WritesDone();
  stream.writer->Finish().IgnoreError();
  stream.writer.reset();
  stream.context.reset();
}

absl::Status PeerPool::Send(const std::string& address,
                            const v1::Chunk& chunk) {
  Stream* stream = GetStream(address);
  absl::MutexLock lock(&stream->mu);
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (stream->writer == nullptr) OpenLocked(*stream);
    if (stream->writer->Write(chunk)) return absl::OkStatus();
    // The stream broke; collect its status and try a fresh one once.
    grpc::Status status = stream->writer->Finish();
    stream->writer.reset();
    stream->context.reset();
    if (attempt == 1) {
      return absl::UnavailableError(absl::StrCat(
          "data-plane stream to ", address, " failed: ",
          status.error_message().empty() ? "connection lost"
                                         : status.error_message()));
    }
  }
  return absl::OkStatus();
}

void PeerPool::Shutdown() {
  absl::MutexLock lock(&mu_);
  for (auto& [address, stream] : streams_) {
    absl::MutexLock stream_lock(&stream->mu);
    CloseLocked(*stream);
  }
  streams_.clear();
}

}  // namespace chorus
