// KeyStore: a key-value store per job, the operations of torch's
// distributed store (set, get, add, compare_set, wait, delete_key,
// num_keys, check), for ranks that rendezvous through the coordinator
// (chorus.torch's init_method="chorus://..."). A job's keys are apart from
// every other job's: the doors name the caller's job from its certificate.
//
// `get` and `wait` wait until their keys exist, or until their deadline
// (DEADLINE_EXCEEDED naming the keys still missing); every other operation
// answers at once. Sizes and counts are bounded (StoreLimits):
// RESOURCE_EXHAUSTED, and the store is unchanged. With a state log
// (--etcd), every change is written before it is answered, and a new
// leader takes the keys over (Restore).
//
// Lifecycle: owned by the coordinator; ExpireWaits() at NextDeadline().
// Thread safety: every method is thread-safe; callbacks run after the
// store's lock is released, never under it. The clock and log are not
// owned.
#ifndef CHORUS_SERVER_COORDINATOR_KEY_STORE_H_
#define CHORUS_SERVER_COORDINATOR_KEY_STORE_H_

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/coordinator/state_log.h"

namespace chorus {

enum class StoreOpKind {
  kUnspecified = 0,
  kSet = 1,
  kGet = 2,
  kAdd = 3,
  kCompareSet = 4,
  kWait = 5,
  kDeleteKey = 6,
  kNumKeys = 7,
  kCheck = 8,
};

struct StoreOp {
  StoreOpKind kind = StoreOpKind::kUnspecified;
  // The key (set, get, add, compare_set, delete_key) or keys (wait,
  // check).
  std::vector<std::string> keys;
  // set: the value; compare_set: the value wanted.
  std::string value;
  // compare_set: the value expected (empty: the key must not exist).
  std::string expected;
  // add: the amount.
  int64_t amount = 0;
  absl::Time deadline = absl::InfiniteFuture();
};

struct StoreResult {
  // get: the value; compare_set: the value the key holds afterwards (or
  // `expected` when it did not exist and `expected` was not empty).
  std::string value;
  // add: the sum; num_keys: the count.
  int64_t number = 0;
  // delete_key: whether it existed; check: whether every key exists.
  bool flag = false;
};

struct StoreLimits {
  size_t max_key_bytes = 4096;
  size_t max_value_bytes = 4 << 20;
  // Per job.
  size_t max_keys = 100000;
  size_t max_bytes = 256 << 20;
  size_t max_waits = 100000;
};

class KeyStore {
 public:
  using Done = std::function<void(absl::StatusOr<StoreResult>)>;

  // `clock` and `log` (may be null) are not owned.
  KeyStore(Clock* clock, StoreLimits limits, StateLog* log);
  ~KeyStore();

  KeyStore(const KeyStore&) = delete;
  KeyStore& operator=(const KeyStore&) = delete;

  // Runs `op` on `job`'s keys; `done` runs once with its result:
  // INVALID_ARGUMENT for a malformed op (unknown kind, a missing or empty
  // key, an add on a value that is not a number or that overflows);
  // RESOURCE_EXHAUSTED past a limit; DEADLINE_EXCEEDED for a get or wait
  // whose keys did not all exist by its deadline; UNAVAILABLE after
  // Shutdown().
  void Run(const std::string& job, StoreOp op, Done done);

  // Ends the waits whose deadline passed; returns the next deadline
  // (InfiniteFuture() for none).
  absl::Time ExpireWaits();
  absl::Time NextDeadline() const;

  // Takes over `keys` (job, key, value), as the leader before wrote them.
  void Restore(const std::vector<StoredKey>& keys);

  // Ends every wait with `status`; later ops get it too.
  void Shutdown(const absl::Status& status);

 private:
  struct Wait {
    std::string job;
    StoreOp op;
    Done done;
  };
  struct Job {
    std::map<std::string, std::string> values;
    size_t bytes = 0;
  };
  using Completions = std::vector<std::function<void()>>;

  absl::Status ValidateLocked(const std::string& job, const StoreOp& op) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs an op that does not wait; returns its result.
  absl::StatusOr<StoreResult> ApplyLocked(const std::string& job,
                                          const StoreOp& op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets `key` of `job` to `value`, within the limits, writing it to the
  // log.
  absl::Status PutLocked(const std::string& job, const std::string& key,
                         std::string value) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether every key of a get or wait exists; sets the result.
  bool ReadyLocked(const std::string& job, const StoreOp& op,
                   StoreResult* result) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers the waits of `job` whose keys all exist now.
  void WakeLocked(const std::string& job, Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Clock* const clock_;  // not owned
  const StoreLimits limits_;
  StateLog* const log_;  // not owned; may be null

  mutable absl::Mutex mu_;
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::list<Wait> waits_ ABSL_GUARDED_BY(mu_);
  absl::Status shut_down_ ABSL_GUARDED_BY(mu_);
};

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_KEY_STORE_H_
