// AdminClient: inspects a Chorus cluster through its coordinator (registered
// workers and their devices, groups and their pending collectives, the
// flight recorder, and the stream of events as they happen).
//
// Lifecycle: Connect() returns a client bound to one coordinator address; the
// connection is made lazily and re-made after failures.
// Thread safety: every method is thread-safe.
#ifndef CHORUS_INCLUDE_CHORUS_ADMIN_CLIENT_H_
#define CHORUS_INCLUDE_CHORUS_ADMIN_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "chorus/event.h"
#include "chorus/trace.h"
#include "chorus/types.h"

namespace chorus {

// A registered worker as the coordinator sees it.
struct WorkerInfo {
  uint64_t id = 0;
  std::string name;
  // The job its certificate names (empty: the default job).
  std::string job;
  std::string host;
  // Where the worker serves its peers, "host:port".
  std::string address;
  uint64_t incarnation = 0;
  bool cuda_support = false;
  // The NCCL version its GPUs run the nccl plan with (major * 10000 + minor
  // * 100 + patch); 0: none.
  uint32_t nccl_version = 0;
  // Time since its last heartbeat.
  absl::Duration lease_age;
  std::vector<Device> devices;
};

// One rank of a formed group.
struct GroupMemberInfo {
  int rank = 0;
  uint64_t worker_id = 0;
  std::string worker_name;
  std::string host;
  std::string address;
  Device device;
};

// A formed group.
struct GroupInfo {
  std::string name;
  // The job it belongs to (empty: the default job); each job has groups of
  // its own.
  std::string job;
  int world_size = 0;
  uint64_t epoch = 0;
  // Collectives every rank has finished.
  uint64_t completed = 0;
  std::vector<GroupMemberInfo> members;
  // The oldest collective still waiting for ranks (0: none), the ranks it
  // waits for and for how long.
  uint64_t pending_sequence = 0;
  std::vector<int> missing_ranks;
  absl::Duration pending;
  // Why this epoch was aborted; OK when it was not.
  absl::Status aborted;
  // An elastic group's bounds (0 and 0: not elastic) and the newcomers
  // waiting to be admitted at its next sync.
  int min_world_size = 0;
  int max_world_size = 0;
  int joiners_waiting = 0;
  // True for a group not formed yet, whose ranks wait in a join: epoch 0,
  // `members` the ranks that joined, `missing_ranks` the others, `pending`
  // how long since the first of them joined.
  bool forming = false;
};

// How AdminClient::WatchEvents runs.
struct WatchOptions {
  // The stream's deadline, from its start. InfiniteDuration(): none, the
  // stream waits for events for as long as it runs.
  absl::Duration timeout = absl::InfiniteDuration();
  // If set, runs once the coordinator answered the call: from then on every
  // event is streamed (unless the call failed, which WatchEvents returns).
  std::function<void()> on_subscribed;
};

class AdminClient {
 public:
  // `coordinator` is "host:port", or several ("a:7000,b:7000") where
  // coordinators run with --etcd: each call goes to the leader (again at
  // the leader a standby's refusal names, or at the next coordinator when
  // one cannot be reached). Every call but WatchEvents carries a deadline
  // of `timeout`.
  static std::unique_ptr<AdminClient> Connect(const std::string& coordinator,
                                              absl::Duration timeout);
  ~AdminClient();
  AdminClient(const AdminClient&) = delete;
  AdminClient& operator=(const AdminClient&) = delete;

  // Returns the registered workers ordered by id, or the call's status
  // (UNAVAILABLE when the coordinator cannot be reached, DEADLINE_EXCEEDED).
  absl::StatusOr<std::vector<WorkerInfo>> ListWorkers() const;

  // Returns the formed groups (the default job's first, then by job)
  // ordered by name, each with its members and the
  // collective it is waiting on, if any, then the groups still forming
  // (`forming` set) ordered by name; codes as ListWorkers().
  absl::StatusOr<std::vector<GroupInfo>> ListGroups() const;

  // Returns the coordinator's flight recorder entries of `group` of `job`
  // (empty: the default job), oldest first; NOT_FOUND for a group it does
  // not remember, else the codes of ListWorkers().
  absl::StatusOr<std::vector<TraceEntry>> Trace(
      const std::string& group, const std::string& job = "") const;

  // Streams the coordinator's events, those after the call, to `on_event`
  // as they come, one call each in the order they happened, until
  // `on_event` returns false. Blocks until then. Returns OK when `on_event`
  // stopped it; otherwise how the stream ended: UNAVAILABLE when the
  // coordinator cannot be reached or shuts down, DEADLINE_EXCEEDED after
  // options.timeout, PERMISSION_DENIED without an admin certificate under
  // TLS.
  absl::Status WatchEvents(const std::function<bool(const Event&)>& on_event,
                           const WatchOptions& options = {}) const;

 private:
  class Stub;
  AdminClient(std::unique_ptr<Stub> stub, absl::Duration timeout);

  std::unique_ptr<Stub> stub_;
  absl::Duration timeout_;
};

}  // namespace chorus

#endif  // CHORUS_INCLUDE_CHORUS_ADMIN_CLIENT_H_
