#include "server/worker/dataplane/recent_groups.h"

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "server/worker/dataplane/transport.h"

namespace chorus {

void RecentGroups::Remember(const MessageKey& key) {
  absl::MutexLock lock(&mu_);
  auto same = [&](const Carried& c) {
    return c.epoch == key.epoch && c.from_rank == key.from_rank &&
           c.group == key.group;
  };
  if (!recent_.empty() && same(recent_.back())) return;
  auto it = std::find_if(recent_.begin(), recent_.end(), same);
  if (it != recent_.end()) recent_.erase(it);
  recent_.push_back(Carried{key.group, key.epoch, key.from_rank});
  if (recent_.size() > kRemembered) recent_.pop_front();
}

void RecentGroups::MarkLost(Inbox& inbox, const PeerDirectory* directory,
                            const std::string& peer) {
  std::vector<Carried> groups;
  {
    absl::MutexLock lock(&mu_);
    groups.assign(recent_.begin(), recent_.end());
  }
  for (const Carried& c : groups) {
    const std::string worker =
        directory == nullptr
            ? std::string()
            : directory->WorkerName(c.group, c.epoch, c.from_rank);
    inbox.PeerLost(c.group, c.epoch,
                   PeerGoneError(c.group, c.from_rank, worker, peer));
  }
}

}  // namespace chorus
