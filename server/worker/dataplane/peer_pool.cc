#include "server/worker/dataplane/peer_pool.h"

#include <grpcpp/client_context.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/common/net.h"

namespace chorus {
namespace {

// Streams are long-lived and shared by every collective between two
// workers; each still carries a deadline, far enough out that ending it
// (which the receiver reads as a lost peer) never interrupts a job.
constexpr absl::Duration kStreamLifetime = absl::Hours(24 * 365);

// How long opening a stream waits for a connection. A failed connection
// attempt is retried after the channel's backoff (100 ms to 1 s); a peer
// still unreachable after this is reported rather than waited for.
constexpr absl::Duration kConnectTimeout = absl::Seconds(2);

}  // namespace

PeerPool::~PeerPool() { Shutdown(); }

PeerPool::Stream* PeerPool::GetStream(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Stream>& stream = streams_[address];
  if (stream == nullptr) {
    stream = std::make_unique<Stream>();
    stream->channel = MakeChannel(address);
    stream->stub = v1::Peer::NewStub(stream->channel);
  }
  return stream.get();
}

absl::Status PeerPool::OpenLocked(Stream& stream, absl::Time deadline) {
  // A fresh channel may need a moment (and a retried attempt) to connect;
  // wait for it rather than fail the collective on a transient error.
  const absl::Time give_up = std::min(deadline, absl::Now() + kConnectTimeout);
  if (!stream.channel->WaitForConnected(absl::ToChronoTime(give_up))) {
    return absl::UnavailableError("cannot connect");
  }
  stream.context = std::make_unique<grpc::ClientContext>();
  stream.context->set_deadline(DeadlineAfter(kStreamLifetime));
  stream.writer = stream.stub->Exchange(stream.context.get(), &stream.ack);
  return absl::OkStatus();
}

void PeerPool::CloseLocked(Stream& stream) {
  if (stream.writer == nullptr) return;
  stream.writer->WritesDone();
  stream.writer->Finish().IgnoreError();
  stream.writer.reset();
  stream.context.reset();
}

absl::Status PeerPool::Send(const std::string& address, const v1::Chunk& chunk,
                            absl::Time deadline) {
  Stream* stream = GetStream(address);
  absl::MutexLock lock(&stream->mu);
  std::string why;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (stream->writer == nullptr) {
      absl::Status opened = OpenLocked(*stream, deadline);
      if (!opened.ok()) {
        why = std::string(opened.message());
        break;
      }
    }
    if (stream->writer->Write(chunk)) return absl::OkStatus();
    // The stream broke; collect its status and try a fresh one once.
    grpc::Status status = stream->writer->Finish();
    stream->writer.reset();
    stream->context.reset();
    why = status.error_message().empty() ? "connection lost"
                                         : status.error_message();
  }
  return absl::UnavailableError(
      absl::StrCat("data-plane stream to ", address, " failed: ", why));
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
