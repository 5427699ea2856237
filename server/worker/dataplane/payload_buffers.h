// PayloadBuffers: the strings large data-plane payloads were received into,
// kept once their rank used them, so that the next payload of the same size
// is read into one of them: no allocation, no zero fill and no page faults
// per chunk of a large collective (a 64 MiB ring all-reduce of 4 ranks
// receives 96 chunks of 1 MiB per rank).
//
// Only payloads of at least kMinPooledBytes are kept, at most
// kMaxPooledBytes in all and kMaxPerSize of one size; a buffer given beyond
// those limits is freed. A buffer is handed out only for the exact size it
// has.
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

  // Keeps `buffer` for a later Take() of its size, within the limits above;
  // otherwise frees it.
  void Give(std::string buffer);

  // Bytes kept now.
  size_t kept_bytes() const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<size_t, std::vector<std::string>> kept_
      ABSL_GUARDED_BY(mu_);
  size_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_DATAPLANE_PAYLOAD_BUFFERS_H_
