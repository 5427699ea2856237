// RepeatAsks: which of a rank's small all-reduces ask the coordinator to
// plan them same_host, so that their repetitions run on the plan's segments
// without it (CollectiveRequest.repeats_same_host, same_host_binding.h).
//
// A small all-reduce rides with the call (inline). Its shape (dtype, count,
// op) asks for a same_host plan the second time the rank calls it in a
// group epoch, not the first (a shape called once never pays for segments),
// and only while no other call of the rank is asking: thousands of calls in
// flight at once ride inline, instead of each holding a thread through a
// planned call. The coordinator plans it same_host only when every rank
// asks, so ranks that decide differently only leave that call inline.
//
// Lifecycle: one per worker runtime; a rank's entries go with Drop() (its
// epoch ended) or, beyond kMaxRanks, the least recently used.
// Thread safety: thread-safe.
#ifndef CHORUS_SERVER_WORKER_REPEAT_ASKS_H_
#define CHORUS_SERVER_WORKER_REPEAT_ASKS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "chorus/types.h"

namespace chorus {

class RepeatAsks {
 public:
  // Ranks (group, epoch, rank) remembered; shapes remembered per rank.
  static constexpr size_t kMaxRanks = 16;
  static constexpr size_t kMaxShapes = 128;

  // Returns a token that `spec`, an all-reduce of rank `rank` in `group` at
  // `epoch`, asks for a same_host plan while the token lives: the rank
  // called its shape before and no other token of the rank lives. Returns
  // null otherwise, noting the shape as called.
  std::shared_ptr<const void> TryAsk(const std::string& group, uint64_t epoch,
                                     int rank, const CollectiveSpec& spec);
  // Forgets the rank's shapes (rank -1: every rank's) of `group` at `epoch`.
  void Drop(const std::string& group, uint64_t epoch, int rank = -1);

 private:
  struct Rank;
  absl::Mutex mu_;
  // Most recently used last.
  std::vector<std::shared_ptr<Rank>> ranks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_REPEAT_ASKS_H_
