// Where a host algorithm writes its output: the caller's place
// (AlgorithmArgs::output_place) when it can be written directly, else the
// output string, so that an in-place call on a caller's memory neither
// fills a string per call nor copies the result into the place after.
//
// Thread safety: plain functions of their arguments.
#ifndef CHORUS_SERVER_WORKER_ALGORITHMS_OUTPUT_PLACE_H_
#define CHORUS_SERVER_WORKER_ALGORITHMS_OUTPUT_PLACE_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/worker/algorithms/algorithm.h"

namespace chorus {

// Returns where an algorithm that writes every byte of its `bytes` of
// output writes it: args.output_place when set, at an address that is a
// multiple of `alignment`, and either `read_later` (bytes the algorithm
// still reads after it started writing) exactly or sharing none of its
// bytes; else *args.output, resized to `bytes` (old bytes left in it).
absl::Span<char> HostOutput(const AlgorithmArgs& args, uint64_t bytes,
                            uint64_t alignment,
                            absl::string_view read_later = {});

// Copies `from` to `to` unless they are the same bytes (they may overlap).
void MoveUnlessSame(absl::string_view from, char* to);

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_ALGORITHMS_OUTPUT_PLACE_H_
