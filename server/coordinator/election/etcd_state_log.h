// EtcdStateLog: the StateLog (state_log.h) of a coordinator elected on etcd.
// Keys: PREFIX/workers/ID (a chorus.v1.StoredWorker),
// PREFIX/groups/JOB/NAME (a chorus.v1.StoredGroup; JOB empty for the
// default job) and PREFIX/store/JOB/KEY (the store key's value). Every write is
// one etcd transaction fenced on the leader's key: it is made only while that
// key is still the one this leader created (its create revision), so a deposed
// leader can never overwrite what the next leader decided. A write etcd refuses
// (the fence failed) or cannot take while this coordinator still leads (each
// etcd endpoint tried twice) runs `on_lost`, which must not return: the
// coordinator re-executes itself as a standby.
//
// Lifecycle: made with the election; SetFence() once elected, before the
// first write. Thread safety: every method is thread-safe.
#ifndef CHORUS_SERVER_COORDINATOR_ELECTION_ETCD_STATE_LOG_H_
#define CHORUS_SERVER_COORDINATOR_ELECTION_ETCD_STATE_LOG_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/coordinator/state_log.h"

namespace chorus {

class EtcdClient;

class EtcdStateLog final : public StateLog {
 public:
  // `etcd` is not owned. `prefix` is the cluster's key prefix (without the
  // trailing slash), `fence_key` the leader's key.
  EtcdStateLog(EtcdClient* etcd, std::string prefix, std::string fence_key,
               int endpoints, std::function<void(const absl::Status&)> on_lost);

  EtcdStateLog(const EtcdStateLog&) = delete;
  EtcdStateLog& operator=(const EtcdStateLog&) = delete;

  // Fences every later write on the leader's key having create revision
  // `revision` (the one this coordinator's campaign created).
  void SetFence(int64_t revision) { fence_.store(revision); }

  // Reads what the leaders before wrote. Returns etcd's status when it
  // cannot; DATA_LOSS naming a key whose value does not parse.
  absl::StatusOr<StoredState> Load();

  void SaveWorker(const WorkerRecord& record) override;
  void DropWorker(uint64_t id) override;
  void SaveGroup(const StoredGroup& group) override;
  void DropGroup(const std::string& job, const std::string& name) override;
  void SaveKey(const StoredKey& key) override;
  void DropKey(const std::string& job, const std::string& key) override;

  // Writes made (each a transaction).
  int64_t Writes() const { return writes_.load(); }

 private:
  std::string WorkerKey(uint64_t id) const;
  std::string GroupKey(const std::string& job, const std::string& name) const;
  std::string StoreKey(const std::string& job, const std::string& key) const;
  // Writes `value` at `key` (deletes it without one), or runs on_lost_.
  void Write(const std::string& key, std::optional<std::string> value);

  EtcdClient* const etcd_;  // not owned
  const std::string prefix_;
  const std::string fence_key_;
  const int endpoints_;
  const std::function<void(const absl::Status&)> on_lost_;
  std::atomic<int64_t> fence_{0};
  std::atomic<int64_t> writes_{0};
};

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_ELECTION_ETCD_STATE_LOG_H_
