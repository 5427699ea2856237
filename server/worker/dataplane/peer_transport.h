// PeerTransport: the Transport of one collective call on a worker. Messages
// to a rank on another worker go through the worker's PeerSender (TCP wire
// frames); messages to a rank this same worker
// serves skip the network and go straight to its inbox. Every message is
// received from the worker's Inbox, keyed by (group, epoch, sequence, from,
// to, tag), where tag numbers the messages of an ordered pair of ranks in
// the order the algorithm sends them, so sender and receiver agree on every
// key without the algorithm naming it.
//
// A lost peer: the worker's TcpListener or PeerService marks the group epoch
// lost in the inbox when a peer's stream breaks (RecentGroups), and Recv()
// returns that status (PeerGoneError); a send that cannot reach its peer
// returns UnreachableError.
//
// It keeps state only for the peers the call exchanges with (a ring's two,
// not the whole group), so a call costs the same in a group of 65,536 ranks
// as in one of 8.
//
// Lifecycle: one per collective call on one rank; the inbox, the sender and
// the vectors the options' spans view are not owned and must outlive it.
// Thread safety: thread-compatible (one algorithm thread uses it).
#ifndef CHORUS_SERVER_WORKER_DATAPLANE_PEER_TRANSPORT_H_
#define CHORUS_SERVER_WORKER_DATAPLANE_PEER_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/metrics.h"
#include "server/worker/dataplane/inbox.h"
#include "server/worker/dataplane/peer_directory.h"
#include "server/worker/dataplane/peer_sender.h"
#include "server/worker/dataplane/transport.h"

namespace chorus {

struct PeerTransportOptions {
  std::string group;
  uint64_t epoch = 0;
  uint64_t sequence = 0;
  int rank = 0;
  // Peer address of every rank's worker, by rank (empty: not known yet,
  // see `resolve`).
  absl::Span<const std::string> addresses;
  // This worker's own peer address; messages to it stay in process.
  std::string self_address;
  // Worker name of every rank, by rank (empty: unknown), which statuses
  // name next to the rank and which labels the bytes counted per peer
  // (chorus_peer_sent_bytes_total{peer} and
  // chorus_peer_received_bytes_total{peer}; the address when unknown).
  absl::Span<const std::string> worker_names;
  absl::Time deadline = absl::InfiniteFuture();
  // Looks up a rank whose address is empty (a large group's members are
  // fetched as they are needed): its worker's name and address, or the
  // status the send then returns. Null: every address is known.
  std::function<absl::StatusOr<PeerDirectory::RankPeer>(int rank)> resolve;
};

class PeerTransport final : public Transport {
 public:
  // `inbox` and `sender` are not owned.
  PeerTransport(PeerTransportOptions options, Inbox* inbox, PeerSender* sender);

  int rank() const override { return options_.rank; }
  int world_size() const override {
    return static_cast<int>(options_.addresses.size());
  }

  // As Transport::Send; the data goes out from `data` itself (a copy only
  // for a rank of this worker).
  absl::Status Send(int to, absl::string_view data) override;

  // As Transport::Recv.
  absl::StatusOr<std::string> Recv(int from) override;
  absl::StatusOr<std::string> RecvBy(int from, absl::Time deadline) override;

  // As Transport::AwaitWord, through the inbox (its aborts and lost peers).
  absl::Status AwaitWord(int from, const std::atomic<uint64_t>& word,
                         uint64_t target) override;

  // Keeps the message in the inbox's payload buffers (payload_buffers.h).
  void Recycle(std::string message) override;

 private:
  // What the call keeps of one peer rank.
  struct Peer {
    // Messages sent to it and received from it so far (the next tags).
    uint32_t sent = 0;
    uint32_t received = 0;
    // Byte counters, made on first use.
    Counter* sent_bytes = nullptr;
    Counter* received_bytes = nullptr;
    // Its worker's address and name when `resolve` found them.
    std::string address;
    std::string name;
  };

  MessageKey Key(int from, int to, uint32_t tag) const;
  // The address of rank `to`'s worker, resolved first when unknown.
  absl::StatusOr<const std::string*> AddressOf(int to, Peer& peer);
  // The name of the worker holding `rank`; empty when unknown.
  absl::string_view WorkerName(int rank) const;
  // The counter of bytes sent to (or received from) rank `rank`'s worker,
  // made on first use in `*counter`.
  Counter* PeerBytes(Counter** counter, CounterFamily* family, int rank);

  const PeerTransportOptions options_;
  Inbox* const inbox_;        // not owned
  PeerSender* const sender_;  // not owned
  absl::flat_hash_map<int, Peer> peers_;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_DATAPLANE_PEER_TRANSPORT_H_
