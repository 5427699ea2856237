#include "server/coordinator/planner.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace chorus {

namespace {

// The bytes one rank moves in one step of `algorithm`.
uint64_t StepBytes(const CollectiveSpec& spec, int world_size,
                   Algorithm algorithm) {
  const uint64_t block = spec.count * DTypeSize(spec.dtype);
  if (algorithm == Algorithm::kRecursiveDoubling) return block;
  switch (spec.kind) {
    case CollectiveKind::kAllReduce:
    case CollectiveKind::kReduce:
      return block / std::max(world_size, 1);
    default:
      return block;
  }
}

// At least four chunks per step where that keeps chunks at or above the
// minimum; never above the maximum.
uint64_t ChunkBytes(uint64_t step_bytes, const PlannerOptions& options) {
  const uint64_t quarter = step_bytes / 4;
  return std::min(options.chunk_bytes,
                  std::max(options.min_chunk_bytes, quarter));
}

}  // namespace

uint64_t InlineMaxBytes(CollectiveKind kind, int world_size, bool same_host,
                        const PlannerOptions& options) {
  if (kind == CollectiveKind::kAllReduce && same_host && options.same_host &&
      world_size > 1) {
    return std::min(options.inline_max_bytes,
                    options.same_host_inline_max_bytes);
  }
  return options.inline_max_bytes;
}

absl::StatusOr<Plan> ChoosePlan(const CollectiveSpec& spec, int world_size,
                                Algorithm forced, const PlannerOptions& options,
                                bool same_host, bool host_memory,
                                bool nccl_ranks, bool ranks_repeat) {
  absl::StatusOr<Plan> plan =
      ChooseAlgorithm(spec, world_size, forced, options, same_host, host_memory,
                      nccl_ranks, ranks_repeat);
  if (plan.ok() && plan->algorithm != Algorithm::kInline &&
      plan->algorithm != Algorithm::kNccl) {
    plan->chunk_bytes =
        ChunkBytes(StepBytes(spec, world_size, plan->algorithm), options);
  }
  return plan;
}

absl::Status CheckForcedPlan(const CollectiveSpec& spec, Algorithm forced,
                             bool same_host, bool nccl) {
  if (forced == Algorithm::kLeader) return CheckForcedAlgorithm(spec, forced);
  if (KindCarriesNoData(spec.kind)) return absl::OkStatus();
  absl::Status allowed = CheckForcedAlgorithm(spec, forced);
  if (!allowed.ok()) return allowed;
  if (forced == Algorithm::kSameHost && !same_host) {
    return absl::InvalidArgumentError(
        "same_host needs every rank's worker on one host; this group spans "
        "several");
  }
  if (forced == Algorithm::kNccl && !nccl) {
    return absl::InvalidArgumentError(
        "nccl needs every rank on a GPU (Cuda(n)) of a worker built with "
        "NCCL, and a coordinator running with --nccl_plan");
  }
  return absl::OkStatus();
}

absl::StatusOr<Plan> ChooseAlgorithm(const CollectiveSpec& spec, int world_size,
                                     Algorithm forced,
                                     const PlannerOptions& options,
                                     bool same_host, bool host_memory,
                                     bool nccl_ranks, bool ranks_repeat) {
  Plan plan;
  plan.chunk_bytes = options.chunk_bytes;
  const uint64_t bytes = PayloadBytes(spec, world_size);
  if (KindCarriesNoData(spec.kind)) {
    // The match itself is the barrier.
    plan.algorithm = Algorithm::kInline;
    return plan;
  }
  const bool nccl = options.nccl && nccl_ranks;
  if (absl::Status allowed = CheckForcedPlan(spec, forced, same_host, nccl);
      !allowed.ok()) {
    return allowed;
  }
  const bool shares_memory = spec.kind == CollectiveKind::kAllReduce &&
                             same_host && host_memory && options.same_host &&
                             world_size > 1;
  if (forced != Algorithm::kUnspecified) {
    plan.algorithm = forced;
  } else if (CarriesInlineData(
                 spec, world_size, forced,
                 InlineMaxBytes(spec.kind, world_size, same_host, options)) &&
             !(shares_memory && ranks_repeat)) {
    plan.algorithm = Algorithm::kInline;
  } else if (nccl && NcclRunsSpec(spec)) {
    plan.algorithm = Algorithm::kNccl;
  } else if (shares_memory) {
    plan.algorithm = Algorithm::kSameHost;
  } else if (spec.kind == CollectiveKind::kAllReduce &&
             bytes <= options.recursive_doubling_max_bytes &&
             world_size <= options.recursive_doubling_max_ranks) {
    plan.algorithm = Algorithm::kRecursiveDoubling;
  } else {
    plan.algorithm = Algorithm::kRing;
  }
  return plan;
}

}  // namespace chorus
