// CHORUS_HOST_DEVICE marks inline functions that the reduce engines share
// between the CPU path (compiled by the host compiler) and the CUDA kernels
// (compiled by nvcc), so both paths run the very same element code. It
// expands to `__host__ __device__` under nvcc and to nothing otherwise.
//
// Also holds the bit casts those functions need; all are pure.
#ifndef CHORUS_COMMON_HOST_DEVICE_H_
#define CHORUS_COMMON_HOST_DEVICE_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define CHORUS_HOST_DEVICE __host__ __device__
#else
#define CHORUS_HOST_DEVICE
#endif

namespace chorus {
namespace reduce {

// Returns the IEEE-754 bit pattern of `value`.
CHORUS_HOST_DEVICE inline uint32_t FloatBits(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
#endif
}

// Returns the float whose IEEE-754 bit pattern is `bits`.
CHORUS_HOST_DEVICE inline float FloatFromBits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
#endif
}

// Returns the IEEE-754 bit pattern of `value`.
CHORUS_HOST_DEVICE inline uint64_t DoubleBits(double value) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(value));
#else
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
#endif
}

// Returns the double whose IEEE-754 bit pattern is `bits`.
CHORUS_HOST_DEVICE inline double DoubleFromBits(uint64_t bits) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(bits));
#else
  double value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
#endif
}

}  // namespace reduce
}  // namespace chorus

#endif  // CHORUS_COMMON_HOST_DEVICE_H_
