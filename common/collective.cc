#include "common/collective.h"

#include <algorithm>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace chorus {
namespace {

constexpr absl::string_view kKindNames[] = {
    "unspecified", "all_reduce",     "reduce", "broadcast",
    "all_gather",  "reduce_scatter", "gather", "scatter",
    "all_to_all",  "barrier",        "sync"};
constexpr int kLastKind = static_cast<int>(CollectiveKind::kSync);

constexpr absl::string_view kAlgorithmNames[] = {
    "auto", "inline", "recursive_doubling", "tree", "ring", "same_host",
    "nccl", "leader"};
constexpr int kLastAlgorithm = static_cast<int>(Algorithm::kLeader);

bool KnownKind(CollectiveKind kind) {
  const int v = static_cast<int>(kind);
  return v >= 1 && v <= kLastKind;
}

}  // namespace

absl::string_view CollectiveKindName(CollectiveKind kind) {
  const int v = static_cast<int>(kind);
  if (v < 0 || v > kLastKind) return "unknown";
  return kKindNames[v];
}

absl::StatusOr<CollectiveKind> ParseCollectiveKind(absl::string_view name) {
  const std::string want =
      absl::StrReplaceAll(absl::AsciiStrToLower(name), {{"_", ""}, {"-", ""}});
  for (int v = 1; v <= kLastKind; ++v) {
    if (absl::StrReplaceAll(kKindNames[v], {{"_", ""}}) == want) {
      return static_cast<CollectiveKind>(v);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown collective \"", name, "\""));
}

absl::string_view AlgorithmName(Algorithm algorithm) {
  const int v = static_cast<int>(algorithm);
  if (v < 0 || v > kLastAlgorithm) return "unknown";
  return kAlgorithmNames[v];
}

absl::StatusOr<Algorithm> ParseAlgorithm(absl::string_view name) {
  const std::string want = absl::AsciiStrToLower(name);
  for (int v = 0; v <= kLastAlgorithm; ++v) {
    if (kAlgorithmNames[v] == want) return static_cast<Algorithm>(v);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown algorithm \"", name,
                   "\" (auto, inline, recursive_doubling, tree, ring, "
                   "same_host)"));
}

bool KindReduces(CollectiveKind kind) {
  return kind == CollectiveKind::kAllReduce ||
         kind == CollectiveKind::kReduce ||
         kind == CollectiveKind::kReduceScatter;
}

CollectiveSpec WorkSpec(const CollectiveSpec& spec) {
  CollectiveSpec work = spec;
  if (KindReduces(spec.kind))
    work.dtype = AccumulatorDType(spec.dtype, spec.op);
  return work;
}

bool KindCarriesNoData(CollectiveKind kind) {
  return kind == CollectiveKind::kBarrier || kind == CollectiveKind::kSync;
}

bool KindHasRoot(CollectiveKind kind) {
  return kind == CollectiveKind::kReduce ||
         kind == CollectiveKind::kBroadcast ||
         kind == CollectiveKind::kGather || kind == CollectiveKind::kScatter;
}

absl::Status ValidateSpec(const CollectiveSpec& spec, int world_size) {
  if (!KnownKind(spec.kind)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown collective kind ", static_cast<int>(spec.kind)));
  }
  if (KindCarriesNoData(spec.kind)) {
    if (spec.count != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(CollectiveKindName(spec.kind),
                       " carries no data, got count ", spec.count));
    }
    return absl::OkStatus();
  }
  absl::Status dtype = ValidateDType(spec.dtype);
  if (!dtype.ok()) return dtype;
  if (KindReduces(spec.kind)) {
    absl::Status op = ValidateReduceOp(spec.op);
    if (!op.ok()) return op;
  }
  if (spec.count > kMaxCount) {
    return absl::InvalidArgumentError(absl::StrCat(
        "count ", spec.count, " is over the maximum of ", kMaxCount));
  }
  if (KindHasRoot(spec.kind) && (spec.root < 0 || spec.root >= world_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "root ", spec.root, " is out of range for world size ", world_size));
  }
  return absl::OkStatus();
}

std::string DescribeSpec(const CollectiveSpec& spec) {
  std::string out(CollectiveKindName(spec.kind));
  if (KindCarriesNoData(spec.kind)) return out;
  absl::StrAppend(&out, " ", DTypeName(spec.dtype), "[", spec.count, "]");
  if (KindReduces(spec.kind)) absl::StrAppend(&out, " ", ReduceOpName(spec.op));
  if (KindHasRoot(spec.kind)) absl::StrAppend(&out, " root ", spec.root);
  return out;
}

bool SpecsAgree(const CollectiveSpec& a, const CollectiveSpec& b) {
  if (a.kind != b.kind) return false;
  if (KindCarriesNoData(a.kind)) return true;
  if (a.dtype != b.dtype || a.count != b.count) return false;
  if (KindReduces(a.kind) && a.op != b.op) return false;
  if (KindHasRoot(a.kind) && a.root != b.root) return false;
  return true;
}

