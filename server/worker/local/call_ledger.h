// CallLedger: the sequence numbers each rank of a daemon's memberships has
// used, so that the local API refuses a number used twice, finds a number
// skipped, and answers a retried call (its reply was lost) with the outcome
// of the first attempt rather than running it again.
//
// A rank numbers its collectives 1, 2, 3, ... in each group epoch; calls
// issued together may reach the daemon out of order, so a call whose number
// is above one not yet used waits (without holding a lock) for the lower
// numbers to be used, until its deadline: only then is the gap a skip. The
// ledger keeps the outcome of each rank's latest call (the highest number
// taken; its output up to kMaxKeptOutputBytes) and follows the calls still
// running, so a retry of either gets the first attempt's outcome.
//
// Lifecycle: constructed with the local API; Close() ends every wait.
// Thread safety: all methods are thread-safe.
#ifndef CHORUS_SERVER_WORKER_LOCAL_CALL_LEDGER_H_
#define CHORUS_SERVER_WORKER_LOCAL_CALL_LEDGER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/types.h"

namespace chorus {

class SharedRegion;

// How far past a rank's lowest unused number a call's number may be: calls
// further ahead are refused at once (as the coordinator's sequence window).
inline constexpr uint64_t kMaxNumbersAhead = 1024;

// The largest output the ledger keeps for a retry: 64 MiB.
inline constexpr uint64_t kMaxKeptOutputBytes = uint64_t{64} << 20;

// What identifies a call for its retries: the same number with the same
// identity again is a retry. Compared on every call, described only in a
// status.
struct CallIdentity {
  CollectiveSpec spec;
  Algorithm algorithm = Algorithm::kUnspecified;
  // The device the call named; none: the rank's own.
  std::optional<Device> device;
  uint64_t input_bytes = 0;

  bool operator==(const CallIdentity& other) const;
  bool operator!=(const CallIdentity& other) const { return !(*this == other); }
  // E.g. "all_reduce f32[4] sum (algorithm 0, device of the rank, 16 bytes
  // of input)".
  std::string Describe() const;
};

// How a call that took its number ended.
struct CallOutcome {
  absl::Status status;
  Algorithm algorithm = Algorithm::kUnspecified;
  uint64_t chunk_bytes = 0;
  std::string output;
  // A call that wrote its output into shared memory keeps it there: the
  // region (mapped while the outcome is kept) and the output's bytes in
  // it; `output` is then empty.
  std::shared_ptr<const SharedRegion> output_region;
  absl::string_view shared_output;
  // A call that wrote its output into its caller's own memory
  // (CallerMemory) keeps none: a retry of it is refused.
  bool output_dropped = false;
};

class CallLedger {
 public:
  CallLedger() = default;
  CallLedger(const CallLedger&) = delete;
  CallLedger& operator=(const CallLedger&) = delete;

  // Uses number `sequence` for `rank` of `group` at `epoch` once every lower
  // number of that epoch is used, waiting for them until `deadline`. A newer
  // epoch starts again from 1. The same number with the same `call` again
  // is a retry. Returns OK when the call now holds its number (run it, then
  // Keep() its outcome), or OK with `*retried` set to the first attempt's
  // outcome for a retry (waiting until `deadline` for an attempt still
  // running); otherwise the number stays free and:
  // - INVALID_ARGUMENT: sequence 0; a number kMaxNumbersAhead or more past
  //   the lowest unused one (at once); a lower number still unused at
  //   `deadline` (the message names it: the client skipped it);
  // - FAILED_PRECONDITION: the number was used already by another call, or
  //   by an older one than the rank's newest finished call (not kept);
  //   `epoch` is older than one seen since; the rank left (Forget());
  // - DEADLINE_EXCEEDED: a retry whose first attempt was still running at
  //   `deadline`;
  // - UNAVAILABLE: Close() was called.
  absl::Status Use(const std::string& group, int rank, uint64_t epoch,
                   uint64_t sequence, const CallIdentity& call,
                   absl::Time deadline, std::optional<CallOutcome>* retried);

  // Whether Use() of `sequence` for `rank` of `group` at `epoch` may wait
  // now: a lower number of that epoch is still unused, or it is a retry of
  // an attempt still running. Once false it stays false for that call, so
  // a caller that must not block can run Use() itself when it is false.
  bool MayWait(const std::string& group, int rank, uint64_t epoch,
               uint64_t sequence);

  // Records how the call that took `sequence` (in Use) ended, for its
  // retries; an output over kMaxKeptOutputBytes is not kept (its retries
  // get FAILED_PRECONDITION saying so). Forgets the outcomes of the rank's
  // older finished calls.
  void Keep(const std::string& group, int rank, uint64_t epoch,
            uint64_t sequence, CallOutcome outcome);

  // Forgets `rank` of `group` at `epoch` (it left: its hold ended); calls
  // waiting in Use() for it get FAILED_PRECONDITION. Nothing happens for
  // another epoch.
  void Forget(const std::string& group, int rank, uint64_t epoch);

  // Ends every wait in Use() with UNAVAILABLE, now and later.
  void Close();

  // Blocks until `count` calls are inside Use() for `rank` of `group`.
  void AwaitCallsForTesting(const std::string& group, int rank, int count);

 private:
  // A call that took its number: running, or the rank's newest finished.
  struct Entry {
    CallIdentity call;
    bool finished = false;
    CallOutcome outcome;
  };
  struct Numbers {
    uint64_t epoch = 0;
    // The lowest number not used yet, and the higher ones already used.
    uint64_t lowest_unused = 1;
    absl::flat_hash_set<uint64_t> used_ahead;
    std::map<uint64_t, Entry> calls;
    // Use() calls looking at this entry; a Forget() while there are any
    // marks it forgotten, and the last of them erases it.
    int users = 0;
    bool forgotten = false;
  };
  using Key = std::pair<std::string, int>;

  // Whether `sequence` of `numbers` was used already.
  static bool Used(const Numbers& numbers, uint64_t sequence);
  // Answers a retry of used number `sequence` of `numbers`.
  absl::Status RetryLocked(const std::string& who, Numbers& numbers,
                           uint64_t epoch, uint64_t sequence,
                           const CallIdentity& call, absl::Time deadline,
                           std::optional<CallOutcome>* retried)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  // Node-stable: a reference to a rank's Numbers survives insertions.
  absl::node_hash_map<Key, Numbers> ranks_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_LOCAL_CALL_LEDGER_H_
