// The values of Chorus's public C++ API: devices, element types, reduce
// ops, collective kinds, plans and the collective spec. They mirror the enums
// of proto/chorus/v1/types.proto value for value, so a proto enum converts
// with a static_cast. This header needs nothing but the standard library.
//
// Plain values; thread-compatible.
#ifndef CHORUS_INCLUDE_CHORUS_TYPES_H_
#define CHORUS_INCLUDE_CHORUS_TYPES_H_

#include <cstdint>
#include <string>

namespace chorus {

// Mirrors chorus.v1.DeviceKind. kUnspecified is never valid in a request.
enum class DeviceKind {
  kUnspecified = 0,
  kCpu = 1,
  kCuda = 2,
  kRocm = 3,
  kVulkan = 4,
  kMetal = 5,
  kWgpu = 6,
  kTpu = 7,
  kOther = 15,
};

struct Device {
  DeviceKind kind = DeviceKind::kUnspecified;
  int32_t index = 0;
  // Names the kind when kind == kOther, as given (e.g. "Npu").
  std::string other_kind;
  // Descriptive fields reported by the owning worker.
  std::string model;
  uint64_t memory_bytes = 0;
  std::string compute_capability;
};

// Mirrors chorus.v1.DType. kUnspecified is never valid for an operation.
enum class DType : int {
  kUnspecified = 0,
  kF16 = 1,
  kBF16 = 2,
  kF32 = 3,
  kF64 = 4,
  kI8 = 5,
  kU8 = 6,
  kI32 = 7,
  kI64 = 8,
  kU32 = 9,
  kU64 = 10,
};

// Mirrors chorus.v1.ReduceOp. kUnspecified is never valid for an operation.
enum class ReduceOp : int {
  kUnspecified = 0,
  kSum = 1,
  kProd = 2,
  kMin = 3,
  kMax = 4,
  kAvg = 5,
};

// Mirrors chorus.v1.CollectiveKind.
enum class CollectiveKind : int {
  kUnspecified = 0,
  kAllReduce = 1,
  kReduce = 2,
  kBroadcast = 3,
  kAllGather = 4,
  kReduceScatter = 5,
  kGather = 6,
  kScatter = 7,
  kAllToAll = 8,
  kBarrier = 9,
  // Elastic groups: a barrier at which waiting newcomers are admitted.
  kSync = 10,
};

// Mirrors chorus.v1.Algorithm.
enum class Algorithm : int {
  kUnspecified = 0,
  kInline = 1,
  kRecursiveDoubling = 2,
  kTree = 3,
  kRing = 4,
  kSameHost = 5,
  kNccl = 6,
  kLeader = 7,
};

// What one rank asks of one collective call; mirrors chorus.v1.CollectiveSpec
// field for field.
//
// `count` is always the number of elements in one rank's block:
//   all_reduce, reduce, broadcast: every buffer holds count elements;
//   all_gather, gather: input count, output world*count (gather: root only);
//   reduce_scatter: input world*count, output count;
//   scatter: root input world*count, output count;
//   all_to_all: input and output world*count (block i goes to rank i);
//   barrier: no data, count 0.
// Inputs a rank does not need (broadcast or scatter off the root) may be
// empty.
struct CollectiveSpec {
  CollectiveKind kind = CollectiveKind::kUnspecified;
  DType dtype = DType::kUnspecified;
  uint64_t count = 0;
  // Only for kinds that reduce.
  ReduceOp op = ReduceOp::kUnspecified;
  // Only for kinds with a root.
  int32_t root = 0;
};

}  // namespace chorus

#endif  // CHORUS_INCLUDE_CHORUS_TYPES_H_
