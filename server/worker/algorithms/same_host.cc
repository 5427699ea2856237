// The same_host plan: all-reduce between ranks whose workers run on one
// host, through shared memory (SharedSegments) instead of sockets.
//
//   A. Every rank copies the blocks of its input that its peers reduce
//      (block p for rank p: not its own) into a shared segment of its own
//      (its input area) and sends every other rank its pid and the
//      segment's descriptor and id.
//   B. Every rank maps each peer's segment. One that mapped them all
//      reduces element block r (r its rank) of every rank's input, in rank
//      order (its own from its input, the others from their input areas),
//      into its segment's result area (after the input area). Then it tells
//      everyone whether it mapped them all (and so reduced). Unless all did,
//      every rank falls back to the ring in this same call, on its input
//      (its output, which may be its input, was not written yet).
//   C. Every rank copies block p from rank p's result area into its output
//      (its own block from its own), then tells everyone it is done
//      reading, so no rank reuses its segment (or returns) while another
//      still reads it.
//
// Three rounds of messages; reducing before the second round (rather than
// after agreeing that all could map) saves one round, measured with
// chorus-bench --algorithm=same_host (bench/README.md, "Same host: three
// rounds instead of four"). A rank copies (n-1)/n of its input into shared
// memory and all of its output out of it, and reduces from where the data
// is: 2 - 1/n times the bytes copied per call where copying the whole input
// and publishing the reduced block cost 2 ("Same host: fewer copies").
//
// Each block is combined once, in rank order (in the accumulator type, e.g.
// f32 for f16/bf16, and rounded once), and copied: every rank gets
// bit-identical results.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/collective_metrics.h"
#include "server/reduce/cpu/cpu_reduce.h"
#include "server/worker/algorithms/algorithm.h"
#include "server/worker/algorithms/chunked.h"
#include "server/worker/algorithms/shared_segments.h"

namespace chorus {
namespace {

// What a rank tells its peers in step A.
struct Exposed {
  uint64_t pid = 0;
  int64_t fd = -1;
  uint64_t id = 0;
};

// Reduced in pieces of this size, so that the accumulator stays in cache
// while every source is combined into it.
constexpr uint64_t kPieceBytes = 256 << 10;

// Sends `message` to every other rank, then receives one from each.
absl::StatusOr<std::vector<std::string>> AllToAll(Transport& transport,
                                                  const std::string& message) {
  const int world = transport.world_size();
  for (int peer = 0; peer < world; ++peer) {
    if (peer == transport.rank()) continue;
    absl::Status sent = transport.Send(peer, message);
    if (!sent.ok()) return sent;
  }
  std::vector<std::string> received(world);
  for (int peer = 0; peer < world; ++peer) {
    if (peer == transport.rank()) continue;
    absl::StatusOr<std::string> data = transport.Recv(peer);
    if (!data.ok()) return data.status();
    received[peer] = *std::move(data);
  }
  return received;
}

// The peers' segments mapped for one call; unmapped when it ends.
class PeerSegments {
 public:
  explicit PeerSegments(int world) : peers_(world) {}
  ~PeerSegments() {
    for (const SharedSegments::Peer& peer : peers_) {
      if (peer.handle != nullptr) SharedSegments::Get().Unmap(peer);
    }
  }
  SharedSegments::Peer& operator[](int rank) { return peers_[rank]; }

 private:
  std::vector<SharedSegments::Peer> peers_;
};

// B. Maps every peer's segment exposed in `hellos`; returns whether every
// one could be mapped by this rank (false at once without `own_ok`).
absl::StatusOr<bool> MapPeers(const std::vector<std::string>& hellos, int rank,
                              uint64_t bytes, bool own_ok,
                              PeerSegments& peers) {
  bool mapped = own_ok;
  for (int peer = 0; peer < static_cast<int>(hellos.size()) && mapped; ++peer) {
    if (peer == rank) continue;
    Exposed theirs;
    if (hellos[peer].size() != sizeof(Exposed)) {
      return absl::InternalError(
          absl::StrCat("rank ", peer, " sent a malformed same_host hello"));
    }
    std::memcpy(&theirs, hellos[peer].data(), sizeof(Exposed));
    absl::StatusOr<SharedSegments::Peer> segment =
        theirs.fd < 0
            ? absl::UnavailableError("no segment")
            : SharedSegments::Get().MapPeer(
                  theirs.pid, static_cast<int>(theirs.fd), theirs.id, bytes);
    mapped = segment.ok();
    if (mapped) peers[peer] = *segment;
  }
  return mapped;
}

// B. Reduces block `rank` of every source, in rank order, into `result`
// (this rank's result area), combined in the accumulator type and rounded
// once (ReduceSources).
absl::Status ReduceOwnBlock(const AlgorithmArgs& args, int world, int rank,
                            const std::function<const char*(int)>& source,
                            char* result) {
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
        spec.op, spec.dtype, result + (piece.offset - mine.offset),
        sources.data(), world, piece.size / element, &accumulators);
    if (!reduced.ok()) return reduced;
    RecordReduce("cpu", piece.size * world, absl::Now() - start);
  }
  return absl::OkStatus();
}

