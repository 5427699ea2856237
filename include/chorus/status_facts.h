// StatusFacts: what a failed Chorus call's status says about the ranks and
// workers involved, in a form programs read — the chorus.v1.ErrorDetail
// (proto/chorus/v1/status.proto) that the servers attach, as plain values.
// Statuses from Communicator and AdminClient carry it as an absl::Status
// payload; StatusFactsOf() reads it back.
//
// Plain values and a pure function; thread-safe.
#ifndef CHORUS_INCLUDE_CHORUS_STATUS_FACTS_H_
#define CHORUS_INCLUDE_CHORUS_STATUS_FACTS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace chorus {

struct StatusFacts {
  // What happened: "MISMATCH", "RANKS_MISSING", "WORKER_LOST", ... (the
  // list is in status.proto).
  std::string reason;
  std::string group;
  uint64_t epoch = 0;
  // The collective's sequence number (0: the status is about none).
  uint64_t sequence = 0;
  // Ranks that did not reach the collective (or join) in time.
  std::vector<int> missing_ranks;
  // The worker whose loss aborted the group, its id and its ranks.
  std::string lost_worker;
  uint64_t lost_worker_id = 0;
  std::vector<int> lost_ranks;
  // Per rank: what it asked for (a mismatch), why it was refused or failed,
  // or whose results its own differ from.
  std::map<int, std::string> ranks;
  // A device's canonical name, e.g. "Vulkan(0)".
  std::string device;
  // A worker's local API says so when the failed call took its number.
  bool number_used = false;
  // MEMBERSHIP_CHANGED (an elastic group): the epoch the group goes on at
  // (0: it waits for newcomers), its size there, each old rank's rank there
  // (-1: it left), and the newcomers waiting.
  uint64_t next_epoch = 0;
  int next_world_size = 0;
  std::vector<int> next_ranks;
  int joiners_waiting = 0;
};

// Returns the facts `status` carries, or nullopt when it carries none (an
// OK status, bad input, or a status from elsewhere).
std::optional<StatusFacts> StatusFactsOf(const absl::Status& status);

}  // namespace chorus

#endif  // CHORUS_INCLUDE_CHORUS_STATUS_FACTS_H_
