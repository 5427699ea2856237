// RecentGroups: the group epochs one incoming data-plane connection carried
// lately, and from which rank. When the connection breaks (the peer died or
// the network dropped it), each is marked lost in the inbox, so ranks that
// wait for that peer's data learn at once (and report it) instead of at
// their deadline.
//
// Lifecycle: one per incoming connection.
// Thread safety: thread-safe.
#ifndef CHORUS_SERVER_WORKER_DATAPLANE_RECENT_GROUPS_H_
#define CHORUS_SERVER_WORKER_DATAPLANE_RECENT_GROUPS_H_

#include <cstdint>
#include <deque>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/worker/dataplane/inbox.h"
#include "server/worker/dataplane/peer_directory.h"

namespace chorus {

class RecentGroups {
 public:
  // How many group epochs are remembered (the oldest is forgotten first).
  static constexpr size_t kRemembered = 64;

  // Notes that the connection carried data of `key`'s group epoch from
  // `key.from_rank`.
  void Remember(const MessageKey& key);

  // Marks every remembered group epoch lost in `inbox`, naming `peer` as
  // the connection that broke and, from `directory` (may be null), the
  // worker that held the sending rank.
  void MarkLost(Inbox& inbox, const PeerDirectory* directory,
                const std::string& peer);

 private:
  struct Carried {
    std::string group;
    uint64_t epoch = 0;
    int from_rank = 0;
  };

  absl::Mutex mu_;
  std::deque<Carried> recent_ ABSL_GUARDED_BY(mu_);
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_DATAPLANE_RECENT_GROUPS_H_
