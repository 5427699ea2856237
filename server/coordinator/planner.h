// Planner: chooses how a matched collective runs — inline through the
// coordinator for small payloads, recursive doubling for medium all-reduces,
// a chunked ring for large ones — so every rank follows the same plan.
//
// Pure functions; thread-safe.
#ifndef CHORUS_SERVER_COORDINATOR_PLANNER_H_
#define CHORUS_SERVER_COORDINATOR_PLANNER_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/collective.h"

namespace chorus {

// The defaults are the crossovers measured with chorus-bench (all_reduce
// f32, 2-4 ranks on one 2-core host, see bench/README.md): inline wins up to
// 128 KiB; recursive doubling beats the ring from there to 512 KiB-1 MiB
// with 2 or 3 ranks, and never with 4.
struct PlannerOptions {
  // Payloads up to this size ride with the call (one round trip).
  uint64_t inline_max_bytes = 128 << 10;
  // All-reduces up to this size, in groups of at most
  // recursive_doubling_max_ranks, use recursive doubling; others a ring.
  uint64_t recursive_doubling_max_bytes = 512 << 10;
  int recursive_doubling_max_ranks = 3;
  // Largest data-plane chunk. Plans use smaller chunks when a step would
  // otherwise move fewer than four of them, so sending overlaps receiving.
  // 512 KiB: a 64 MiB ring over TCP took 0.64-0.74 (4 ranks) and 0.65-0.69
  // (2 ranks) of its time with 4 MiB chunks (bench/README.md, "Chunks of up
  // to 512 KiB").
  uint64_t chunk_bytes = 512 << 10;
  // Smallest chunk a plan picks on its own.
  uint64_t min_chunk_bytes = 64 << 10;
  // All-reduces too large for inline, in groups whose workers all run on
  // one host, exchange data through shared memory (same_host) instead of
  // going through the data plane's sockets.
  bool same_host = true;
  // In such groups, all-reduces ride with the call only up to this size
  // (and inline_max_bytes); larger ones use same_host: at 64 KiB same_host
  // took 0.4-0.6x (2 ranks) and 0.7x (4 ranks) of inline's time, at 32 KiB
  // 0.9-1.0x and 2.2x (bench/README.md, "Same host: stages in shared
  // memory"). Smaller all-reduces are planned same_host only when every
  // rank asks to repeat them (ChoosePlan's ranks_repeat), so that their
  // repetitions run without the coordinator (same_host_binding.h); 0 plans
  // every all-reduce with data same_host.
  uint64_t same_host_inline_max_bytes = 32 << 10;
  // Calls too large for inline, in groups whose ranks are all on GPUs of
  // workers built with NCCL, run on NCCL where it runs them as Chorus
  // defines them (NcclRunsSpec). Off by default: NCCL's own connections
  // are neither authenticated nor encrypted, whatever Chorus's TLS.
  bool nccl = false;
  // Groups that are not elastic, and whose members the join lists, run
  // calls that would be inline at the worker of their rank 0 (the leader
  // plan, JoinGroupResponse.leader_calls): the coordinator is not asked.
  bool leader_calls = false;
  // How long the ranks of a leader call wait for each other at rank 0's
  // worker before they take the call to the coordinator: calls of a
  // training step come within microseconds of each other.
  absl::Duration leader_patience = absl::Milliseconds(100);
};

struct Plan {
  Algorithm algorithm = Algorithm::kUnspecified;
  uint64_t chunk_bytes = 0;
};

// The largest payload of a collective of `kind` that rides with the call
// in a group of `world_size` ranks whose workers all run on one host when
// `same_host` (what ranks are told at join, and what ChoosePlan plans
// inline).
uint64_t InlineMaxBytes(CollectiveKind kind, int world_size, bool same_host,
                        const PlannerOptions& options);

// Returns the plan for `spec` in a group of `world_size` ranks, whose
// workers all run on one host when `same_host`, and whose ranks all hold
// this call's buffers in host memory when `host_memory` (same_host needs
// both), and whose ranks are all on GPUs of workers built with NCCL when
// `nccl_ranks` (nccl needs it and options.nccl). An all-reduce that would
// be inline is planned same_host instead where same_host applies and
// `ranks_repeat` (every rank would repeat it on the plan's segments,
// CollectiveRequest.repeats_same_host). `forced` (kUnspecified to
// let the planner choose) wins where it applies: inline and ring for every
// kind, recursive doubling for all-reduce, same_host for all-reduce in a
// same-host group, nccl where NcclRunsSpec in such a group. Returns
// INVALID_ARGUMENT for a forced algorithm the kind or group cannot use.
absl::StatusOr<Plan> ChoosePlan(const CollectiveSpec& spec, int world_size,
                                Algorithm forced, const PlannerOptions& options,
                                bool same_host = false, bool host_memory = true,
                                bool nccl_ranks = false,
                                bool ranks_repeat = false);

// Checks that a call may force `forced`: what ChoosePlan refuses, without
// planning (every rank's call is checked on arrival; the plan is chosen
// once, when all arrived). A barrier accepts any algorithm (the match
// itself is the barrier). Returns OK or INVALID_ARGUMENT.
// `nccl` says whether the group may run nccl (options.nccl, and its ranks
// joined on GPUs of workers built with NCCL).
absl::Status CheckForcedPlan(const CollectiveSpec& spec, Algorithm forced,
                             bool same_host, bool nccl = false);

// ChoosePlan's first half: the algorithm, with chunk_bytes at the maximum.
absl::StatusOr<Plan> ChooseAlgorithm(const CollectiveSpec& spec, int world_size,
                                     Algorithm forced,
                                     const PlannerOptions& options,
                                     bool same_host = false,
                                     bool host_memory = true,
                                     bool nccl_ranks = false,
                                     bool ranks_repeat = false);

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_PLANNER_H_
