// Tests for ResultHash (common/result_hash.h): the hash of a result
// does not depend on the pieces it was added in, and changes when any bit
// or the position of any element changes.
#include "common/result_hash.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace chorus {
namespace {

std::string Bytes(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  uint32_t x = seed;
  for (char& c : s) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  return s;
}

uint64_t HashWhole(DType dtype, const std::string& bytes) {
  ResultHash hash(dtype);
  hash.Add(0, bytes);
  return hash.value();
}

TEST(ResultHashTest, Add_AnySplitAndOrder_SameValue) {
  for (DType dtype : {DType::kU8, DType::kF16, DType::kF32, DType::kF64}) {
    const size_t element = DTypeSize(dtype);
    const std::string bytes = Bytes(1000 * element, 7);
    const uint64_t whole = HashWhole(dtype, bytes);
    // Pieces of 1, 3, 7, ... elements, added last to first.
    ResultHash pieces(dtype);
    std::vector<std::pair<size_t, size_t>> ranges;
    for (size_t at = 0, n = 1; at < 1000; at += n, n = n * 2 + 1) {
      ranges.push_back({at, std::min(n, 1000 - at)});
    }
    for (auto it = ranges.rbegin(); it != ranges.rend(); ++it) {
      pieces.Add(it->first * element,
                 bytes.substr(it->first * element, it->second * element));
    }
    EXPECT_EQ(pieces.value(), whole) << DTypeName(dtype);
    EXPECT_EQ(pieces.bytes(), bytes.size());
  }
}

TEST(ResultHashTest, Value_AnyFlippedBit_Differs) {
  const std::string bytes = Bytes(256, 3);
  const uint64_t whole = HashWhole(DType::kF32, bytes);
  for (size_t bit = 0; bit < bytes.size() * 8; ++bit) {
    std::string flipped = bytes;
    flipped[bit / 8] ^= static_cast<char>(1 << (bit % 8));
    ASSERT_NE(HashWhole(DType::kF32, flipped), whole) << "bit " << bit;
  }
}

TEST(ResultHashTest, Value_SwappedElements_Differs) {
  std::string bytes = Bytes(64, 5);
  const uint64_t whole = HashWhole(DType::kI32, bytes);
  std::swap_ranges(bytes.begin(), bytes.begin() + 4, bytes.begin() + 4);
  EXPECT_NE(HashWhole(DType::kI32, bytes), whole);
}

TEST(ResultHashTest, Value_ExtraZeroElement_Differs) {
  const std::string bytes(64, '\0');
  EXPECT_NE(HashWhole(DType::kU8, bytes),
            HashWhole(DType::kU8, std::string(65, '\0')));
  EXPECT_NE(HashWhole(DType::kU8, std::string()),
            HashWhole(DType::kU8, std::string(1, '\0')));
}

}  // namespace
}  // namespace chorus
