// The values a worker's runtime and its local calls pass between them: a
// rank's membership in a formed group, how one collective runs, and what it
// ran with. Plain values; thread-compatible.
#ifndef CHORUS_SERVER_WORKER_MEMBERSHIP_H_
#define CHORUS_SERVER_WORKER_MEMBERSHIP_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "absl/types/span.h"
#include "chorus/types.h"

namespace chorus {

class CancelSignal;  // server/worker/cancel_signal.h

// One rank's membership in a formed group.
struct Membership {
  std::string group;
  uint64_t epoch = 0;
  int rank = 0;
  int world_size = 0;
  Device device;
  // Peer address, device and worker name of every rank. When the join
  // reply did not list the members (a large group), only this rank's are
  // set; the others are empty (a default Device) and the runtime fetches a
  // peer's when it needs it.
  std::vector<std::string> addresses;
  std::vector<Device> devices;
  std::vector<std::string> worker_names;
  bool members_listed = true;
  uint64_t inline_max_bytes = 0;
  // The same for all-reduces (JoinGroupResponse.all_reduce_inline_max_bytes).
  uint64_t all_reduce_inline_max_bytes = 0;
  // Calls that would be inline run under the leader plan instead
  // (JoinGroupResponse.leader_calls).
  bool leader_calls = false;
  // How long its ranks wait for each other there
  // (JoinGroupResponse.leader_patience_ms).
  absl::Duration leader_patience = absl::Milliseconds(100);
  // An elastic group's bounds (0 and 0: not elastic).
  int min_world_size = 0;
  int max_world_size = 0;
};

// What a rank asks when it joins a group: to form it as `rank` of
// `world_size`; as a newcomer to a formed elastic group (no rank); or to
// follow its group from revoked epoch `follow_epoch`, where it was `rank`,
// into the next one.
struct JoinArgs {
  std::string group;
  int world_size = 0;
  int rank = 0;
  Device device;
  // Elastic bounds (0 and 0: not elastic).
  int min_world_size = 0;
  int max_world_size = 0;
  bool newcomer = false;
  uint64_t follow_epoch = 0;
  // Cancelled when the caller went away while it waited (null: never): a
  // newcomer's join is then withdrawn at the coordinator.
  std::shared_ptr<CancelSignal> cancel;
};

struct RunOptions {
  Algorithm algorithm = Algorithm::kUnspecified;
  absl::Duration timeout = absl::Minutes(1);
  // The device the rank's buffers live on; the member's device when unset.
  std::optional<Device> device;
  // Host memory for Run()'s output (not owned), at least OutputBytes() long:
  // when set, the output lands there (the same_host plan writes it there
  // directly) and Run() leaves its `output` string empty.
  absl::Span<char> output_place;
  // RunOnDevice(): the caller's stream its input was written on
  // (CallOptions::stream); null: the input is ready.
  void* stream = nullptr;
};

struct RunResult {
  uint64_t sequence = 0;
  // The algorithm the call ran: the coordinator's plan, or kRing when a
  // same_host plan fell back to the ring on every rank.
  Algorithm algorithm = Algorithm::kUnspecified;
  uint64_t chunk_bytes = 0;
  // Elastic groups: the newcomers waiting, and the next epoch a sync
  // admitted them into (this rank keeps its rank there).
  int joiners_waiting = 0;
  std::shared_ptr<const Membership> next;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_MEMBERSHIP_H_
