// What Chorus computes from a CollectiveSpec (chorus/types.h, where the
// buffer sizes of each kind are documented): names, validation, the buffer
// sizes each kind implies and the one-line description used in every
// mismatch message ("all_reduce f32[1024] sum").
//
// Plain values; pure functions; thread-safe.
#ifndef CHORUS_COMMON_COLLECTIVE_H_
#define CHORUS_COMMON_COLLECTIVE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "chorus/types.h"
#include "common/dtype.h"

namespace chorus {

// Returns "all_reduce", "reduce", ...; "unknown" for values outside the enum.
absl::string_view CollectiveKindName(CollectiveKind kind);
// Parses a name as CollectiveKindName writes it (also without underscores,
// e.g. "allreduce"). Returns INVALID_ARGUMENT otherwise.
absl::StatusOr<CollectiveKind> ParseCollectiveKind(absl::string_view name);

// Returns "inline", "recursive_doubling", "tree", "ring", "same_host"; "auto"
// for kUnspecified.
absl::string_view AlgorithmName(Algorithm algorithm);
// Parses an AlgorithmName ("auto" gives kUnspecified). INVALID_ARGUMENT
// otherwise.
absl::StatusOr<Algorithm> ParseAlgorithm(absl::string_view name);

bool KindReduces(CollectiveKind kind);
// Barrier and sync: kinds whose calls carry no data (count 0).
bool KindCarriesNoData(CollectiveKind kind);
bool KindHasRoot(CollectiveKind kind);

// The spec a data-plane reduction works in: `spec` with its dtype replaced
// by AccumulatorDType(dtype, op) for kinds that reduce (partials of f16/bf16
// travel as f32, those of an integer avg as 64-bit integers), `spec` itself
// for every other kind.
CollectiveSpec WorkSpec(const CollectiveSpec& spec);

// Largest element count a spec may carry; keeps every byte size below 2^62.
inline constexpr uint64_t kMaxCount = uint64_t{1} << 40;

// Checks a spec on its own for a group of `world_size` ranks: known kind,
// dtype and op (op only where the kind reduces), root in range, count not
// over kMaxCount (0 for barrier). Returns OK or INVALID_ARGUMENT.
absl::Status ValidateSpec(const CollectiveSpec& spec, int world_size);

// Describes the spec as mismatch messages print it, e.g.
// "all_reduce f32[1024] sum", "broadcast i32[7] root 1", "barrier".
std::string DescribeSpec(const CollectiveSpec& spec);

// True when two ranks' specs agree on every field the kind uses.
bool SpecsAgree(const CollectiveSpec& a, const CollectiveSpec& b);

// Bytes of rank `rank`'s input and output buffers (see the table above).
// ExpectedInputBytes is what the rank must supply; inputs that may be empty
// return true from InputMayBeEmpty.
uint64_t InputBytes(const CollectiveSpec& spec, int world_size, int rank);
uint64_t OutputBytes(const CollectiveSpec& spec, int world_size, int rank);
bool InputMayBeEmpty(const CollectiveSpec& spec, int rank);

// The size the planner decides by, the same on every rank of a matching
// call: the largest buffer any rank passes or receives.
uint64_t PayloadBytes(const CollectiveSpec& spec, int world_size);

// Whether a rank attaches its data to the call so the coordinator can run it
// inline: when the inline algorithm is forced, or with no algorithm forced
// and PayloadBytes() at most `inline_max_bytes`. Barrier never carries data.
bool CarriesInlineData(const CollectiveSpec& spec, int world_size,
                       Algorithm forced, uint64_t inline_max_bytes);

// Whether NCCL runs `spec` as Chorus defines it: all_reduce, broadcast,
// reduce, all_gather and reduce_scatter, in a type Chorus reduces in as it
// is (AccumulatorDType: not f16/bf16 under sum, prod or avg, nor integer
// avg, which Chorus computes wider).
bool NcclRunsSpec(const CollectiveSpec& spec);

// Checks that `forced` is an algorithm `spec`'s kind can run: auto, inline
// and ring for every kind, recursive doubling and same_host for all_reduce
// only, nccl where NcclRunsSpec. Returns OK or INVALID_ARGUMENT.
absl::Status CheckForcedAlgorithm(const CollectiveSpec& spec, Algorithm forced);

// Everything a rank can check about its own call before it takes a sequence
// number: ValidateSpec, CheckForcedAlgorithm and CheckInputSize. A call
// refused here never reaches the coordinator, so it leaves no gap in the
// rank's sequence. Returns OK or INVALID_ARGUMENT.
absl::Status ValidateCall(const CollectiveSpec& spec, int world_size, int rank,
                          uint64_t input_bytes, Algorithm forced);

// Checks `bytes` against InputBytes. Returns INVALID_ARGUMENT naming both.
absl::Status CheckInputSize(const CollectiveSpec& spec, int world_size,
                            int rank, uint64_t bytes);

}  // namespace chorus

#endif  // CHORUS_COMMON_COLLECTIVE_H_
