#include "server/coordinator/planner.h"

#include "absl/strings/str_cat.h"

namespace chorus {

absl::StatusOr<Plan> ChoosePlan(const CollectiveSpec& spec, int world_size,
                                Algorithm forced,
                                const PlannerOptions& options) {
  Plan plan;
  plan.chunk_bytes = options.chunk_bytes;
  const uint64_t bytes = PayloadBytes(spec, world_size);
  if (spec.kind == CollectiveKind::kBarrier) {
    // The match itself is the barrier.
    plan.algorithm = Algorithm::kInline;
    return plan;
  }
  switch (forced) {
    case Algorithm::kUnspecified:
      if (CarriesInlineData(spec, world_size, forced,
                            options.inline_max_bytes)) {
        plan.algorithm = Algorithm::kInline;
      } else if (spec.kind == CollectiveKind::kAllReduce &&
                 bytes <= options.recursive_doubling_max_bytes) {
        plan.algorithm = Algorithm::kRecursiveDoubling;
      } else {
        plan.algorithm = Algorithm::kRing;
      }
      return plan;
    case Algorithm::kInline:
    case Algorithm::kRing:
      plan.algorithm = forced;
      return plan;
    case Algorithm::kRecursiveDoubling:
      if (spec.kind != CollectiveKind::kAllReduce) {
        return absl::InvalidArgumentError(absl::StrCat(
            "recursive_doubling is available for all_reduce only, not ",
            CollectiveKindName(spec.kind)));
      }
      plan.algorithm = forced;
      return plan;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "algorithm ", AlgorithmName(forced), " is not available for ",
          CollectiveKindName(spec.kind)));
  }
}

}  // namespace chorus
