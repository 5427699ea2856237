#include <string>

#include "server/reduce/cpu/cpu_reduce.h"
#include "server/worker/algorithms/algorithm.h"
#include "server/worker/algorithms/chunked.h"

namespace chorus {
namespace {

// Combines `buffer` with `received` from `partner` as
// op(lower rank's data, higher rank's data), so both partners of an exchange
// compute bit-identical results even where op is not bit-commutative (e.g.
// -0/+0 under min).
absl::Status Combine(const AlgorithmArgs& args, std::string& buffer,
                     const std::string& received, int partner) {
  const bool partner_first = partner < args.link->rank();
  return cpu_reduce::Reduce(args.spec.op, args.spec.dtype, buffer.data(),
                            partner_first ? received.data() : buffer.data(),
                            partner_first ? buffer.data() : received.data(),
                            args.spec.count);
}

// Receives the whole buffer from `from` (sending ours to `to` unless it is
// -1) and combines the two.
absl::Status ExchangeAndCombine(const AlgorithmArgs& args, std::string& buffer,
                                int to, int from, uint64_t chunk) {
  const Range all{0, buffer.size()};
  // Received chunks are combined only after the whole buffer was sent, since
  // `buffer` is also the send source.
  std::string received(buffer.size(), '\0');
  absl::Status status =
      Exchange(*args.link, to, buffer.data(), all, from, all, chunk,
               [&](const Range& piece, const std::string& data) {
                 received.replace(piece.offset, piece.size, data);
                 return absl::OkStatus();
               });
  if (!status.ok()) return status;
  return Combine(args, buffer, received, from);
}

absl::Status SendAll(const AlgorithmArgs& args, const std::string& buffer,
                     int to, uint64_t chunk) {
  return Exchange(*args.link, to, buffer.data(), Range{0, buffer.size()}, -1,
                  Range{}, chunk, nullptr);
}

absl::Status ReceiveAll(const AlgorithmArgs& args, std::string& buffer,
                        int from, uint64_t chunk) {
  return Exchange(*args.link, -1, nullptr, Range{}, from,
                  Range{0, buffer.size()}, chunk,
                  [&](const Range& piece, const std::string& data) {
                    buffer.replace(piece.offset, piece.size, data);
                    return absl::OkStatus();
                  });
}

}  // namespace

absl::Status RunRecursiveDoubling(const AlgorithmArgs& args) {
  if (args.spec.kind != CollectiveKind::kAllReduce) {
    return absl::InvalidArgumentError(
        "recursive doubling runs all_reduce only");
  }
  const CollectiveSpec& spec = args.spec;
  const int rank = args.link->rank();
  const int world = args.link->world_size();
  const uint64_t chunk =
      ElementChunkBytes(args.chunk_bytes, DTypeSize(spec.dtype));
  std::string& buffer = *args.output;
  buffer.assign(args.input.data(), args.input.size());

  // Fold the ranks beyond the largest power of two: among the first
  // 2 * extra ranks, each even rank hands its data to the odd rank above it.
  int power = 1;
  while (power * 2 <= world) power *= 2;
  const int extra = world - power;
  int virtual_rank;
  if (rank < 2 * extra) {
    if (rank % 2 == 0) {
      absl::Status status = SendAll(args, buffer, rank + 1, chunk);
      if (!status.ok()) return status;
      virtual_rank = -1;
    } else {
      absl::Status status =
          ExchangeAndCombine(args, buffer, -1, rank - 1, chunk);
      if (!status.ok()) return status;
      virtual_rank = rank / 2;
    }
  } else {
    virtual_rank = rank - extra;
  }

  if (virtual_rank >= 0) {
    for (int mask = 1; mask < power; mask <<= 1) {
      const int partner_virtual = virtual_rank ^ mask;
      const int partner = partner_virtual < extra ? partner_virtual * 2 + 1
                                                  : partner_virtual + extra;
      absl::Status status =
          ExchangeAndCombine(args, buffer, partner, partner, chunk);
      if (!status.ok()) return status;
    }
  }

  // Hand the result back to the folded ranks.
  if (rank < 2 * extra) {
    absl::Status status = rank % 2 == 1
                              ? SendAll(args, buffer, rank - 1, chunk)
                              : ReceiveAll(args, buffer, rank + 1, chunk);
    if (!status.ok()) return status;
  }
  if (spec.op == ReduceOp::kAvg) {
    return cpu_reduce::FinalizeAvg(spec.dtype, buffer.data(), spec.count,
                                   world);
  }
  return absl::OkStatus();
}

}  // namespace chorus
