// The same_host plan: all-reduce between ranks whose workers run on one
// host, reading each other's buffers with cross-memory copies
// (process_vm_readv) instead of sending them through sockets.
//
//   A. Every rank sends every other its pid, the addresses of its input and
//      output, and of a probe word holding a random token.
//   B. Every rank reads each peer's probe word and sends everyone whether
//      it could read every peer (and found the token). Unless all could,
//      every rank falls back to the ring in this same call.
//   C. Rank r reduces element block r of every rank's input, in rank order,
//      into its own output, then tells everyone.
//   D. Every rank copies block p from rank p's output into its own, then
//      tells everyone it is done reading, so no rank returns (and lets its
//      buffers go) while another still reads them.
//
// Each block is combined once, in rank order, and copied: every rank gets
// bit-identical results.
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "server/reduce/cpu/cpu_reduce.h"
#include "server/worker/algorithms/algorithm.h"
#include "server/worker/algorithms/chunked.h"

namespace chorus {
namespace {

// What a rank tells its peers in step A.
struct Exposed {
  uint64_t pid = 0;
  uint64_t input = 0;
  uint64_t output = 0;
  uint64_t probe = 0;
  uint64_t token = 0;
};

// Reduced and read in pieces of this size, so that each piece read from a
// peer is combined while it is still in cache.
constexpr uint64_t kPieceBytes = 256 << 10;

std::string Encode(const Exposed& e) {
  std::string out(sizeof(Exposed), '\0');
  std::memcpy(out.data(), &e, sizeof(Exposed));
  return out;
}

// Copies `size` bytes at `remote` in process `pid` to `local`. Returns
// UNAVAILABLE naming the rank when the memory cannot be read.
absl::Status ReadPeer(uint64_t pid, uint64_t remote, char* local, uint64_t size,
                      int rank) {
  while (size > 0) {
    iovec to{local, size};
    iovec from{reinterpret_cast<void*>(remote), size};
    const ssize_t n =
        process_vm_readv(static_cast<pid_t>(pid), &to, 1, &from, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot read the memory of rank ", rank, ": ",
                       n < 0 ? std::strerror(errno) : "nothing read"));
    }
    local += n;
    remote += static_cast<uint64_t>(n);
    size -= static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

// Sends `message` to every other rank, then receives one from each.
absl::StatusOr<std::vector<std::string>> AllToAll(CollectiveLink& link,
                                                  const std::string& message) {
  const int world = link.world_size();
  for (int peer = 0; peer < world; ++peer) {
    if (peer == link.rank()) continue;
    absl::Status sent = link.Send(peer, message);
    if (!sent.ok()) return sent;
  }
  std::vector<std::string> received(world);
  for (int peer = 0; peer < world; ++peer) {
    if (peer == link.rank()) continue;
    absl::StatusOr<std::string> data = link.Recv(peer);
    if (!data.ok()) return data.status();
    received[peer] = *std::move(data);
  }
  return received;
}

}  // namespace

absl::Status RunSameHost(const AlgorithmArgs& args) {
  const CollectiveSpec& spec = args.spec;
  if (spec.kind != CollectiveKind::kAllReduce) {
    return absl::InvalidArgumentError(
        absl::StrCat("the same_host plan runs all_reduce only, not ",
                     CollectiveKindName(spec.kind)));
  }
  CollectiveLink& link = *args.link;
  const int world = link.world_size();
  const int rank = link.rank();
  const uint64_t element = DTypeSize(spec.dtype);
  const uint64_t bytes = spec.count * element;
  std::string& out = *args.output;
  out.resize(bytes);

  // A. Expose the buffers.
  absl::BitGen gen;
  volatile uint64_t probe = absl::Uniform<uint64_t>(gen) | 1;
  Exposed self;
  self.pid = static_cast<uint64_t>(getpid());
  self.input = reinterpret_cast<uint64_t>(args.input.data());
  self.output = reinterpret_cast<uint64_t>(out.data());
  self.probe = reinterpret_cast<uint64_t>(&probe);
  self.token = probe;
  absl::StatusOr<std::vector<std::string>> hello = AllToAll(link, Encode(self));
  if (!hello.ok()) return hello.status();
  std::vector<Exposed> peers(world);
  peers[rank] = self;
  for (int peer = 0; peer < world; ++peer) {
    if (peer == rank) continue;
    if ((*hello)[peer].size() != sizeof(Exposed)) {
      return absl::InternalError(
          absl::StrCat("rank ", peer, " sent a malformed same_host hello"));
    }
    std::memcpy(&peers[peer], (*hello)[peer].data(), sizeof(Exposed));
  }

  // B. Agree on whether every rank can read every other.
  bool readable = true;
  for (int peer = 0; peer < world && readable; ++peer) {
    if (peer == rank) continue;
    uint64_t seen = 0;
    readable = ReadPeer(peers[peer].pid, peers[peer].probe,
                        reinterpret_cast<char*>(&seen), sizeof(seen), peer)
                   .ok() &&
               seen == peers[peer].token;
  }
  absl::StatusOr<std::vector<std::string>> verdicts =
      AllToAll(link, readable ? "1" : "0");
  if (!verdicts.ok()) return verdicts.status();
  bool all_readable = readable;
  for (int peer = 0; peer < world; ++peer) {
    if (peer != rank) all_readable = all_readable && (*verdicts)[peer] == "1";
  }
  if (!all_readable) return RunRing(args);

  // C. Reduce block `rank` of every input, in rank order.
  const Range mine = SplitRange(spec.count, element, world, rank);
  const uint64_t piece_bytes = ElementChunkBytes(kPieceBytes, element);
  std::string scratch(std::min(piece_bytes, mine.size), '\0');
  for (uint64_t c = 0; c < ChunkCount(mine.size, piece_bytes); ++c) {
    const Range piece = ChunkOf(mine, piece_bytes, c);
    char* dst = out.data() + piece.offset;
    for (int source = 0; source < world; ++source) {
      const char* src = args.input.data() + piece.offset;
      if (source != rank) {
        char* into = source == 0 ? dst : scratch.data();
        absl::Status read =
            ReadPeer(peers[source].pid, peers[source].input + piece.offset,
                     into, piece.size, source);
        if (!read.ok()) return read;
        src = into;
      }
      if (source == 0) {
        if (src != dst) std::memcpy(dst, src, piece.size);
        continue;
      }
      absl::Status reduced = cpu_reduce::ReduceInto(spec.op, spec.dtype, dst,
                                                    src, piece.size / element);
      if (!reduced.ok()) return reduced;
    }
    if (spec.op == ReduceOp::kAvg) {
      absl::Status finalized =
          cpu_reduce::FinalizeAvg(spec.dtype, dst, piece.size / element, world);
      if (!finalized.ok()) return finalized;
    }
  }
  absl::StatusOr<std::vector<std::string>> reduced = AllToAll(link, "r");
  if (!reduced.ok()) return reduced.status();

  // D. Copy every other block from the rank that reduced it.
  for (int peer = 0; peer < world; ++peer) {
    if (peer == rank) continue;
    const Range block = SplitRange(spec.count, element, world, peer);
    absl::Status read =
        ReadPeer(peers[peer].pid, peers[peer].output + block.offset,
                 out.data() + block.offset, block.size, peer);
    if (!read.ok()) return read;
  }
  absl::StatusOr<std::vector<std::string>> done = AllToAll(link, "d");
  if (!done.ok()) return done.status();
  return absl::OkStatus();
}

}  // namespace chorus
