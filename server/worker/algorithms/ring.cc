#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "server/reduce/cpu/cpu_reduce.h"
#include "server/worker/algorithms/algorithm.h"
#include "server/worker/algorithms/chunked.h"
#include "server/worker/algorithms/output_place.h"
#include "server/worker/algorithms/scratch.h"

namespace chorus {
namespace {

int Mod(int a, int n) { return ((a % n) + n) % n; }

struct Ring {
  const AlgorithmArgs& args;
  // What reductions work in (WorkSpec): the element size below is its
  // dtype's, so blocks and chunks hold whole accumulators.
  CollectiveSpec work_spec;
  int rank;
  int world;
  int next;
  int prev;
  uint64_t element;
  uint64_t chunk;
};

Ring MakeRing(const AlgorithmArgs& args) {
  const int rank = args.transport->rank();
  const int world = args.transport->world_size();
  const CollectiveSpec work_spec = WorkSpec(args.spec);
  const uint64_t element = DTypeSize(work_spec.dtype);
  return Ring{args,
              work_spec,
              rank,
              world,
              Mod(rank + 1, world),
              Mod(rank - 1, world),
              element,
              ElementChunkBytes(args.chunk_bytes, element)};
}

absl::Status Finalize(const CollectiveSpec& spec, ReduceBuffer& buffer,
                      const Range& range, int world) {
  if (spec.op != ReduceOp::kAvg) return absl::OkStatus();
  return buffer.FinalizeAvg(range, world);
}

// Reduce-scatter ring over `buffer` split into `block(i)`: afterwards rank r
// holds the full reduction of block r. At step s rank r sends block r-s-1
// and reduces block r-s-2 received from its predecessor into its own.
template <typename BlockFn>
absl::Status ReduceScatterRing(const Ring& ring, ReduceBuffer& buffer,
                               BlockFn block) {
  for (int s = 0; s + 1 < ring.world; ++s) {
    const Range send = block(Mod(ring.rank - s - 1, ring.world));
    const Range recv = block(Mod(ring.rank - s - 2, ring.world));
    absl::Status status = Exchange(
        *ring.args.transport, ring.next, SourceOf(buffer), send, ring.prev,
        recv, ring.chunk, [&](const Range& piece, const std::string& data) {
          return buffer.Combine(piece, data, /*data_first=*/false);
        });
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

// The result piece `data` as this rank keeps it: the same bytes, or with
// one bit flipped the first time when args.corrupt_for_testing. Used only
// for pieces the rank does not pass on, so that one rank's result differs.
absl::string_view TakeResultPiece(const AlgorithmArgs& args, bool& corrupted,
                                  absl::string_view data, std::string& copy) {
  if (!args.corrupt_for_testing || corrupted || data.empty()) return data;
  corrupted = true;
  copy.assign(data.data(), data.size());
  copy[0] ^= 1;
  return copy;
}

// All-gather ring: rank r starts with block r; at step s it sends block r-s
// and stores block r-s-1 from its predecessor. Every block ends up stored
// or sent exactly once, which is where args.hash sees it.
template <typename BlockFn>
absl::Status AllGatherRing(const Ring& ring, ReduceBuffer& buffer,
                           BlockFn block) {
  ResultHash* hash = ring.args.hash;
  if (ring.world == 1 && hash != nullptr) {
    const Range own = block(ring.rank);
    absl::StatusOr<absl::string_view> bytes = buffer.Read(own);
    if (!bytes.ok()) return bytes.status();
    hash->Add(own.offset, *bytes);
  }
  bool corrupted = false;
  std::string copy;
  for (int s = 0; s + 1 < ring.world; ++s) {
    const Range send = block(Mod(ring.rank - s, ring.world));
    const Range recv = block(Mod(ring.rank - s - 1, ring.world));
    ChunkSource source = SourceOf(buffer);
    if (s == 0 && hash != nullptr) {
      // This rank's own block, final now: hashed as it goes out.
      source = [&](const Range& piece) -> absl::StatusOr<absl::string_view> {
        absl::StatusOr<absl::string_view> bytes = buffer.Read(piece);
        if (bytes.ok()) hash->Add(piece.offset, *bytes);
        return bytes;
      };
    }
    absl::Status status =
        Exchange(*ring.args.transport, ring.next, source, send, ring.prev, recv,
                 ring.chunk, [&](const Range& piece, const std::string& data) {
                   // Blocks of the last step are not passed on (see
                   // TakeResultPiece).
                   const absl::string_view kept =
                       s + 2 == ring.world
                           ? TakeResultPiece(ring.args, corrupted, data, copy)
                           : absl::string_view(data);
                   if (hash != nullptr) hash->Add(piece.offset, kept);
                   return buffer.Store(piece, kept);
                 });
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

// The host all-reduce without widening: the reduce-scatter writes each
// block of the output for the first time as `input op received` (a rank
// receives each block there once) and sends its first block from the
// input, so the input is never copied into the output first. The output
// may be the input itself (each block of the input is read for the last
// time by the step that writes that block of the output), but not a part
// of it elsewhere.
template <typename BlockFn>
absl::Status HostAllReduce(const Ring& ring, BlockFn block) {
  const AlgorithmArgs& args = ring.args;
  const absl::Span<char> out =
      HostOutput(args, args.input.size(), ring.element, args.input);
  if (ring.world == 1) MoveUnlessSame(args.input, out.data());
  HostReduceBuffer work(ring.work_spec, out);
  const ChunkSource input = [&](const Range& piece) {
    return absl::StatusOr<absl::string_view>(
        args.input.substr(piece.offset, piece.size));
  };
  for (int s = 0; s + 1 < ring.world; ++s) {
    absl::Status status = Exchange(
        *args.transport, ring.next, s == 0 ? input : SourceOf(work),
        block(Mod(ring.rank - s - 1, ring.world)), ring.prev,
        block(Mod(ring.rank - s - 2, ring.world)), ring.chunk,
        [&](const Range& piece, const std::string& data) {
          return work.CombineWith(
              piece, args.input.substr(piece.offset, piece.size), data);
        });
    if (!status.ok()) return status;
  }
  absl::Status status = Finalize(args.spec, work, block(ring.rank), ring.world);
  if (status.ok()) status = AllGatherRing(ring, work, block);
  return status;
}

// Whether the reduction works in a wider type than the spec's (WorkSpec).
bool Widens(const Ring& ring) {
  return ring.work_spec.dtype != ring.args.spec.dtype;
}

// Runs `body` on args.work, or on a host copy of the input in the work
// type when there is none (kept in `host`).
template <typename Body>
absl::Status WithWorkBuffer(const Ring& ring, std::string& host, Body body) {
  const AlgorithmArgs& args = ring.args;
  if (args.work != nullptr) return body(*args.work);
  absl::Status converted =
      ConvertBytes(args.spec.dtype, ring.work_spec.dtype, args.input, &host);
  if (!converted.ok()) return converted;
  HostReduceBuffer buffer(ring.work_spec, &host);
  return body(buffer);
}

// Sets *out to `work_bytes` (elements of the work type) in the spec's type.
absl::Status Narrow(const Ring& ring, absl::string_view work_bytes,
                    std::string* out) {
  return ConvertBytes(ring.work_spec.dtype, ring.args.spec.dtype, work_bytes,
                      out);
}

// Writes `work_bytes` (elements of the work type, read after the input
// was) in the spec's type as the output: into the caller's place where it
// can (HostOutput), else into args.output.
absl::Status NarrowIntoOutput(const Ring& ring, absl::string_view work_bytes) {
  const DType from = ring.work_spec.dtype;
  const DType to = ring.args.spec.dtype;
  const uint64_t count = work_bytes.size() / DTypeSize(from);
  const absl::Span<char> out = HostOutput(ring.args, count * DTypeSize(to),
                                          from == to ? 1 : DTypeSize(to));
  if (from == to) {
    MoveUnlessSame(work_bytes, out.data());
    return absl::OkStatus();
  }
  return cpu_reduce::Convert(from, to, out.data(), work_bytes.data(), count);
}

absl::Status AllReduce(const Ring& ring) {
  const CollectiveSpec& spec = ring.args.spec;
  auto block = [&](int i) {
    return SplitRange(spec.count, ring.element, ring.world, i);
  };
  if (!Widens(ring) && ring.args.work == nullptr) {
    return HostAllReduce(ring, block);
  }
  if (!Widens(ring)) {
    // The device's work buffer holds the input.
    ReduceBuffer& work = *ring.args.work;
    absl::Status status = ReduceScatterRing(ring, work, block);
    if (status.ok()) {
      status = Finalize(spec, work, block(ring.rank), ring.world);
    }
    if (status.ok()) status = AllGatherRing(ring, work, block);
    return status;
  }
  // Partials travel in the work type; each rank rounds the block it reduced
  // to the spec's type once and the rounded blocks are gathered.
  Ring result_ring = ring;
  result_ring.element = DTypeSize(spec.dtype);
  result_ring.chunk =
      ElementChunkBytes(ring.args.chunk_bytes, result_ring.element);
  auto result_block = [&](int i) {
    return SplitRange(spec.count, result_ring.element, ring.world, i);
  };
  // The input is read only to widen it, before the output is written.
  const absl::Span<char> out =
      HostOutput(ring.args, spec.count * result_ring.element, /*alignment=*/1);
  Scratch wide;
  return WithWorkBuffer(ring, wide.bytes(), [&](ReduceBuffer& work) {
    absl::Status status = ReduceScatterRing(ring, work, block);
    if (status.ok()) {
      status = Finalize(spec, work, block(ring.rank), ring.world);
    }
    if (!status.ok()) return status;
    absl::StatusOr<absl::string_view> own = work.Read(block(ring.rank));
    if (!own.ok()) return own.status();
    std::string rounded;
    status = Narrow(ring, *own, &rounded);
    if (!status.ok()) return status;
    if (!rounded.empty()) {
      std::memcpy(out.data() + result_block(ring.rank).offset, rounded.data(),
                  rounded.size());
    }
    HostReduceBuffer result(spec, out);
    return AllGatherRing(result_ring, result, result_block);
  });
}

absl::Status ReduceScatter(const Ring& ring) {
  const CollectiveSpec& spec = ring.args.spec;
  const uint64_t block_bytes = spec.count * ring.element;
  auto block = [&](int i) { return Range{i * block_bytes, block_bytes}; };
  Scratch host;
  return WithWorkBuffer(ring, host.bytes(), [&](ReduceBuffer& work) {
    absl::Status status = ReduceScatterRing(ring, work, block);
    if (status.ok()) {
      status = Finalize(spec, work, block(ring.rank), ring.world);
    }
    if (!status.ok()) return status;
    absl::StatusOr<absl::string_view> own = work.Read(block(ring.rank));
    if (!own.ok()) return own.status();
    return NarrowIntoOutput(ring, *own);
  });
}

absl::Status AllGather(const Ring& ring) {
  const uint64_t block_bytes = ring.args.spec.count * ring.element;
  // The input is read only here: it may lie anywhere in the output.
  const absl::Span<char> out =
      HostOutput(ring.args, block_bytes * ring.world, /*alignment=*/1);
  MoveUnlessSame(ring.args.input.substr(0, block_bytes),
                 out.data() + ring.rank * block_bytes);
  auto block = [&](int i) { return Range{i * block_bytes, block_bytes}; };
  HostReduceBuffer buffer(ring.args.spec, out);
  return AllGatherRing(ring, buffer, block);
}

absl::Status Broadcast(const Ring& ring) {
  const int root = ring.args.spec.root;
  const uint64_t bytes = ring.args.spec.count * ring.element;
  const absl::Span<char> out = HostOutput(ring.args, bytes, /*alignment=*/1);
  const int position = Mod(ring.rank - root, ring.world);
  if (position == 0) {
    MoveUnlessSame(ring.args.input.substr(0, bytes), out.data());
  }
  // A chain root -> root+1 -> ... : receive a chunk, pass it on.
  const Range all{0, bytes};
  const int from = position == 0 ? -1 : ring.prev;
  const int to = position == ring.world - 1 ? -1 : ring.next;
  ResultHash* hash = ring.args.hash;
  bool corrupted = false;
  std::string copy;
  for (uint64_t c = 0; c < ChunkCount(bytes, ring.chunk); ++c) {
    const Range piece = ChunkOf(all, ring.chunk, c);
    if (from >= 0) {
      absl::StatusOr<std::string> data = ring.args.transport->Recv(from);
      if (!data.ok()) return data.status();
      if (data->size() != piece.size) {
        return absl::InternalError("broadcast chunk of the wrong size");
      }
      const absl::string_view kept =
          to < 0 ? TakeResultPiece(ring.args, corrupted, *data, copy)
                 : absl::string_view(*data);
      std::memcpy(out.data() + piece.offset, kept.data(), piece.size);
      ring.args.transport->Recycle(*std::move(data));
    }
    if (hash != nullptr) {
      hash->Add(piece.offset,
                absl::string_view(out.data() + piece.offset, piece.size));
    }
    if (to >= 0) {
      absl::Status sent = ring.args.transport->Send(
          to, absl::string_view(out.data() + piece.offset, piece.size));
      if (!sent.ok()) return sent;
    }
  }
  return absl::OkStatus();
}

// Gathers block i of every rank's `buffer` (rank i's own block) at the root.
template <typename BlockFn>
absl::Status GatherBlocks(const Ring& ring, ReduceBuffer& buffer,
                          absl::Span<char> out, BlockFn block) {
  const int root = ring.args.spec.root;
  if (ring.rank != root) {
    return Exchange(*ring.args.transport, root, SourceOf(buffer),
                    block(ring.rank), -1, Range{}, ring.chunk, nullptr);
  }
  const Range own = block(root);
  absl::StatusOr<absl::string_view> own_bytes = buffer.Read(own);
  if (!own_bytes.ok()) return own_bytes.status();
  std::memcpy(out.data() + own.offset, own_bytes->data(), own.size);
  for (int peer = 0; peer < ring.world; ++peer) {
    if (peer == root) continue;
    absl::Status status = Exchange(
        *ring.args.transport, -1, nullptr, Range{}, peer, block(peer),
        ring.chunk, [&](const Range& piece, const std::string& data) {
          std::memcpy(out.data() + piece.offset, data.data(), piece.size);
          return absl::OkStatus();
        });
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::Status Reduce(const Ring& ring) {
  const CollectiveSpec& spec = ring.args.spec;
  auto block = [&](int i) {
    return SplitRange(spec.count, ring.element, ring.world, i);
  };
  Scratch host;
  std::string gathered;
  absl::Status status =
      WithWorkBuffer(ring, host.bytes(), [&](ReduceBuffer& work) {
        absl::Status status = ReduceScatterRing(ring, work, block);
        if (status.ok()) {
          status = Finalize(spec, work, block(ring.rank), ring.world);
        }
        if (ring.rank == spec.root) gathered.assign(work.size(), '\0');
        if (status.ok()) {
          status = GatherBlocks(ring, work, absl::MakeSpan(gathered), block);
        }
        return status;
      });
  ring.args.output->clear();
  if (status.ok() && ring.rank == spec.root) {
    status = NarrowIntoOutput(ring, gathered);
  }
  return status;
}

absl::Status Gather(const Ring& ring) {
  const uint64_t block_bytes = ring.args.spec.count * ring.element;
  // Place this rank's input as block `rank` of a world-sized buffer so the
  // gather reads it at the offset the root writes it to.
  std::string staged(block_bytes * ring.world, '\0');
  std::memcpy(staged.data() + ring.rank * block_bytes, ring.args.input.data(),
              block_bytes);
  // The input was copied: the root's output may be any memory.
  absl::Span<char> out;
  if (ring.rank == ring.args.spec.root) {
    out = HostOutput(ring.args, block_bytes * ring.world, /*alignment=*/1);
  } else {
    ring.args.output->clear();
  }
  auto block = [&](int i) { return Range{i * block_bytes, block_bytes}; };
  HostReduceBuffer buffer(ring.args.spec, &staged);
  return GatherBlocks(ring, buffer, out, block);
}

absl::Status Scatter(const Ring& ring) {
  const int root = ring.args.spec.root;
  const uint64_t block_bytes = ring.args.spec.count * ring.element;
  std::string& out = *ring.args.output;
  if (ring.rank != root) {
    out.assign(block_bytes, '\0');
    return Exchange(
        *ring.args.transport, -1, nullptr, Range{}, root, Range{0, block_bytes},
        ring.chunk, [&](const Range& piece, const std::string& data) {
          std::memcpy(out.data() + piece.offset, data.data(), piece.size);
          return absl::OkStatus();
        });
  }
  const char* input = ring.args.input.data();
  out.assign(input + root * block_bytes, block_bytes);
  for (int peer = 0; peer < ring.world; ++peer) {
    if (peer == root) continue;
    absl::Status status = Exchange(*ring.args.transport, peer, input,
                                   Range{peer * block_bytes, block_bytes}, -1,
                                   Range{}, ring.chunk, nullptr);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::Status AllToAll(const Ring& ring) {
  const uint64_t block_bytes = ring.args.spec.count * ring.element;
  std::string& out = *ring.args.output;
  out.assign(block_bytes * ring.world, '\0');
  const char* input = ring.args.input.data();
  std::memcpy(out.data() + ring.rank * block_bytes,
              input + ring.rank * block_bytes, block_bytes);
  // Step k: send my block for rank+k, receive rank-k's block for me.
  for (int k = 1; k < ring.world; ++k) {
    const int to = Mod(ring.rank + k, ring.world);
    const int from = Mod(ring.rank - k, ring.world);
    absl::Status status = Exchange(
        *ring.args.transport, to, input, Range{to * block_bytes, block_bytes},
        from, Range{from * block_bytes, block_bytes}, ring.chunk,
        [&](const Range& piece, const std::string& data) {
          std::memcpy(out.data() + piece.offset, data.data(), piece.size);
          return absl::OkStatus();
        });
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunRing(const AlgorithmArgs& args) {
  const Ring ring = MakeRing(args);
  switch (args.spec.kind) {
    case CollectiveKind::kAllReduce:
      return AllReduce(ring);
    case CollectiveKind::kReduceScatter:
      return ReduceScatter(ring);
    case CollectiveKind::kAllGather:
      return AllGather(ring);
    case CollectiveKind::kBroadcast:
      return Broadcast(ring);
    case CollectiveKind::kReduce:
      return Reduce(ring);
    case CollectiveKind::kGather:
      return Gather(ring);
    case CollectiveKind::kScatter:
      return Scatter(ring);
    case CollectiveKind::kAllToAll:
      return AllToAll(ring);
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "no ring schedule for ", CollectiveKindName(args.spec.kind)));
  }
}

}  // namespace chorus
