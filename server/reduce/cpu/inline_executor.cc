#include "server/reduce/cpu/inline_executor.h"

#include "absl/strings/str_cat.h"
#include "server/reduce/cpu/cpu_reduce.h"

namespace chorus {
namespace {

// Reduces every rank's `block_bytes` block at `offset` into one buffer.
absl::StatusOr<std::string> ReduceBlocks(
    const CollectiveSpec& spec, int world_size,
    const std::vector<const std::string*>& inputs, size_t offset,
    size_t block_bytes) {
  std::vector<const void*> sources(world_size);
  for (int rank = 0; rank < world_size; ++rank) {
    sources[rank] = inputs[rank]->data() + offset;
  }
  std::string out(block_bytes, '\0');
  std::string scratch;
  absl::Status status =
      cpu_reduce::ReduceSources(spec.op, spec.dtype, out.data(), sources.data(),
                                world_size, spec.count, &scratch);
  if (!status.ok()) return status;
  return out;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> RunInline(
    const CollectiveSpec& spec, int world_size,
    const std::vector<const std::string*>& inputs) {
  absl::Status valid = ValidateSpec(spec, world_size);
  if (!valid.ok()) return valid;
  if (static_cast<int>(inputs.size()) != world_size) {
    return absl::InvalidArgumentError("one input per rank is needed");
  }
  for (int rank = 0; rank < world_size; ++rank) {
    const uint64_t want = InputBytes(spec, world_size, rank);
    if (!InputMayBeEmpty(spec, rank) && inputs[rank]->size() != want) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, " input has ", inputs[rank]->size(),
                       " bytes; expected ", want));
    }
  }
  const size_t block = spec.count * DTypeSize(spec.dtype);
  const int root = spec.root;
  std::vector<std::string> out(world_size);
  switch (spec.kind) {
    case CollectiveKind::kAllReduce:
    case CollectiveKind::kReduce: {
      absl::StatusOr<std::string> sum =
          ReduceBlocks(spec, world_size, inputs, 0, block);
      if (!sum.ok()) return sum.status();
      if (spec.kind == CollectiveKind::kReduce) {
        out[root] = *std::move(sum);
      } else {
        for (std::string& o : out) o = *sum;
      }
      break;
    }
    case CollectiveKind::kReduceScatter:
      for (int rank = 0; rank < world_size; ++rank) {
        absl::StatusOr<std::string> part =
            ReduceBlocks(spec, world_size, inputs, rank * block, block);
        if (!part.ok()) return part.status();
        out[rank] = *std::move(part);
      }
      break;
    case CollectiveKind::kBroadcast:
      for (std::string& o : out) o = inputs[root]->substr(0, block);
      break;
    case CollectiveKind::kAllGather:
    case CollectiveKind::kGather: {
      std::string all;
      all.reserve(block * world_size);
      for (const std::string* input : inputs) all.append(*input);
      if (spec.kind == CollectiveKind::kGather) {
        out[root] = std::move(all);
      } else {
        for (std::string& o : out) o = all;
      }
      break;
    }
    case CollectiveKind::kScatter:
      for (int rank = 0; rank < world_size; ++rank) {
        out[rank] = inputs[root]->substr(rank * block, block);
      }
      break;
    case CollectiveKind::kAllToAll:
      for (int rank = 0; rank < world_size; ++rank) {
        out[rank].reserve(block * world_size);
        for (int peer = 0; peer < world_size; ++peer) {
          out[rank].append(*inputs[peer], rank * block, block);
        }
      }
      break;
    case CollectiveKind::kBarrier:
    case CollectiveKind::kSync:
    case CollectiveKind::kUnspecified:
      break;
  }
  return out;
}

}  // namespace chorus
