// The shared steps of the same_host plan (same_host_steps.h).
#include "server/worker/algorithms/same_host_steps.h"

#include <cstring>
#include <string>
#include <vector>

#include "common/collective_metrics.h"
#include "server/reduce/cpu/cpu_reduce.h"
#include "server/worker/algorithms/chunked.h"

namespace chorus {
namespace {

// Reduced in pieces of this size, so that the accumulator stays in cache
// while every source is combined into it.
constexpr uint64_t kPieceBytes = 256 << 10;

}  // namespace

// B. Reduces block `rank` of every source, in rank order, into `segment`
// (this rank's, at the block's offset), combined in the accumulator type and
// rounded once (ReduceSources).
absl::Status ReduceOwnBlock(const AlgorithmArgs& args, int world, int rank,
                            const std::function<const char*(int)>& source,
                            char* segment) {
  const CollectiveSpec& spec = args.spec;
  const uint64_t element = DTypeSize(spec.dtype);
  const Range mine = SplitRange(spec.count, element, world, rank);
  const uint64_t piece_bytes = ElementChunkBytes(kPieceBytes, element);
  std::vector<const void*> sources(world);
  std::string accumulators;
  for (uint64_t c = 0; c < ChunkCount(mine.size, piece_bytes); ++c) {
    const Range piece = ChunkOf(mine, piece_bytes, c);
    for (int r = 0; r < world; ++r) sources[r] = source(r) + piece.offset;
    const absl::Time start = absl::Now();
    absl::Status reduced = cpu_reduce::ReduceSources(
        spec.op, spec.dtype, segment + piece.offset, sources.data(), world,
        piece.size / element, &accumulators);
    if (!reduced.ok()) return reduced;
    RecordReduce("cpu", piece.size * world, absl::Now() - start);
  }
  return absl::OkStatus();
}

// C. Copies every block from the segment of the rank that reduced it
// (`segment(p)`, block p at its offset there) and hashes the output.
// `corrupt_for_testing` flips a bit of the first block another rank reduced.
void CopyReducedBlocks(const AlgorithmArgs& args, int world,
                       const std::function<const char*(int)>& segment,
                       char* out) {
  const CollectiveSpec& spec = args.spec;
  const uint64_t element = DTypeSize(spec.dtype);
  bool corrupted = false;
  for (int peer = 0; peer < world; ++peer) {
    const Range block = SplitRange(spec.count, element, world, peer);
    char* dst = out + block.offset;
    std::memcpy(dst, segment(peer) + block.offset, block.size);
    // A block another rank reduced, as a corrupted copy would be.
    if (args.corrupt_for_testing && peer != args.transport->rank() &&
        block.size > 0 && !corrupted) {
      dst[0] ^= 1;
      corrupted = true;
    }
    if (args.hash != nullptr) {
      args.hash->Add(block.offset, absl::string_view(dst, block.size));
    }
  }
}

// A. Copies every block of `input` but this rank's own into `segment`, each
// at its offset.
void CopyPeersBlocks(const CollectiveSpec& spec, int world, int rank,
                     absl::string_view input, char* segment) {
  const uint64_t element = DTypeSize(spec.dtype);
  for (int peer = 0; peer < world; ++peer) {
    if (peer == rank) continue;
    const Range block = SplitRange(spec.count, element, world, peer);
    if (block.size > 0) {
      std::memcpy(segment + block.offset, input.data() + block.offset,
                  block.size);
    }
  }
}

}  // namespace chorus
