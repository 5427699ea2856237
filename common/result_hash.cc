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

// Every NaN of a floating-point element reads as one canonical NaN: a
// NaN's sign and payload depend on the hardware that made it (a GPU
// canonicalises, a CPU propagates the payload), not on the result.
// `nan.exponent` is 0 for integer types, which then read as they are.
template <typename T>
struct NanForm {
  T exponent = 0;  // all ones in a NaN
  T mantissa = 0;  // not all zeros in a NaN
  T canonical = 0;
};

template <typename T>
inline T Canonical(T v, const NanForm<T>& nan) {
  const bool is_nan = nan.exponent != 0 && (v & nan.exponent) == nan.exponent &&
                      (v & nan.mantissa) != 0;
  return is_nan ? nan.canonical : v;
}

template <typename T>
uint64_t SumTerms(const char* data, uint64_t count, uint64_t first,
                  NanForm<T> nan) {
  uint64_t sum = 0;
  for (uint64_t k = 0; k < count; ++k) {
    T v;
    std::memcpy(&v, data + k * sizeof(T), sizeof(T));
    const uint32_t w = static_cast<uint32_t>(Canonical(v, nan));
    sum += Term(first + k, w, w);
  }
  return sum;
}

CHORUS_HASH_CLONES uint64_t SumTerms8(const char* data, uint64_t count,
                                      uint64_t first) {
  return SumTerms<uint8_t>(data, count, first, {});
}

CHORUS_HASH_CLONES uint64_t SumTerms16(const char* data, uint64_t count,
                                       uint64_t first, NanForm<uint16_t> nan) {
  return SumTerms<uint16_t>(data, count, first, nan);
}

CHORUS_HASH_CLONES uint64_t SumTerms32(const char* data, uint64_t count,
                                       uint64_t first, NanForm<uint32_t> nan) {
  return SumTerms<uint32_t>(data, count, first, nan);
}

CHORUS_HASH_CLONES uint64_t SumTerms64(const char* data, uint64_t count,
                                       uint64_t first, NanForm<uint64_t> nan) {
  uint64_t sum = 0;
  for (uint64_t k = 0; k < count; ++k) {
    uint64_t v;
    std::memcpy(&v, data + k * 8, 8);
    v = Canonical(v, nan);
    sum += Term(first + k, static_cast<uint32_t>(v),
                static_cast<uint32_t>(v >> 32));
  }
  return sum;
}

// The NaN form of `dtype` for its elements, `T`; none for other dtypes.
template <typename T>
NanForm<T> NanFormOf(DType dtype) {
  if constexpr (sizeof(T) == 2) {
    if (dtype == DType::kF16) return {0x7c00, 0x03ff, 0x7e00};
    if (dtype == DType::kBF16) return {0x7f80, 0x007f, 0x7fc0};
  } else if constexpr (sizeof(T) == 4) {
    if (dtype == DType::kF32) return {0x7f800000u, 0x007fffffu, 0x7fc00000u};
  } else {
    if (dtype == DType::kF64) {
      return {0x7ff0000000000000ull, 0x000fffffffffffffull,
              0x7ff8000000000000ull};
    }
  }
  return {};
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

ResultHash::ResultHash(DType dtype)
    : dtype_(dtype), element_size_(DTypeSize(dtype)) {}

void ResultHash::Add(uint64_t offset, absl::string_view bytes) {
  const uint64_t first = offset / element_size_;
  const uint64_t count = bytes.size() / element_size_;
  switch (element_size_) {
    case 1:
      sum_ += SumTerms8(bytes.data(), count, first);
      break;
    case 2:
      sum_ +=
          SumTerms16(bytes.data(), count, first, NanFormOf<uint16_t>(dtype_));
      break;
    case 4:
      sum_ +=
          SumTerms32(bytes.data(), count, first, NanFormOf<uint32_t>(dtype_));
      break;
    default:
      sum_ +=
          SumTerms64(bytes.data(), count, first, NanFormOf<uint64_t>(dtype_));
      break;
  }
  bytes_ += bytes.size();
}

uint64_t ResultHash::value() const { return Mix(sum_ ^ Mix(bytes_)); }

}  // namespace chorus
