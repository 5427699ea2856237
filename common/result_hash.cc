#include "common/result_hash.h"

#include <cstring>

namespace chorus {
namespace {

// Constants of the per-element function (odd, with well-mixed bits).
constexpr uint32_t kIndexA = 0x9E3779B9u;
constexpr uint32_t kIndexB = 0x85EBCA6Bu;
constexpr uint32_t kOffsetA = 0x7F4A7C15u;
constexpr uint32_t kOffsetB = 0xC2B2AE35u;

// One element's share: a product of two 32-bit words that both depend on
// the element's index and its bits (8-byte elements contribute their two
// halves, one to each word). Written so the loops vectorise into 32x32->64
// multiplies.
inline uint64_t Term(uint64_t index, uint32_t low, uint32_t high) {
  const uint32_t i = static_cast<uint32_t>(index);
  const uint32_t a = low + (i * kIndexA + kOffsetA);
  const uint32_t b = (high ^ (i * kIndexB)) + kOffsetB;
  return static_cast<uint64_t>(a) * static_cast<uint64_t>(b | 1u);
}

// x86-64 builds get an AVX2 version of the loops too, picked at run time;
// the baseline (SSE2) one runs elsewhere.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CHORUS_HASH_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CHORUS_HASH_CLONES
#endif

template <typename T>
uint64_t SumTerms(const char* data, uint64_t count, uint64_t first) {
  uint64_t sum = 0;
  for (uint64_t k = 0; k < count; ++k) {
    T v;
    std::memcpy(&v, data + k * sizeof(T), sizeof(T));
    const uint32_t w = static_cast<uint32_t>(v);
    sum += Term(first + k, w, w);
  }
  return sum;
}

CHORUS_HASH_CLONES uint64_t SumTerms8(const char* data, uint64_t count,
                                      uint64_t first) {
  return SumTerms<uint8_t>(data, count, first);
}

CHORUS_HASH_CLONES uint64_t SumTerms16(const char* data, uint64_t count,
                                       uint64_t first) {
  return SumTerms<uint16_t>(data, count, first);
}

CHORUS_HASH_CLONES uint64_t SumTerms32(const char* data, uint64_t count,
                                       uint64_t first) {
  return SumTerms<uint32_t>(data, count, first);
}

CHORUS_HASH_CLONES uint64_t SumTerms64(const char* data, uint64_t count,
                                       uint64_t first) {
  uint64_t sum = 0;
  for (uint64_t k = 0; k < count; ++k) {
    uint64_t v;
    std::memcpy(&v, data + k * 8, 8);
    sum += Term(first + k, static_cast<uint32_t>(v),
                static_cast<uint32_t>(v >> 32));
  }
  return sum;
}

// A 64-bit finaliser, so that the sum's low and high bits both matter.
uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

}  // namespace

ResultHash::ResultHash(DType dtype) : element_size_(DTypeSize(dtype)) {}

void ResultHash::Add(uint64_t offset, absl::string_view bytes) {
  const uint64_t first = offset / element_size_;
  const uint64_t count = bytes.size() / element_size_;
  switch (element_size_) {
    case 1:
      sum_ += SumTerms8(bytes.data(), count, first);
      break;
    case 2:
      sum_ += SumTerms16(bytes.data(), count, first);
      break;
    case 4:
      sum_ += SumTerms32(bytes.data(), count, first);
      break;
    default:
      sum_ += SumTerms64(bytes.data(), count, first);
      break;
  }
  bytes_ += bytes.size();
}

uint64_t ResultHash::value() const { return Mix(sum_ ^ Mix(bytes_)); }

}  // namespace chorus
