// Deterministic inputs and expected outputs for chorus-bench. Every element
// is a small integer, so every sum, product, minimum and maximum is exact in
// every dtype (f16 and bf16 included, up to a few dozen ranks) and a result
// can be compared bit for bit with values computed locally:
//   sum, avg:     rank r, element i = (r+1) * (i%7 + 1)
//   prod:         1 + ((r+i) % 2)
//   min, max:     1 + ((i + 3r) % 11)
//   other kinds:  1 + ((13r + i) % 97)
// The expected reduction folds the ranks' values with the reduce engines'
// own element operators (server/reduce/element_ops.h), so integer wrap-around
// and avg's truncation match the engines too.
//
// Template functions over the element storage types; pure and thread-safe.
#ifndef CHORUS_BENCH_BENCH_DATA_H_
#define CHORUS_BENCH_BENCH_DATA_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/collective.h"
#include "common/half.h"
#include "server/reduce/element_ops.h"

namespace chorus::bench {

// Reduce-kind inputs repeat with this period in the element index (lcm of 7,
// 2 and 11), so the expected reduction is a table of this many values.
inline constexpr uint64_t kReducePeriod = 154;

// The value rank `rank` holds at element `index` of its input (see above).
inline int64_t FillValue(CollectiveKind kind, ReduceOp op, int rank,
                         uint64_t index) {
  const uint64_t r = static_cast<uint64_t>(rank);
  if (!KindReduces(kind))
    return 1 + static_cast<int64_t>((13 * r + index) % 97);
  switch (op) {
    case ReduceOp::kProd:
      return 1 + static_cast<int64_t>((r + index) % 2);
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return 1 + static_cast<int64_t>((index + 3 * r) % 11);
    default:
      return static_cast<int64_t>((r + 1) * (index % 7 + 1));
  }
}

// `value` (a small integer) as element type T.
template <typename T>
T FromSmallInt(int64_t value) {
  if constexpr (std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>) {
    return reduce::FromFloat(static_cast<float>(value), T{});
  } else {
    return static_cast<T>(value);
  }
}

// Fills `data` with rank `rank`'s input elements 0 .. data.size()-1.
template <typename T>
void FillInput(CollectiveKind kind, ReduceOp op, int rank,
               std::vector<T>& data) {
  if (KindReduces(kind)) {
    // Periodic: compute one period and repeat it.
    std::array<T, kReducePeriod> period;
    for (uint64_t i = 0; i < kReducePeriod; ++i) {
      period[i] = FromSmallInt<T>(FillValue(kind, op, rank, i));
    }
    for (size_t i = 0; i < data.size(); ++i) {
      data[i] = period[i % kReducePeriod];
    }
    return;
  }
  for (size_t i = 0; i < data.size(); ++i) {
    data[i] = FromSmallInt<T>(FillValue(kind, op, rank, i));
  }
}

// Expected reduction over `world_size` ranks of element i, for i in one
// period (index i % kReducePeriod).
template <typename T>
std::array<T, kReducePeriod> ExpectedReduction(CollectiveKind kind, ReduceOp op,
                                               int world_size) {
  std::array<T, kReducePeriod> table;
  for (uint64_t i = 0; i < kReducePeriod; ++i) {
    T acc = FromSmallInt<T>(FillValue(kind, op, 0, i));
    for (int r = 1; r < world_size; ++r) {
      const T v = FromSmallInt<T>(FillValue(kind, op, r, i));
      switch (op) {
        case ReduceOp::kProd:
          acc = reduce::ProdOp()(acc, v);
          break;
        case ReduceOp::kMin:
          acc = reduce::MinOp()(acc, v);
          break;
        case ReduceOp::kMax:
          acc = reduce::MaxOp()(acc, v);
          break;
        default:  // sum, and avg before its division
          acc = reduce::SumOp()(acc, v);
          break;
      }
    }
    if (op == ReduceOp::kAvg) acc = reduce::DivideByRanks(acc, world_size);
    table[i] = acc;
  }
  return table;
}

// Counts the elements of `output` (rank `rank`'s output of `spec` in a group
// of `world_size`) that differ bitwise from the expected values. An output of
// the wrong size counts as every expected element wrong (at least one).
template <typename T>
uint64_t CountWrong(const CollectiveSpec& spec, int world_size, int rank,
                    absl::string_view output) {
  const uint64_t want_bytes = OutputBytes(spec, world_size, rank);
  if (output.size() != want_bytes) {
    return std::max<uint64_t>(1, want_bytes / sizeof(T));
  }
  const uint64_t count = spec.count;
  uint64_t wrong = 0;
  auto compare = [&](uint64_t at, const T& expected) {
    if (std::memcmp(output.data() + at * sizeof(T), &expected, sizeof(T)) !=
        0) {
      ++wrong;
    }
  };
  auto value = [&](int from_rank, uint64_t index) {
    return FromSmallInt<T>(FillValue(spec.kind, spec.op, from_rank, index));
  };
  switch (spec.kind) {
    case CollectiveKind::kAllReduce:
    case CollectiveKind::kReduce:
    case CollectiveKind::kReduceScatter: {
      if (want_bytes == 0) break;  // reduce off the root
      const std::array<T, kReducePeriod> table =
          ExpectedReduction<T>(spec.kind, spec.op, world_size);
      // Reduce-scatter's block r starts at element r*count of the inputs.
      const uint64_t base =
          spec.kind == CollectiveKind::kReduceScatter ? rank * count : 0;
      for (uint64_t i = 0; i < count; ++i) {
        compare(i, table[(base + i) % kReducePeriod]);
      }
      break;
    }
    case CollectiveKind::kBroadcast:
      for (uint64_t i = 0; i < count; ++i) compare(i, value(spec.root, i));
      break;
    case CollectiveKind::kScatter:
      for (uint64_t i = 0; i < count; ++i) {
        compare(i, value(spec.root, rank * count + i));
      }
      break;
    case CollectiveKind::kAllGather:
    case CollectiveKind::kGather:
      if (want_bytes == 0) break;  // gather off the root
      for (int j = 0; j < world_size; ++j) {
        for (uint64_t i = 0; i < count; ++i)
          compare(j * count + i, value(j, i));
      }
      break;
    case CollectiveKind::kAllToAll:
      // Block j of rank r's output is block r of rank j's input.
      for (int j = 0; j < world_size; ++j) {
        for (uint64_t i = 0; i < count; ++i) {
          compare(j * count + i, value(j, rank * count + i));
        }
      }
      break;
    default:
      break;
  }
  return wrong;
}

}  // namespace chorus::bench

#endif  // CHORUS_BENCH_BENCH_DATA_H_
