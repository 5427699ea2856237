// ResultHash: a 64-bit hash of a collective's result that ranks compute
// while they write it, so the coordinator can check at the commit that every
// rank holds the same bytes (a difference is DATA_LOSS on every rank).
//
// The hash is a sum over elements of a function of (element index, element
// bits), so it can be built from the pieces of a result in any order and
// any split into whole elements: a rank adds each chunk as it stores it,
// and ranks that wrote their output in different pieces agree whenever
// their bytes agree. Floating-point NaNs hash alike whatever their sign and
// payload (hardware differs there: a GPU canonicalises NaNs, a CPU keeps
// the payload), so only a difference in value counts. It detects
// corruption, not tampering: it is not a cryptographic hash.
//
// Lifecycle: one per call. Thread safety: thread-compatible.
#ifndef CHORUS_COMMON_RESULT_HASH_H_
#define CHORUS_COMMON_RESULT_HASH_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "common/dtype.h"

namespace chorus {

class ResultHash {
 public:
  // Hashes results of `dtype` (a valid dtype).
  explicit ResultHash(DType dtype);

  // Adds `bytes`, whole elements, found at byte `offset` of the result.
  // Each element of the result must be added exactly once.
  void Add(uint64_t offset, absl::string_view bytes);

  // Bytes added so far.
  uint64_t bytes() const { return bytes_; }

  // The hash of everything added.
  uint64_t value() const;

 private:
  const DType dtype_;
  const uint64_t element_size_;
  uint64_t sum_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace chorus

#endif  // CHORUS_COMMON_RESULT_HASH_H_
