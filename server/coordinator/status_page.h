// The coordinator's status page: an HTML view of the cluster as the core
// sees it at the moment it is rendered: workers with their devices and the
// age of their leases, groups with members, epoch and state, the collective
// each group waits on and the ranks it waits for, and the latest verdicts
// the flight recorder holds. The page reloads itself every few seconds.
// Served at / on the coordinator's HTTP port (--metrics_listen).
//
// Pure function of the core's state; thread-safe.
#ifndef CHORUS_SERVER_COORDINATOR_STATUS_PAGE_H_
#define CHORUS_SERVER_COORDINATOR_STATUS_PAGE_H_

#include <string>

#include "server/coordinator/coordinator.h"

namespace chorus {

struct StatusPageOptions {
  // How often the page reloads itself, in seconds.
  int refresh_seconds = 2;
  // How many recent verdicts (ended collectives) it lists.
  int recent_verdicts = 20;
  // With --etcd: whether this coordinator leads, and who does (a line the
  // page shows under its title); empty without an election.
  std::string leadership;
};

// Returns the page's HTML, every value escaped.
std::string RenderStatusPage(const Coordinator& core,
                             const StatusPageOptions& options);

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_STATUS_PAGE_H_
