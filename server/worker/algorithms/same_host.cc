// The same_host plan: all-reduce between ranks whose workers run on one
// host, through shared memory (SharedSegments) instead of sockets.
//
//   A. Every rank copies its input into a shared segment of its own and
//      sends every other rank its pid and the segment's descriptor and id.
//   B. Every rank maps each peer's segment and sends everyone whether it
//      could map them all. Unless all could, every rank falls back to the
//      ring in this same call.
//   C. Rank r reduces element block r of every rank's segment, in rank
//      order, into its output, copies the result into its segment's block r,
//      then tells everyone.
//   D. Every rank copies block p from rank p's segment into its output, then
//      tells everyone it is done reading, so no rank reuses its segment (or
//      returns) while another still reads it.
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

// C. Reduces block `rank` of every source, in rank order, into the output
// (combined in the accumulator type and rounded once: ReduceSources), then
// publishes it in this rank's segment `own`.
absl::Status ReduceOwnBlock(const AlgorithmArgs& args, int world, int rank,
                            const std::function<const char*(int)>& source,
                            char* own, char* out) {
  const CollectiveSpec& spec = args.spec;
  const uint64_t element = DTypeSize(spec.dtype);
  const Range mine = SplitRange(spec.count, element, world, rank);
  const uint64_t piece_bytes = ElementChunkBytes(kPieceBytes, element);
  std::vector<const void*> sources(world);
  std::string accumulators;
  for (uint64_t c = 0; c < ChunkCount(mine.size, piece_bytes); ++c) {
    const Range piece = ChunkOf(mine, piece_bytes, c);
    char* dst = out + piece.offset;
    for (int r = 0; r < world; ++r) sources[r] = source(r) + piece.offset;
    const absl::Time start = absl::Now();
    absl::Status reduced =
        cpu_reduce::ReduceSources(spec.op, spec.dtype, dst, sources.data(),
                                  world, piece.size / element, &accumulators);
    if (!reduced.ok()) return reduced;
    RecordReduce("cpu", piece.size * world, absl::Now() - start);
    if (args.hash != nullptr) {
      args.hash->Add(piece.offset, absl::string_view(dst, piece.size));
    }
    std::memcpy(own + piece.offset, dst, piece.size);
  }
  return absl::OkStatus();
}

// D. Copies every other block from the rank that reduced it.
void CopyPeerBlocks(const AlgorithmArgs& args, int world, int rank,
                    const std::function<const char*(int)>& source, char* out) {
  const CollectiveSpec& spec = args.spec;
  const uint64_t element = DTypeSize(spec.dtype);
  bool corrupted = false;
  for (int peer = 0; peer < world; ++peer) {
    if (peer == rank) continue;
    const Range block = SplitRange(spec.count, element, world, peer);
    char* dst = out + block.offset;
    std::memcpy(dst, source(peer) + block.offset, block.size);
    if (args.corrupt_for_testing && block.size > 0 && !corrupted) {
      dst[0] ^= 1;
      corrupted = true;
    }
    if (args.hash != nullptr) {
      args.hash->Add(block.offset, absl::string_view(dst, block.size));
    }
  }
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
  // The input is read (step A) before any of the output is written, so the
  // two may be the same memory.
  char* out = args.output_place;
  if (out == nullptr) {
    args.output->resize(bytes);
    out = args.output->data();
  }

  // A. Copy the input into a shared segment and expose it. Without one,
  // this rank says it cannot take part (step B), and all fall back.
  absl::StatusOr<SharedSegments::Own> own =
      SharedSegments::Get().Acquire(bytes);
  struct Releaser {
    const absl::StatusOr<SharedSegments::Own>& own;
    ~Releaser() {
      if (own.ok()) SharedSegments::Get().Release(*own);
    }
  } releaser{own};
  Exposed self;
  self.pid = static_cast<uint64_t>(getpid());
  if (own.ok()) {
    if (bytes > 0) std::memcpy(own->data, args.input.data(), bytes);
    self.fd = own->fd;
    self.id = own->id;
  }
  std::string hello(sizeof(Exposed), '\0');
  std::memcpy(hello.data(), &self, sizeof(Exposed));
  absl::StatusOr<std::vector<std::string>> hellos = AllToAll(transport, hello);
  if (!hellos.ok()) return hellos.status();

  // B. Map every peer's segment; agree on whether every rank could.
  PeerSegments peers(world);
  absl::StatusOr<bool> mapped = MapPeers(*hellos, rank, bytes, own.ok(), peers);
  if (!mapped.ok()) return mapped.status();
  absl::StatusOr<std::vector<std::string>> verdicts =
      AllToAll(transport, *mapped ? "1" : "0");
  if (!verdicts.ok()) return verdicts.status();
  bool all_mapped = *mapped;
  for (int peer = 0; peer < world; ++peer) {
    if (peer != rank) all_mapped = all_mapped && (*verdicts)[peer] == "1";
  }
  if (!all_mapped) {
    if (ran != nullptr) *ran = Algorithm::kRing;
    return RunRing(args);
  }
  const std::function<const char*(int)> source = [&](int r) -> const char* {
    return r == rank ? own->data : peers[r].data;
  };

  // C and D, each followed by a step every rank must have finished.
  if (absl::Status reduced =
          ReduceOwnBlock(args, world, rank, source, own->data, out);
      !reduced.ok()) {
    return reduced;
  }
  absl::StatusOr<std::vector<std::string>> reduced = AllToAll(transport, "r");
  if (!reduced.ok()) return reduced.status();
  CopyPeerBlocks(args, world, rank, source, out);
  absl::StatusOr<std::vector<std::string>> done = AllToAll(transport, "d");
  if (!done.ok()) return done.status();
  return absl::OkStatus();
}

}  // namespace chorus
