// The data-plane algorithms a worker runs for a plan: the chunked ring
// (every collective kind) and recursive doubling (all-reduce). Each rank of
// a collective runs the same function with its own input; messages go
// through a Transport. Results are identical on every rank: every
// reduced element is combined in one order, then copied.
//
// Stateless functions; each call uses only its arguments.
#ifndef CHORUS_SERVER_WORKER_ALGORITHMS_ALGORITHM_H_
#define CHORUS_SERVER_WORKER_ALGORITHMS_ALGORITHM_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/collective.h"
#include "common/result_hash.h"
#include "server/worker/algorithms/reduce_buffer.h"
#include "server/worker/dataplane/transport.h"

namespace chorus {

class SameHostBinding;  // same_host_binding.h

struct AlgorithmArgs {
  CollectiveSpec spec;
  // Largest message the algorithm sends, in bytes (rounded down to whole
  // elements, at least one element).
  uint64_t chunk_bytes = 1 << 20;
  // This rank's input, InputBytes() long (off-root inputs of broadcast and
  // scatter may be empty).
  absl::string_view input;
  // Receives this rank's output, OutputBytes() long.
  std::string* output = nullptr;
  // When set (not owned, OutputBytes() long; it may be the input's memory),
  // same_host, recursive doubling and the ring (but for scatter and
  // all_to_all) write the output here instead, where HostOutput()
  // (output_place.h) allows, and then leave `output` alone; the others
  // ignore it.
  char* output_place = nullptr;
  // Not owned.
  Transport* transport = nullptr;
  // For all_reduce, reduce and reduce_scatter under the ring and recursive
  // doubling: when set, the buffer to reduce in (not owned), already holding
  // this rank's input in the work type (WorkSpec(spec)), which `input` then
  // need not repeat. all_reduce then leaves its result in *work and leaves
  // `output` alone, except when the work type is wider than the spec's:
  // then the result, rounded to the spec's type, is in `output`. reduce and
  // reduce_scatter write `output` as usual. When null, the algorithms work on a
  // host copy of `input`.
  ReduceBuffer* work = nullptr;
  // When set (not owned), the algorithm adds every byte of this rank's
  // output to it as it writes them, for the commit's check that every rank
  // holds the same result. Used by all_reduce, all_gather and broadcast;
  // recursive doubling on a `work` buffer adds nothing.
  ResultHash* hash = nullptr;
  // Test only: flips one bit of the first piece of the result this rank
  // takes from a peer, as a corrupted transfer would, before hashing it.
  bool corrupt_for_testing = false;
  // When set (not owned) and the same_host plan ran to its end, receives
  // the segments it used, bound for later calls (same_host_binding.h).
  std::shared_ptr<SameHostBinding>* bind_same_host = nullptr;
};

// Runs any collective kind except barrier with ring-style schedules:
// reduce-scatter + all-gather rings for all_reduce, a ring for all_gather
// and reduce_scatter, a pipelined chain for broadcast, reduce-scatter then
// gather for reduce, direct sends for gather and scatter, shifted pairwise
// exchange for all_to_all. Returns the transport's errors, or INVALID_ARGUMENT.
absl::Status RunRing(const AlgorithmArgs& args);

// Runs all_reduce by recursive doubling (any world size: the ranks beyond
// the largest power of two fold into a partner first). Returns the transport's
// errors, or INVALID_ARGUMENT for another kind.
absl::Status RunRecursiveDoubling(const AlgorithmArgs& args);

// Runs all_reduce between ranks on one host through shared memory
// (SharedSegments): each rank copies its input into a segment its peers
// map, reduces one block of every segment, then copies the others' blocks.
// Falls back to RunRing, on every rank alike, when some rank cannot map
// another's segment. Sets *ran (when not null) to the algorithm that ran:
// kSameHost, or kRing after a fallback. Returns the transport's errors, or
// INVALID_ARGUMENT for another kind.
// Exists because: ranks on one host reduce through shared memory instead
// of TCP: a 64 MiB all_reduce took 34.9 ms this way against 89.8 ms on the
// TCP ring at 4 ranks, 16.4 against 28.1 ms at 2 (bench/README.md, "Latest
// comparison", the chorus and chorus-tcp rows).
absl::Status RunSameHost(const AlgorithmArgs& args, Algorithm* ran = nullptr);

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_ALGORITHMS_ALGORITHM_H_