// C. Copies every block from the result area of the rank that reduced it
// (`result(p)`: where block p starts there) and hashes the output.
// `corrupt_for_testing` flips a bit of the first block another rank reduced.
void CopyReducedBlocks(const AlgorithmArgs& args, int world,
                       const std::function<const char*(int)>& result,
                       char* out) {
  const CollectiveSpec& spec = args.spec;
  const uint64_t element = DTypeSize(spec.dtype);
  bool corrupted = false;
  for (int peer = 0; peer < world; ++peer) {
    const Range block = SplitRange(spec.count, element, world, peer);
    char* dst = out + block.offset;
    std::memcpy(dst, result(peer), block.size);
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

// A. Copies every block of `input` but this rank's own into `area` (the
// input area of its segment), each at its offset.
void CopyPeersBlocks(const CollectiveSpec& spec, int world, int rank,
                     absl::string_view input, char* area) {
  const uint64_t element = DTypeSize(spec.dtype);
  for (int peer = 0; peer < world; ++peer) {
    if (peer == rank) continue;
    const Range block = SplitRange(spec.count, element, world, peer);
    if (block.size > 0) {
      std::memcpy(area + block.offset, input.data() + block.offset, block.size);
    }
  }
}

// The bytes of the largest block of `spec` split among `world` ranks: what
// a segment holds after its input area.
uint64_t LargestBlockBytes(const CollectiveSpec& spec, int world) {
  uint64_t largest = 0;
  for (int r = 0; r < world; ++r) {
    largest = std::max(
        largest, SplitRange(spec.count, DTypeSize(spec.dtype), world, r).size);
  }
  return largest;
}

// A's message: this rank's pid and segment (none when `own` failed).
std::string HelloOf(const absl::StatusOr<SharedSegments::Own>& own) {
  Exposed self;
  self.pid = static_cast<uint64_t>(getpid());
  if (own.ok()) {
    self.fd = own->fd;
    self.id = own->id;
  }
  std::string hello(sizeof(Exposed), '\0');
  std::memcpy(hello.data(), &self, sizeof(Exposed));
  return hello;
}

// Whether every rank says "1" in `verdicts` (this rank's is `mine`).
bool AllSaidYes(const std::vector<std::string>& verdicts, int rank, bool mine) {
  bool all = mine;
  for (int peer = 0; peer < static_cast<int>(verdicts.size()); ++peer) {
    if (peer != rank) all = all && verdicts[peer] == "1";
  }
  return all;
}

}  // namespace

absl::Status RunSameHost(const AlgorithmArgs& args, Algorithm* ran) {
  const CollectiveSpec& spec = args.spec;
  if (spec.kind != CollectiveKind::kAllReduce) {
    return absl::InvalidArgumentError(
        absl::StrCat("the same_host plan runs all_reduce only, not ",
                     CollectiveKindName(spec.kind)));
  }
  Transport& transport = *args.transport;
  const int world = transport.world_size();
  const int rank = transport.rank();
  const uint64_t bytes = spec.count * DTypeSize(spec.dtype);
  const uint64_t segment_bytes = bytes + LargestBlockBytes(spec, world);
  // The output is written only in step C, after every rank read what it
  // needs of this rank's input (steps A and B), so the two may be the same
  // memory.
  char* out = args.output_place;
  if (out == nullptr) {
    args.output->resize(bytes);
    out = args.output->data();
  }

  // A. Copy the input into a shared segment and expose it. Without one,
  // this rank says it cannot take part (step B), and all fall back.
  absl::StatusOr<SharedSegments::Own> own =
      SharedSegments::Get().Acquire(segment_bytes);
  struct Releaser {
    const absl::StatusOr<SharedSegments::Own>& own;
    ~Releaser() {
      if (own.ok()) SharedSegments::Get().Release(*own);
    }
  } releaser{own};
  if (own.ok()) CopyPeersBlocks(spec, world, rank, args.input, own->data);
  absl::StatusOr<std::vector<std::string>> hellos =
      AllToAll(transport, HelloOf(own));
  if (!hellos.ok()) return hellos.status();

  // B. Map every peer's segment and, where all are, reduce this rank's
  // block; agree on whether every rank could.
  PeerSegments peers(world);
  absl::StatusOr<bool> mapped =
      MapPeers(*hellos, rank, segment_bytes, own.ok(), peers);
  if (!mapped.ok()) return mapped.status();
  const std::function<const char*(int)> input = [&](int r) -> const char* {
    return r == rank ? args.input.data() : peers[r].data;
  };
  if (*mapped) {
    absl::Status reduced =
        ReduceOwnBlock(args, world, rank, input, own->data + bytes);
    if (!reduced.ok()) return reduced;
  }
  absl::StatusOr<std::vector<std::string>> verdicts =
      AllToAll(transport, *mapped ? "1" : "0");
  if (!verdicts.ok()) return verdicts.status();
  if (!AllSaidYes(*verdicts, rank, *mapped)) {
    if (ran != nullptr) *ran = Algorithm::kRing;
    return RunRing(args);
  }

  // C. Copy the reduced blocks, then wait until no rank reads any more.
  const std::function<const char*(int)> result = [&](int r) -> const char* {
    return (r == rank ? own->data : peers[r].data) + bytes;
  };
  CopyReducedBlocks(args, world, result, out);
  absl::StatusOr<std::vector<std::string>> done = AllToAll(transport, "d");
  if (!done.ok()) return done.status();
  return absl::OkStatus();
}

}  // namespace chorus
