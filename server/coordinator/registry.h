// Registry: the coordinator's record of live workers and their devices.
//
// A worker registers with a name (and the job of its certificate), an
// incarnation (new each time its process starts) and its devices, and gets a
// worker id and a lease. Registering again with the same job, name and
// incarnation is a retry and returns the same id; a new incarnation under
// the same job and name replaces the old entry (a worker of another job with
// the same name is another worker). A worker
// whose lease is not renewed within the lease timeout is evicted by
// EvictExpired().
//
// Lifecycle: created by the coordinator at start, destroyed at shutdown.
// Thread safety: every method is thread-safe. The clock is not owned and must
// outlive the registry.
#ifndef CHORUS_SERVER_COORDINATOR_REGISTRY_H_
#define CHORUS_SERVER_COORDINATOR_REGISTRY_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/device.h"

namespace chorus {

class StateLog;

struct WorkerRegistration {
  std::string name;
  // The job the worker's certificate names (transport_security.h); empty:
  // the default job. Names are unique within a job.
  std::string job;
  std::string host;
  // Machine and network namespace (RegisterWorkerRequest.machine); may be
  // empty.
  std::string machine;
  // Where the worker serves its peers, "host:port".
  std::string address;
  // The TCP data-plane port on the address's host; 0 when not given.
  uint32_t data_port = 0;
  uint64_t incarnation = 0;
  std::vector<Device> devices;
  bool cuda_support = false;
  // RegisterWorkerRequest.nccl_version; 0: built without NCCL.
  uint32_t nccl_version = 0;
};

struct WorkerRecord {
  uint64_t id = 0;
  WorkerRegistration registration;
  absl::Time registered_at;
  absl::Time renewed_at;
};

struct RegisterResult {
  uint64_t worker_id = 0;
  // True when a different incarnation under the same name was replaced;
  // replaced_id is then the old entry's id.
  bool replaced = false;
  uint64_t replaced_id = 0;
  // True when this was a retry of a registration already recorded.
  bool retried = false;
};

class Registry {
 public:
  // `clock` is not owned; nor is `log`, which may be null (nothing is
  // written): registrations, replacements, deregistrations and evictions
  // are written to it (state_log.h) before they are answered.
  Registry(Clock* clock, absl::Duration lease_timeout, StateLog* log = nullptr);

  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Records a worker. Returns INVALID_ARGUMENT for an empty name or address,
  // no devices, a malformed device or a device listed twice; UNIMPLEMENTED
  // (the device refusal message) for a device that cannot take part in
  // distributed operations. On error the registry is unchanged.
  absl::StatusOr<RegisterResult> Register(const WorkerRegistration& request);

  // Renews the lease of worker `id`. Returns NOT_FOUND when no such worker is
  // registered (evicted, replaced or never seen) and FAILED_PRECONDITION when
  // the incarnation does not match.
  absl::Status Renew(uint64_t id, uint64_t incarnation);

  // Removes worker `id` and returns its record. Returns NOT_FOUND or
  // FAILED_PRECONDITION as Renew.
  absl::StatusOr<WorkerRecord> Deregister(uint64_t id, uint64_t incarnation);

  // Drops `devices` from the registration of worker `id` (it withdrew
  // them). Returns the devices that were still registered (empty when
  // nothing changed), NOT_FOUND or FAILED_PRECONDITION as Renew.
  absl::StatusOr<std::vector<Device>> Withdraw(
      uint64_t id, uint64_t incarnation, const std::vector<Device>& devices);

  // Renews every worker's lease as of now; returns how many there are.
  int RenewAll();

  // Removes every worker whose lease expired and returns them.
  std::vector<WorkerRecord> EvictExpired();

  // Checks that worker `id` is registered and may use `device` in a group:
  // the device must be one the worker registered. Returns the worker's
  // record; UNAVAILABLE for an unknown worker (saying it is registering
  // again: a worker the coordinator forgot does so); UNIMPLEMENTED (the device
  // refusal message) for a device without distributed support or one the
  // worker did not register.
  absl::StatusOr<WorkerRecord> ResolveMember(uint64_t id,
                                             const Device& device) const;

  // Returns the name worker `id` registered under; NOT_FOUND when no worker
  // has that id.
  absl::StatusOr<std::string> NameOf(uint64_t id) const;

  // Returns the job of worker `id` (empty: the default job); NOT_FOUND when
  // no worker has that id.
  absl::StatusOr<std::string> JobOf(uint64_t id) const;

  // Renews worker `id`'s lease: a request the worker sent (a join it
  // forwards) shows it alive as a heartbeat does, so a worker whose
  // heartbeat waits behind a burst of its own joins is not evicted. Does
  // nothing for an unknown id.
  void HeardFrom(uint64_t id);

  // Takes over `workers`, as the coordinator that led before wrote them
  // (state_log.h): each keeps its id and gets a fresh lease from now, in
  // which its heartbeat reaches this coordinator; ids given from now on
  // are above theirs. Call before serving, on an empty registry.
  void Restore(const std::vector<WorkerRecord>& workers);

  // Returns the registered workers ordered by id.
  std::vector<WorkerRecord> List() const;

  // Returns the earliest time a lease can expire, or InfiniteFuture() when
  // no worker is registered.
  absl::Time NextExpiry() const;

  absl::Duration lease_timeout() const { return lease_timeout_; }

 private:
  absl::Status FindLocked(uint64_t id, uint64_t incarnation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Clock* const clock_;  // not owned
  const absl::Duration lease_timeout_;
  StateLog* const log_;  // not owned; may be null

  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::btree_map<uint64_t, WorkerRecord> workers_ ABSL_GUARDED_BY(mu_);
  // By (job, name).
  absl::flat_hash_map<std::pair<std::string, std::string>, uint64_t> id_by_name_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_REGISTRY_H_
