// PayloadBuffers: the strings large data-plane payloads were received into,
// kept once their rank used them, so that the next payload of the same size
// is read into one of them: no allocation, no zero fill and no page faults
// per chunk of a large collective (a 64 MiB ring all-reduce of 4 ranks
// receives 96 chunks of 1 MiB per rank).
//
// Only payloads of at least kMinPooledBytes are kept, at most
// kMaxPooledBytes in all and kMaxPerSize of one size. When a buffer would
// take the total past its limit, buffers of the size used longest ago (taken
// or given) are freed first, so sizes that never recur (a block's odd last
// chunk, a collective run once) cannot crowd out the sizes every call uses;
// a buffer beyond kMaxPerSize is freed. A buffer is handed out only for the
// exact size it has.
//
// Lifecycle: one per worker runtime (its inbox owns it), shared by the
// data-plane listener (Take) and the ranks' transports (Give).
// Thread safety: thread-safe.
#ifndef CHORUS_SERVER_WORKER_DATAPLANE_PAYLOAD_BUFFERS_H_
#define CHORUS_SERVER_WORKER_DATAPLANE_PAYLOAD_BUFFERS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace chorus {

class PayloadBuffers {
 public:
  static constexpr size_t kMinPooledBytes = 64 << 10;
  static constexpr size_t kMaxPooledBytes = 32 << 20;
  static constexpr size_t kMaxPerSize = 16;

  PayloadBuffers() = default;
  PayloadBuffers(const PayloadBuffers&) = delete;
  PayloadBuffers& operator=(const PayloadBuffers&) = delete;

  // Moves a kept buffer of exactly `size` bytes (its old contents) into
  // `*out` and returns true; false, leaving `*out` alone, when none is kept.
  bool Take(size_t size, std::string* out);

  // Keeps `buffer` for a later Take() of its size, within the limits above
  // (freeing buffers of the stalest other sizes to make room); otherwise
  // frees it.
  void Give(std::string buffer);

  // Bytes kept now.
  size_t kept_bytes() const;

 private:
  // The buffers of one size, and when that size was last taken or given.
  struct SameSize {
    std::vector<std::string> buffers;
    uint64_t used = 0;
  };

  // Moves one buffer of the size other than `keep` used longest ago into
  // `evicted` (for the caller to free unlocked). Returns false when there
  // is none.
  bool EvictStalestLocked(size_t keep, std::vector<std::string>* evicted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<size_t, SameSize> kept_ ABSL_GUARDED_BY(mu_);
  size_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Counts takes and gives: the order of use.
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_DATAPLANE_PAYLOAD_BUFFERS_H_
