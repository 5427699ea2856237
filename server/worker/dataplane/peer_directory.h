// PeerDirectory: which worker holds each rank of the groups this worker
// joined, so that with TLS a data-plane stream is accepted only from the
// worker that is the sending rank (a member of a group with this worker),
// not from any certificate of the cluster.
//
// A peer can send before this worker has heard the reply to its own join
// (both replies leave the coordinator together), so a chunk for a group
// epoch not learned yet is neither accepted nor refused: its stream waits
// (WaitFor) until Learn() brings that epoch or a newer one.
//
// A large group's epoch may be learned partially (LearnPartial: only this
// worker's own rank, the join reply listing no members); its other ranks
// are learned as they are fetched from the coordinator (LearnRanks). A
// chunk from a rank not fetched yet waits too, and WaitFor asks the
// resolver (SetResolver) to fetch it.
//
// Lifecycle: owned by the worker runtime, outlives the peer service.
// Thread safety: all methods are thread-safe; WaitFor's callbacks run on
// the thread that calls Learn, after it let go of the directory's lock.
#ifndef CHORUS_SERVER_WORKER_DATAPLANE_PEER_DIRECTORY_H_
#define CHORUS_SERVER_WORKER_DATAPLANE_PEER_DIRECTORY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace chorus {

class PeerDirectory {
 public:
  // The last sending rank a stream was admitted for. A group epoch's
  // members never change, so a stream's later frames from that rank need
  // no lookup. Not thread-safe: one per stream.
  struct Admitted {
    std::string group;
    uint64_t epoch = 0;
    int rank = -1;

    bool Covers(const std::string& g, uint64_t e, int r) const {
      return r == rank && e == epoch && g == group;
    }
    void Set(const std::string& g, uint64_t e, int r) {
      group = g;
      epoch = e;
      rank = r;
    }
  };

  enum class Verdict { kMember, kNotMember, kUnknown };

  // A rank learned from the coordinator: its worker's name and data-plane
  // address.
  struct RankPeer {
    int rank = 0;
    std::string name;
    std::string address;
  };

  // Fetches ranks of a partially learned epoch: called by WaitFor, without
  // the directory's lock, with the epoch, this worker's rank there and the
  // rank wanted; it may block (a bounded RPC) and learns what it fetched
  // with LearnRanks.
  using Resolver = std::function<void(const std::string& group, uint64_t epoch,
                                      int self_rank, int rank)>;

  // Records the worker name of every rank of `group` at `epoch`. Keeps the
  // last few epochs of each group; runs the waiters now answerable.
  void Learn(const std::string& group, uint64_t epoch,
             std::vector<std::string> worker_names);

  // Records `group` at `epoch` with `world_size` ranks of which only
  // `self_rank`, held by this worker (`self`), is known yet.
  void LearnPartial(const std::string& group, uint64_t epoch, int world_size,
                    const RankPeer& self);

  // Adds `peers` to a partially learned epoch (nothing for an epoch not
  // remembered); runs the waiters now answerable.
  void LearnRanks(const std::string& group, uint64_t epoch,
                  const std::vector<RankPeer>& peers);

  // The data-plane address of `rank` of `group` at `epoch` learned by
  // LearnRanks (or LearnPartial for this worker's own); "" when not known.
  std::string Address(const std::string& group, uint64_t epoch, int rank) const;

  // Sets the resolver (see Resolver); call before chunks arrive.
  void SetResolver(Resolver resolver);

  // Returns kMember when worker `name` holds `rank` of `group` at `epoch`,
  // kNotMember when another worker does (or the rank does not exist, or the
  // epoch is older than any remembered), kUnknown when this worker has not
  // learned that epoch yet, or learned it partially and not that rank.
  Verdict Check(const std::string& group, uint64_t epoch, int rank,
                const std::string& name) const;

  // Returns the name of the worker that holds `rank` of `group` at `epoch`,
  // or "" when this worker has not learned it (or forgot it).
  std::string WorkerName(const std::string& group, uint64_t epoch,
                         int rank) const;

  // Sets *verdict to Check's answer for these arguments. When that is
  // kUnknown, also arranges for `ready` to run with the answer once it is
  // known, and returns a token for Cancel; otherwise returns 0 and `ready`
  // never runs. For a rank not fetched yet of a partially learned epoch, it
  // calls the resolver before it returns (`ready` may then run on this
  // thread, before WaitFor returns).
  uint64_t WaitFor(const std::string& group, uint64_t epoch, int rank,
                   const std::string& name, Verdict* verdict,
                   std::function<void(Verdict)> ready);

  // Forgets a waiter. Returns true when its callback will not run; false
  // when it has run or is about to (Learn took it).
  bool Cancel(uint64_t token);

 private:
  // How many epochs of one group are remembered.
  static constexpr size_t kEpochsPerGroup = 4;
  struct Waiter {
    std::string group;
    uint64_t epoch = 0;
    int rank = 0;
    std::string name;
    std::function<void(Verdict)> ready;
  };

  // One group epoch: each rank's worker name ("" for a rank of a partial
  // epoch not fetched yet), and for a partial epoch this worker's rank and
  // the addresses fetched.
  struct Epoch {
    std::vector<std::string> names;
    int self_rank = -1;
    std::vector<std::string> addresses;
    bool partial() const { return self_rank >= 0; }
  };

  Verdict CheckLocked(const std::string& group, uint64_t epoch, int rank,
                      const std::string& name) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The remembered epoch, or null.
  const Epoch* FindLocked(const std::string& group, uint64_t epoch) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Stores `entry` as `group`'s `epoch` and runs the waiters now answerable.
  void Store(const std::string& group, uint64_t epoch, Epoch entry);
  // Takes the waiters of `group` that now have a verdict, with it.
  std::vector<std::pair<std::function<void(Verdict)>, Verdict>>
  TakeAnsweredLocked(const std::string& group)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::map<uint64_t, Epoch>> groups_
      ABSL_GUARDED_BY(mu_);
  Resolver resolver_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  uint64_t next_token_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_DATAPLANE_PEER_DIRECTORY_H_
