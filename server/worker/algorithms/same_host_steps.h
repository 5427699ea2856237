// The steps of a same_host all-reduce that the planned call (same_host.cc)
// and its repetitions without the coordinator (same_host_binding.cc) share:
// copying the blocks the peers reduce into this rank's segment, reducing
// this rank's block of every rank's input, and copying the reduced blocks
// out. Block p of the input is the one rank p reduces (SplitRange).
//
// Stateless functions; thread-compatible.
#ifndef CHORUS_SERVER_WORKER_ALGORITHMS_SAME_HOST_STEPS_H_
#define CHORUS_SERVER_WORKER_ALGORITHMS_SAME_HOST_STEPS_H_

#include <functional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/worker/algorithms/algorithm.h"

namespace chorus {

// Copies every block of `input` but this rank's own into `segment`, each at
// its offset.
void CopyPeersBlocks(const CollectiveSpec& spec, int world, int rank,
                     absl::string_view input, char* segment);

// Reduces block `rank` of every source (`source(r)`: rank r's input), in
// rank order, into `segment` (this rank's, at the block's offset), combined
// in the accumulator type and rounded once. Returns the reduction's
// INVALID_ARGUMENT for a spec it cannot combine.
absl::Status ReduceOwnBlock(const AlgorithmArgs& args, int world, int rank,
                            const std::function<const char*(int)>& source,
                            char* segment);

// Copies every block from the segment of the rank that reduced it
// (`segment(p)`, block p at its offset there) into `out` and hashes the
// output into args.hash when set. args.corrupt_for_testing flips a bit of
// the first block another rank reduced.
void CopyReducedBlocks(const AlgorithmArgs& args, int world,
                       const std::function<const char*(int)>& segment,
                       char* out);

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_ALGORITHMS_SAME_HOST_STEPS_H_
