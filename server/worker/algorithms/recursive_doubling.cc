#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/worker/algorithms/algorithm.h"
#include "server/worker/algorithms/chunked.h"
#include "server/worker/algorithms/output_place.h"
#include "server/worker/algorithms/scratch.h"

namespace chorus {
namespace {

// Receives the whole buffer from `from` (sending ours to `to` unless it is
// -1) and combines each chunk into ours as it arrives, as
// op(lower rank's data, higher rank's data), so both partners of an exchange
// compute bit-identical results even where op is not bit-commutative (e.g.
// -0/+0 under min). Chunk c is sent before chunk c arrives, so combining in
// place never changes what is still to be sent.
absl::Status ExchangeAndCombine(const AlgorithmArgs& args, ReduceBuffer& buffer,
                                int to, int from, uint64_t chunk) {
  const Range all{0, buffer.size()};
  const bool data_first = from < args.transport->rank();
  return Exchange(*args.transport, to, SourceOf(buffer), all, from, all, chunk,
                  [&](const Range& piece, const std::string& data) {
                    return buffer.Combine(piece, data, data_first);
                  });
}

absl::Status SendAll(const AlgorithmArgs& args, ReduceBuffer& buffer, int to,
                     uint64_t chunk) {
  return Exchange(*args.transport, to, SourceOf(buffer),
                  Range{0, buffer.size()}, -1, Range{}, chunk, nullptr);
}

absl::Status ReceiveAll(const AlgorithmArgs& args, ReduceBuffer& buffer,
                        int from, uint64_t chunk) {
  return Exchange(*args.transport, -1, nullptr, Range{}, from,
                  Range{0, buffer.size()}, chunk,
                  [&](const Range& piece, const std::string& data) {
                    return buffer.Store(piece, data);
                  });
}

absl::Status RunOn(const AlgorithmArgs& args, ReduceBuffer& buffer);

}  // namespace

absl::Status RunRecursiveDoubling(const AlgorithmArgs& args) {
  if (args.spec.kind != CollectiveKind::kAllReduce) {
    return absl::InvalidArgumentError(
        "recursive doubling runs all_reduce only");
  }
  // Partials travel in the work type (WorkSpec); without widening the host
  // work buffer is the output itself.
  const CollectiveSpec work_spec = WorkSpec(args.spec);
  const bool widens = work_spec.dtype != args.spec.dtype;
  if (args.work != nullptr) {
    absl::Status status = RunOn(args, *args.work);
    if (!status.ok() || !widens) return status;
    // A wider result is rounded into the output (see AlgorithmArgs::work).
    absl::StatusOr<absl::string_view> all =
        args.work->Read(Range{0, args.work->size()});
    if (!all.ok()) return all.status();
    status = ConvertBytes(work_spec.dtype, args.spec.dtype, *all, args.output);
    if (status.ok() && args.hash != nullptr) args.hash->Add(0, *args.output);
    return status;
  }
  Scratch wide;
  absl::Status status;
  absl::Span<char> result;
  if (widens) {
    status = ConvertBytes(args.spec.dtype, work_spec.dtype, args.input,
                          &wide.bytes());
    HostReduceBuffer buffer(work_spec, &wide.bytes());
    if (status.ok()) status = RunOn(args, buffer);
    if (status.ok()) {
      status = ConvertBytes(work_spec.dtype, args.spec.dtype, wide.bytes(),
                            args.output);
    }
    result = absl::MakeSpan(*args.output);
  } else {
    // The input is copied into the output first and not read again: the
    // output may be any memory, the input's included.
    result = HostOutput(args, args.input.size(), DTypeSize(args.spec.dtype));
    MoveUnlessSame(args.input, result.data());
    HostReduceBuffer buffer(work_spec, result);
    status = RunOn(args, buffer);
  }
  // Every element was combined up to the last step: the result is hashed
  // once it is whole.
  if (status.ok() && args.corrupt_for_testing && !result.empty()) {
    result[0] ^= 1;
  }
  if (status.ok() && args.hash != nullptr) {
    args.hash->Add(0, absl::string_view(result.data(), result.size()));
  }
  return status;
}

namespace {

absl::Status RunOn(const AlgorithmArgs& args, ReduceBuffer& buffer) {
  const CollectiveSpec& spec = args.spec;
  const int rank = args.transport->rank();
  const int world = args.transport->world_size();
  const uint64_t chunk =
      ElementChunkBytes(args.chunk_bytes, DTypeSize(WorkSpec(spec).dtype));

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
    return buffer.FinalizeAvg(Range{0, buffer.size()}, world);
  }
  return absl::OkStatus();
}

}  // namespace

}  // namespace chorus
