// The values the group table takes and gives: members and views of
// groups, the requests ranks send (joins, collective calls, commits) and
// what they get back, and the summaries the admin views show.
//
// Plain structs; no locking of their own.
#ifndef CHORUS_SERVER_COORDINATOR_GROUP_TYPES_H_
#define CHORUS_SERVER_COORDINATOR_GROUP_TYPES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/collective.h"
#include "common/device.h"
#include "server/coordinator/planner.h"

namespace chorus {

struct GroupMember {
  int rank = 0;
  uint64_t worker_id = 0;
  std::string worker_name;
  std::string host;
  // Machine and network namespace of the member's worker; may be empty.
  std::string machine;
  // Where the member's worker serves its peers, its TCP data-plane port
  // (0: not given) and the incarnation it registered with.
  std::string address;
  uint32_t data_port = 0;
  uint64_t incarnation = 0;
  Device device;
  // The NCCL version the member's worker was built with; 0: none.
  uint32_t nccl_version = 0;
};

struct GroupView {
  std::string name;
  uint64_t epoch = 0;
  int world_size = 0;
  std::vector<GroupMember> members;
  // Every member's worker reported the same (non-empty) host.
  bool same_host = false;
  // Every member's worker was built with NCCL (the nccl plan may run where
  // every rank's call is on a GPU).
  bool nccl = false;
  // An elastic group (min_world_size > 0) goes on without lost members
  // while it keeps at least min_world_size, and admits newcomers up to
  // max_world_size.
  int min_world_size = 0;
  int max_world_size = 0;
  // The rank of the join this view answers, where the join did not name it
  // (a newcomer, or a rank following its group into the next epoch); -1
  // otherwise.
  int rank = -1;
};

struct JoinRequest {
  std::string group;
  int world_size = 0;
  int rank = 0;
  uint64_t worker_id = 0;
  Device device;
  absl::Time deadline = absl::InfiniteFuture();
  // Identifies a retried join: a join with the same non-empty id from the
  // same worker replaces the pending one, or gets the group it formed.
  std::string request_id;
  // Elastic groups (group_elastic.cc): every rank of a forming group names
  // the same bounds (0: not elastic). A newcomer joins a formed elastic group
  // without a rank and waits to be admitted; a rank of a revoked epoch
  // follows its group into the next one (`rank` is its old rank there).
  int min_world_size = 0;
  int max_world_size = 0;
  bool newcomer = false;
  uint64_t follow_epoch = 0;
  // Whether the newcomer's worker withdrew the join (its caller went away
  // while it waited); such a newcomer is never admitted. Null: never.
  // Called under the table's lock: it must not block.
  std::function<bool()> withdrawn;
};

struct CollectiveCall {
  // The caller's job (empty: the default one), for the coordinator's routing.
  std::string job;
  std::string group;
  uint64_t epoch = 0;
  int rank = 0;
  // 1 for the rank's first call on the group, then 2, 3, ...
  uint64_t sequence = 0;
  CollectiveSpec spec;
  // The device the rank's buffers live on; the member's device when unset.
  std::optional<Device> device;
  Algorithm algorithm = Algorithm::kUnspecified;
  // The rank's input, when it rides with the call (CarriesInlineData).
  bool has_data = false;
  std::string data;
  absl::Time deadline = absl::InfiniteFuture();
  // Earlier calls of the same rank that another coordinator answered,
  // sent again after the rank moved to this one (a failover): a group this
  // coordinator restored (group_restore.cc) matches them again for the
  // ranks whose answer was lost; their own answers go nowhere.
  std::vector<CollectiveCall> replays;
  // After a failover: the rank runs this call under the old leader's plan
  // (CollectiveRequest.running); matched, answered at once with nothing.
  bool running = false;
  // This rank's calls of the same group epoch that ran under the leader
  // plan since its previous call here (CollectiveRequest.leader_ran), as
  // (first, last) ranges: counted as called.
  std::vector<std::pair<uint64_t, uint64_t>> leader_ran;
  // The rank would repeat this all-reduce on a same_host plan's segments
  // (CollectiveRequest.repeats_same_host).
  bool repeats_same_host = false;
};

struct CollectiveOutcome {
  uint64_t sequence = 0;
  Plan plan;
  // The rank's output under the inline plan.
  std::string data;
  // Newcomers waiting to join the (elastic) group when it was decided.
  int joiners_waiting = 0;
  // A sync that admitted newcomers: the group's next epoch (the members keep
  // their ranks; the newcomers follow them).
  std::shared_ptr<const GroupView> next;
};

struct CommitCall {
  // As CollectiveCall::job.
  std::string job;
  std::string group;
  uint64_t epoch = 0;
  int rank = 0;
  uint64_t sequence = 0;
  // The hash of the rank's output (CommitRequest.result_hash), when sent.
  std::optional<uint64_t> result_hash;
  absl::Time deadline = absl::InfiniteFuture();
};

// A group epoch that was aborted, for the workers that hold its members.
struct AbortNotice {
  // Increases with every abort; workers ask for notices after the last id
  // they saw.
  uint64_t id = 0;
  std::string group;
  uint64_t epoch = 0;
  absl::Status status;
  std::vector<uint64_t> worker_ids;
};

struct GroupSummary {
  // The job the group belongs to (empty: the default job).
  std::string job;
  GroupView view;
  // Collectives that ended (with a result or a failure verdict).
  uint64_t completed = 0;
  // Collectives some rank called that still wait for the other ranks'
  // calls, and data-plane collectives that wait for their commits.
  uint64_t matching = 0;
  uint64_t committing = 0;
  // For the oldest pending collective, if any: its sequence and the ranks
  // that have not called it yet.
  uint64_t pending_sequence = 0;
  std::vector<int> missing_ranks;
  absl::Time pending_since;
  // Set when the group epoch was aborted; every call on it gets this.
  absl::Status aborted;
  // Elastic groups: newcomers waiting to be admitted at the next sync.
  int joiners_waiting = 0;
};

// A group still forming: the ranks that joined and wait for the others.
struct FormingSummary {
  std::string job;
  std::string name;
  int world_size = 0;
  // The ranks that joined, with their workers, ordered by rank.
  std::vector<GroupMember> joined;
  // The ranks that have not joined yet.
  std::vector<int> missing_ranks;
  // When the first of the waiting ranks joined.
  absl::Time since;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_GROUP_TYPES_H_
