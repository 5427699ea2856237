// CollectiveLink: point-to-point messaging between the ranks of one
// collective call. Messages between an ordered pair of ranks are numbered in
// the order the algorithm sends them, so sender and receiver agree on every
// message's key without the algorithm naming it. Messages to a rank served
// by this same worker skip the network.
//
// Lifecycle: one per collective call on one rank; the inbox and pool are not
// owned and must outlive it.
// Thread safety: thread-compatible (one algorithm thread uses it).
#ifndef CHORUS_SERVER_WORKER_DATAPLANE_COLLECTIVE_LINK_H_
#define CHORUS_SERVER_WORKER_DATAPLANE_COLLECTIVE_LINK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/worker/dataplane/inbox.h"
#include "server/worker/dataplane/peer_pool.h"

namespace chorus {

struct LinkOptions {
  std::string group;
  uint64_t epoch = 0;
  uint64_t sequence = 0;
  int rank = 0;
  // Peer address of every rank's worker, by rank.
  std::vector<std::string> addresses;
  // This worker's own peer address; messages to it stay in process.
  std::string self_address;
  absl::Time deadline = absl::InfiniteFuture();
};

class CollectiveLink {
 public:
  // `inbox` and `pool` are not owned.
  CollectiveLink(LinkOptions options, Inbox* inbox, PeerPool* pool);

  int rank() const { return options_.rank; }
  int world_size() const { return static_cast<int>(options_.addresses.size()); }

  // Sends the next message to rank `to`. Returns DEADLINE_EXCEEDED when the
  // peer took no data until the deadline, UNAVAILABLE when the peer
  // cannot be reached.
  absl::Status Send(int to, absl::string_view data);

  // Waits for the next message from rank `from`. Returns DEADLINE_EXCEEDED
  // naming the rank, or the group's abort status.
  absl::StatusOr<std::string> Recv(int from);

 private:
  MessageKey Key(int from, int to, uint32_t tag) const;

  const LinkOptions options_;
  Inbox* const inbox_;    // not owned
  PeerPool* const pool_;  // not owned
  std::vector<uint32_t> sent_;
  std::vector<uint32_t> received_;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_DATAPLANE_COLLECTIVE_LINK_H_
