// Same-host all-reduces repeated without the coordinator.
//
// A same_host call planned by the coordinator ends with every rank holding
// a segment of its own and every peer's mapped (same_host.cc). A rank keeps
// them, bound to its group epoch, with the call's shape (dtype, count, op):
// a later all-reduce of a shape the coordinator planned same_host runs on
// them directly, the ranks agreeing through their segments' headers instead
// of asking the coordinator, which learns of it with the rank's next call
// there (CollectiveRequest.leader_ran), as of a call under the leader plan.
//
// Each rank writes only its own segment's stage word and fingerprint (the
// call's sequence and shape); for call n its stage passes through
//   arrived(n)   its peers' blocks are in its segment, its fingerprint set;
//   withdrawn(n) it goes to the coordinator with call n (instead of go);
//   go(n)        it saw every rank arrived with its own fingerprint;
//   reduced(n), done(n)  as in the planned call's steps B and C.
// A rank goes on to reduce only once every rank said go; it may withdraw
// only before it said go (its patience ran out, a fingerprint differs, a
// peer withdrew), so either every rank reduces or every rank asks the
// coordinator, which then judges the call as any other: calls that differ
// (INVALID_ARGUMENT with every rank's account), ranks that never call
// (named at the deadline), aborted groups. A peer's stage beyond call n
// means it withdrew from n (it cannot have finished n without this rank).
// Failures while reducing are the transport's (abort, lost peer,
// deadline), reported by the runtime for the group's verdict. A rank that
// fails waiting for its peers' done(n) looks once more for a short grace, so
// it does not fail where its peers succeed unless one of them is held up
// longer than that.
//
// Lifecycle: a binding is made by RunSameHost (AlgorithmArgs) and kept by
// the runtime until its epoch ends, a call on it fails, or a newer same_host
// call replaces it; its own segment is then discarded, never reused (peers
// may still read its last stage).
// Thread safety: thread-safe; one call runs on a binding at a time, the one
// that claimed it (a second one at once goes to the coordinator).
#ifndef CHORUS_SERVER_WORKER_ALGORITHMS_SAME_HOST_BINDING_H_
#define CHORUS_SERVER_WORKER_ALGORITHMS_SAME_HOST_BINDING_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/types.h"
#include "server/worker/algorithms/shared_segments.h"
#include "server/worker/dataplane/transport.h"

namespace chorus {

// How a call on a binding ended.
enum class BoundEnd {
  // With the status RunBoundSameHost() returned.
  kDone,
  // Withdrawn: the call goes to the coordinator.
  kAskCoordinator,
};

struct BoundCallArgs {
  uint64_t sequence = 0;
  CollectiveSpec spec;
  // This rank's input; the output goes to `output_place` when set (it may
  // be the input's memory), else to *output.
  absl::string_view input;
  std::string* output = nullptr;
  char* output_place = nullptr;
  // Waits for the peers end at `patience` (its deadline) while they are
  // still to arrive, and at `transport`'s deadline after.
  Transport* patience = nullptr;
  Transport* transport = nullptr;
  // How long a rank whose wait for the peers' done failed looks again.
  absl::Duration grace = absl::Milliseconds(100);
};

class SameHostBinding {
 public:
  // Takes over `own` (leased) and `peers` (mapped; this rank's entry
  // empty); `tickets[r]` is the lease ticket rank r's segment had in the
  // call that made the binding.
  SameHostBinding(int world, int rank, SharedSegments::Own own,
                  std::vector<SharedSegments::Peer> peers,
                  std::vector<uint64_t> tickets);
  ~SameHostBinding();
  SameHostBinding(const SameHostBinding&) = delete;
  SameHostBinding& operator=(const SameHostBinding&) = delete;

  int world() const { return world_; }
  int rank() const { return rank_; }
  // Bytes every segment of the binding holds at least.
  uint64_t capacity() const;
  // Claims the binding for one call: returns false when another call holds
  // it (that call then goes to the coordinator). The call's
  // RunBoundSameHost() (or WithdrawBound()) and Unclaim() may run on
  // another thread than the claim.
  bool TryClaim();
  void Unclaim();

  // Notes that the coordinator planned `spec` same_host in this epoch.
  void AddShape(const CollectiveSpec& spec);
  // Adds the shapes `older` holds (the binding this one replaces).
  void AddShapesOf(const SameHostBinding& older);
  // Whether `spec` is an all-reduce of a shape added, which fits.
  bool Fits(const CollectiveSpec& spec) const;

  // The stage rank `r`'s segment holds for `step` of call `sequence`.
  enum class Step : uint64_t {
    kArrived = 1,
    kWithdrawn = 2,
    kGo = 3,
    kReduced = 4,
    kDone = 5,
  };
  uint64_t StageOf(int r, uint64_t sequence, Step step) const;

 private:
  friend class BoundCall;
  friend absl::StatusOr<BoundEnd> RunBoundSameHost(SameHostBinding& binding,
                                                   const BoundCallArgs& args);
  friend void WithdrawBound(SameHostBinding& binding, uint64_t sequence);

  const int world_;
  const int rank_;
  const SharedSegments::Own own_;
  const std::vector<SharedSegments::Peer> peers_;
  const std::vector<uint64_t> tickets_;
  // Set while a call holds the binding (TryClaim()).
  std::atomic<bool> claimed_{false};
  mutable absl::Mutex shapes_mu_;
  std::vector<CollectiveSpec> shapes_ ABSL_GUARDED_BY(shapes_mu_);
};

// Runs this rank's half of call args.sequence on `binding`, which the
// caller claimed (SameHostBinding::TryClaim()). Returns kDone
// (the output written) or kAskCoordinator (nothing written; every rank of
// the call asks the coordinator too); or the transport's errors while
// reducing, for the runtime to report (no rank then succeeds, within the
// grace).
absl::StatusOr<BoundEnd> RunBoundSameHost(SameHostBinding& binding,
                                          const BoundCallArgs& args);

// The bindings of one worker's ranks, one per group epoch and rank; a newer
// epoch's replaces the older ones of its group, and beyond kMaxBindings the
// least recently kept goes (its rank's calls then ask the coordinator again).
// Thread-safe.
class SameHostBindings {
 public:
  static constexpr size_t kMaxBindings = 8;

  // Returns rank `rank`'s binding in `group` at `epoch`, or null.
  std::shared_ptr<SameHostBinding> Find(const std::string& group,
                                        uint64_t epoch, int rank) const;
  // Keeps `binding` for the rank, in place of its last one, whose shapes it
  // takes over.
  void Keep(const std::string& group, uint64_t epoch, int rank,
            std::shared_ptr<SameHostBinding> binding);
  // Drops the rank's binding (rank -1: every rank's) of `group` at `epoch`.
  void Drop(const std::string& group, uint64_t epoch, int rank = -1);

 private:
  struct Kept {
    std::string group;
    uint64_t epoch = 0;
    int rank = 0;
    std::shared_ptr<SameHostBinding> binding;
  };
  mutable absl::Mutex mu_;
  // Most recently kept last.
  std::vector<Kept> kept_ ABSL_GUARDED_BY(mu_);
};

// Tells the peers that call `sequence` of this rank goes to the coordinator,
// so they do not wait for it; does nothing while another call holds the
// binding.
void WithdrawBound(SameHostBinding& binding, uint64_t sequence);

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_ALGORITHMS_SAME_HOST_BINDING_H_
