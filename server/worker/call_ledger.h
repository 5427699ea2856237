// CallLedger: the sequence numbers each rank of a daemon's memberships has
// used, so that the local API refuses a number used twice and finds a
// number skipped. A rank numbers its collectives 1, 2, 3, ... in each group
// epoch; calls issued together may reach the daemon out of order, so a call
// whose number is above one not yet used waits (without holding a lock) for
// the lower numbers to be used, until its deadline: only then is the gap a
// skip.
//
// Lifecycle: constructed with the local API; Close() ends every wait.
// Thread safety: all methods are thread-safe.
#ifndef CHORUS_SERVER_WORKER_CALL_LEDGER_H_
#define CHORUS_SERVER_WORKER_CALL_LEDGER_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace chorus {

// How far past a rank's lowest unused number a call's number may be: calls
// further ahead are refused at once (as the coordinator's sequence window).
inline constexpr uint64_t kMaxNumbersAhead = 1024;

class CallLedger {
 public:
  CallLedger() = default;
  CallLedger(const CallLedger&) = delete;
  CallLedger& operator=(const CallLedger&) = delete;

  // Uses number `sequence` for `rank` of `group` at `epoch` once every lower
  // number of that epoch is used, waiting for them until `deadline`. A newer
  // epoch starts again from 1. Returns OK when the call now holds its
  // number; otherwise the number stays free and:
  // - INVALID_ARGUMENT: sequence 0; a number kMaxNumbersAhead or more past
  //   the lowest unused one (at once); a lower number still unused at
  //   `deadline` (the message names it: the client skipped it);
  // - FAILED_PRECONDITION: the number was used already; `epoch` is older
  //   than one seen since;
  // - UNAVAILABLE: Close() was called.
  absl::Status Use(const std::string& group, int rank, uint64_t epoch,
                   uint64_t sequence, absl::Time deadline);

  // Ends every wait in Use() with UNAVAILABLE, now and later.
  void Close();

 private:
  struct Numbers {
    uint64_t epoch = 0;
    // The lowest number not used yet, and the higher ones already used.
    uint64_t lowest_unused = 1;
    absl::flat_hash_set<uint64_t> used_ahead;
  };
  using Key = std::pair<std::string, int>;

  absl::Mutex mu_;
  absl::node_hash_map<Key, Numbers> ranks_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_CALL_LEDGER_H_
