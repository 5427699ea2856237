// What the device-buffer tests (on a real GPU and on emulated ones) do to a
// ReduceBuffer: the specs, inputs and steps a ring and recursive doubling
// apply, so that a device buffer can be compared with a HostReduceBuffer
// given the same steps.
//
// Pure functions; thread-safe.
#ifndef CHORUS_TESTS_TESTING_REDUCE_BUFFER_STEPS_H_
#define CHORUS_TESTS_TESTING_REDUCE_BUFFER_STEPS_H_

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/collective.h"
#include "server/worker/algorithms/reduce_buffer.h"

namespace chorus::test {

inline CollectiveSpec AllReduceSpec(DType dtype, ReduceOp op, uint64_t count) {
  CollectiveSpec spec;
  spec.kind = CollectiveKind::kAllReduce;
  spec.dtype = dtype;
  spec.op = op;
  spec.count = count;
  return spec;
}

// `count` i32 values starting at `first`, as bytes.
inline std::string Ints(int32_t first, uint64_t count) {
  std::string bytes(count * sizeof(int32_t), '\0');
  for (uint64_t i = 0; i < count; ++i) {
    const int32_t v = first + static_cast<int32_t>(i * 7 % 1000) - 500;
    std::memcpy(bytes.data() + i * sizeof(v), &v, sizeof(v));
  }
  return bytes;
}

// Combines into both halves of a buffer of `bytes` bytes (i32) in both
// orders, three rounds (so chunks pass through both staging slots), reads
// one half, combines again, stores the read half back and finishes avg over
// 3 ranks. Returns the first error.
inline absl::Status Steps(ReduceBuffer& buffer, uint64_t bytes) {
  const Range first{0, bytes / 2 / 4 * 4};
  const Range second{first.size, bytes - first.size};
  for (int round = 0; round < 3; ++round) {
    if (absl::Status s =
            buffer.Combine(first, Ints(3 + round, first.size / 4), false);
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            buffer.Combine(second, Ints(9 - round, second.size / 4), true);
        !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<absl::string_view> read = buffer.Read(second);
  if (!read.ok()) return read.status();
  const std::string copy(*read);
  if (absl::Status s = buffer.Combine(first, Ints(-4, first.size / 4), true);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = buffer.Store(second, copy); !s.ok()) return s;
  return buffer.FinalizeAvg(Range{0, bytes}, 3);
}

}  // namespace chorus::test

#endif  // CHORUS_TESTS_TESTING_REDUCE_BUFFER_STEPS_H_
