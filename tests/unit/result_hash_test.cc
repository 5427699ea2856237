// Tests for ResultHash (common/result_hash.h): the hash of a result
// does not depend on the pieces it was added in, changes when any bit or
// the position of any element changes, and is the same for every NaN.
#include "common/result_hash.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
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
  const uint64_t whole = HashWhole(DType::kU32, bytes);
  for (size_t bit = 0; bit < bytes.size() * 8; ++bit) {
    std::string flipped = bytes;
    flipped[bit / 8] ^= static_cast<char>(1 << (bit % 8));
    ASSERT_NE(HashWhole(DType::kU32, flipped), whole) << "bit " << bit;
  }
}

// `n` elements of `size` bytes: 1.0-like bits then `last`.
std::string Elements(size_t size, uint64_t first, uint64_t last) {
  std::string bytes(2 * size, '\0');
  std::memcpy(bytes.data(), &first, size);
  std::memcpy(bytes.data() + size, &last, size);
  return bytes;
}

TEST(ResultHashTest, Value_NaNOfAnySignOrPayload_SameAsOtherNaNs) {
  struct Case {
    DType dtype;
    uint64_t one, canonical, other_nan, negative_nan, infinity;
  };
  for (const Case& c : std::vector<Case>{
           {DType::kF16, 0x3c00, 0x7e00, 0x7c01, 0xfe00, 0x7c00},
           {DType::kBF16, 0x3f80, 0x7fc0, 0x7f81, 0xffc0, 0x7f80},
           {DType::kF32, 0x3f800000, 0x7fc00000, 0x7f800001, 0xffc00000,
            0x7f800000},
           {DType::kF64, 0x3ff0000000000000, 0x7ff8000000000000,
            0x7ff0000000000001, 0xfff8000000000000, 0x7ff0000000000000}}) {
    const size_t size = DTypeSize(c.dtype);
    const uint64_t nan = HashWhole(c.dtype, Elements(size, c.one, c.canonical));
    EXPECT_EQ(HashWhole(c.dtype, Elements(size, c.one, c.other_nan)), nan)
        << DTypeName(c.dtype);
    EXPECT_EQ(HashWhole(c.dtype, Elements(size, c.one, c.negative_nan)), nan)
        << DTypeName(c.dtype);
    // An infinity is a value, and so is the bit pattern in an integer.
    EXPECT_NE(HashWhole(c.dtype, Elements(size, c.one, c.infinity)), nan)
        << DTypeName(c.dtype);
  }
  EXPECT_NE(HashWhole(DType::kU32, Elements(4, 1, 0x7fc00000)),
            HashWhole(DType::kU32, Elements(4, 1, 0x7f800001)));
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
