// StateLog: where the leading coordinator of a highly available cluster
// (--etcd) writes what must outlive it, so that the coordinator elected
// after it takes over the same workers and groups: each worker's
// registration under its id, each group's current epoch (its members,
// elastic bounds, and the abort that ended it, if one did), and the keys of
// each job's store (key_store.h). It is written when membership changes (a
// worker registers, is replaced, leaves or is evicted; a group forms, goes
// on at a new epoch, or is aborted) and when a store key changes, never per
// collective: matching and sequences stay in memory (group_restore.cc says
// how a restored group takes its ranks' sequences back).
//
// A write returns once it is durable. A write that cannot be made means
// this coordinator no longer leads: the log then ends the process (the
// coordinator comes back as a standby) and does not return, so nothing
// decided after the change it could not write is ever told to a rank. The
// registry and the group tables write under their locks, before they
// answer anyone.
//
// Without --etcd there is no log (a null pointer): nothing is written.
//
// Lifecycle: outlives the registry and group tables that write to it.
// Thread safety: implementations are thread-safe.
#ifndef CHORUS_SERVER_COORDINATOR_STATE_LOG_H_
#define CHORUS_SERVER_COORDINATOR_STATE_LOG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/coordinator/group_types.h"
#include "server/coordinator/registry.h"

namespace chorus {

// A group's epoch as it is written.
struct StoredGroup {
  // The group's job (empty: the default job).
  std::string job;
  GroupView view;
  // OK while the epoch is live; the abort that ended it otherwise.
  absl::Status aborted;
  // The join request id of each rank (empty where unknown).
  std::vector<std::string> request_ids;
};

// A key of a job's store (key_store.h).
struct StoredKey {
  std::string job;
  std::string key;
  std::string value;
};

// Everything a log holds, as a new leader reads it.
struct StoredState {
  std::vector<WorkerRecord> workers;
  std::vector<StoredGroup> groups;
  std::vector<StoredKey> keys;
};

class StateLog {
 public:
  virtual ~StateLog() = default;

  // Writes worker `record` (its id and registration; the times are not
  // kept).
  virtual void SaveWorker(const WorkerRecord& record) = 0;
  // Forgets worker `id`.
  virtual void DropWorker(uint64_t id) = 0;
  // Writes `group`'s epoch over the one written before.
  virtual void SaveGroup(const StoredGroup& group) = 0;
  // Forgets `job`'s group `name`.
  virtual void DropGroup(const std::string& job, const std::string& name) = 0;
  // Writes a store key over the one written before / forgets it.
  virtual void SaveKey(const StoredKey& key) = 0;
  virtual void DropKey(const std::string& job, const std::string& key) = 0;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_STATE_LOG_H_