uint64_t InputBytes(const CollectiveSpec& spec, int world_size, int rank) {
  const uint64_t block = spec.count * DTypeSize(spec.dtype);
  const uint64_t world = static_cast<uint64_t>(world_size);
  switch (spec.kind) {
    case CollectiveKind::kAllReduce:
    case CollectiveKind::kReduce:
    case CollectiveKind::kAllGather:
    case CollectiveKind::kGather:
      return block;
    case CollectiveKind::kBroadcast:
      return rank == spec.root ? block : 0;
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllToAll:
      return block * world;
    case CollectiveKind::kScatter:
      return rank == spec.root ? block * world : 0;
    default:
      return 0;
  }
}

uint64_t OutputBytes(const CollectiveSpec& spec, int world_size, int rank) {
  const uint64_t block = spec.count * DTypeSize(spec.dtype);
  const uint64_t world = static_cast<uint64_t>(world_size);
  switch (spec.kind) {
    case CollectiveKind::kAllReduce:
    case CollectiveKind::kBroadcast:
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kScatter:
      return block;
    case CollectiveKind::kReduce:
      return rank == spec.root ? block : 0;
    case CollectiveKind::kAllGather:
    case CollectiveKind::kAllToAll:
      return block * world;
    case CollectiveKind::kGather:
      return rank == spec.root ? block * world : 0;
    default:
      return 0;
  }
}

uint64_t PayloadBytes(const CollectiveSpec& spec, int world_size) {
  uint64_t most = 0;
  for (int rank : {spec.root, spec.root == 0 ? 1 : 0}) {
    if (rank >= world_size) continue;
    most = std::max({most, InputBytes(spec, world_size, rank),
                     OutputBytes(spec, world_size, rank)});
  }
  return most;
}

bool CarriesInlineData(const CollectiveSpec& spec, int world_size,
                       Algorithm forced, uint64_t inline_max_bytes) {
  if (KindCarriesNoData(spec.kind)) return false;
  if (forced == Algorithm::kInline) return true;
  return forced == Algorithm::kUnspecified &&
         PayloadBytes(spec, world_size) <= inline_max_bytes;
}

bool InputMayBeEmpty(const CollectiveSpec& spec, int rank) {
  return (spec.kind == CollectiveKind::kBroadcast ||
          spec.kind == CollectiveKind::kScatter) &&
         rank != spec.root;
}

bool NcclRunsSpec(const CollectiveSpec& spec) {
  switch (spec.kind) {
    case CollectiveKind::kBroadcast:
    case CollectiveKind::kAllGather:
      return true;
    case CollectiveKind::kAllReduce:
    case CollectiveKind::kReduce:
    case CollectiveKind::kReduceScatter:
      return AccumulatorDType(spec.dtype, spec.op) == spec.dtype;
    default:
      return false;
  }
}

absl::Status CheckForcedAlgorithm(const CollectiveSpec& spec,
                                  Algorithm forced) {
  switch (forced) {
    case Algorithm::kUnspecified:
    case Algorithm::kInline:
    case Algorithm::kRing:
      return absl::OkStatus();
    case Algorithm::kRecursiveDoubling:
    case Algorithm::kSameHost:
      if (spec.kind == CollectiveKind::kAllReduce ||
          KindCarriesNoData(spec.kind)) {
        return absl::OkStatus();
      }
      return absl::InvalidArgumentError(absl::StrCat(
          AlgorithmName(forced), " is available for all_reduce only, not ",
          CollectiveKindName(spec.kind)));
    case Algorithm::kNccl:
      if (NcclRunsSpec(spec) || KindCarriesNoData(spec.kind)) {
        return absl::OkStatus();
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "nccl runs all_reduce, broadcast, reduce, all_gather and "
          "reduce_scatter in a type Chorus reduces in as it is (not "
          "f16/bf16 under sum, prod or avg, nor integer avg), not ",
          CollectiveKindName(spec.kind), " of ", DTypeName(spec.dtype),
          spec.op == ReduceOp::kUnspecified
              ? ""
              : absl::StrCat(" under ", ReduceOpName(spec.op))));
    case Algorithm::kLeader:
      return absl::InvalidArgumentError(
          "leader is the plan of small calls in groups the coordinator forms "
          "with leader calls (--leader_calls); it cannot be forced");
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "algorithm ", AlgorithmName(forced), " is not available for ",
          CollectiveKindName(spec.kind)));
  }
}

absl::Status ValidateCall(const CollectiveSpec& spec, int world_size, int rank,
                          uint64_t input_bytes, Algorithm forced) {
  absl::Status status = ValidateSpec(spec, world_size);
  if (status.ok()) status = CheckForcedAlgorithm(spec, forced);
  if (status.ok()) status = CheckInputSize(spec, world_size, rank, input_bytes);
  return status;
}

absl::Status CheckInputSize(const CollectiveSpec& spec, int world_size,
                            int rank, uint64_t bytes) {
  const uint64_t want = InputBytes(spec, world_size, rank);
  if (bytes == want) return absl::OkStatus();
  // Off-root ranks of broadcast and scatter may pass a full-size buffer too.
  if (InputMayBeEmpty(spec, rank) &&
      bytes == (spec.kind == CollectiveKind::kScatter
                    ? spec.count * DTypeSize(spec.dtype) * world_size
                    : spec.count * DTypeSize(spec.dtype))) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "rank ", rank, " passed ", bytes, " bytes for ", DescribeSpec(spec),
      " in a group of ", world_size, "; expected ", want));
}

}  // namespace chorus
