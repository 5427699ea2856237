// The body of the CUDA reduce kernels, written as host/device functions over
// one thread's share of the range (`first`, `stride`), so that the host can
// run the exact same code in tests by simulating the threads of a grid.
// Internal to chorus_reduce_cuda and its tests; needs no CUDA headers.
//
// Layout of one launch over `count` elements (see SplitRange): a scalar head
// until dst is 16-byte aligned, a body of 16-byte packs (one vector load per
// input and one store per pack), and a scalar tail. When the inputs cannot be
// aligned together with dst (their addresses differ modulo 16), the whole
// range is scalar. Every part is a grid-stride loop, so any grid covers any
// count. Pure functions over caller-owned buffers.
#ifndef CHORUS_SERVER_REDUCE_CUDA_COMBINE_RANGE_H_
#define CHORUS_SERVER_REDUCE_CUDA_COMBINE_RANGE_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/host_device.h"
#include "server/reduce/element_ops.h"

namespace chorus {
namespace cuda_reduce {
namespace internal {

inline constexpr size_t kPackBytes = 16;

// kPackBytes of T, moved with one 128-bit load or store.
template <typename T>
struct alignas(kPackBytes) Pack {
  static constexpr int kLanes = static_cast<int>(kPackBytes / sizeof(T));
  T lane[kLanes];
};

// Loads the pack at p, which must be kPackBytes-aligned. The host version
// (tests only) aborts on a misaligned p, where the GPU would fault.
template <typename T>
CHORUS_HOST_DEVICE inline Pack<T> LoadPack(const T* p) {
  Pack<T> pack;
#if defined(__CUDA_ARCH__)
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  memcpy(&pack, &raw, sizeof(pack));
#else
  if (reinterpret_cast<uintptr_t>(p) % kPackBytes != 0) std::abort();
  std::memcpy(&pack, p, sizeof(pack));
#endif
  return pack;
}

// Stores `pack` at p, which must be kPackBytes-aligned (see LoadPack).
template <typename T>
CHORUS_HOST_DEVICE inline void StorePack(T* p, const Pack<T>& pack) {
#if defined(__CUDA_ARCH__)
  uint4 raw;
  memcpy(&raw, &pack, sizeof(raw));
  *reinterpret_cast<uint4*>(p) = raw;
#else
  if (reinterpret_cast<uintptr_t>(p) % kPackBytes != 0) std::abort();
  std::memcpy(p, &pack, sizeof(pack));
#endif
}

// How one launch splits [0, count): [0, head) scalar, then `packs` packs of
// Pack<T>::kLanes elements, then the rest scalar.
struct Split {
  size_t head;
  size_t packs;
};

// Returns the split for `count` elements of `size` bytes at the addresses
// dst, a and b: packs only when all three have the same offset modulo
// kPackBytes, after a head that brings dst to a pack boundary.
inline Split SplitRange(size_t size, size_t count, uintptr_t dst, uintptr_t a,
                        uintptr_t b) {
  const bool together =
      (dst - a) % kPackBytes == 0 && (dst - b) % kPackBytes == 0;
  if (!together) return Split{count, 0};
  size_t head = ((kPackBytes - dst % kPackBytes) % kPackBytes) / size;
  if (head > count) head = count;
  return Split{head, (count - head) / (kPackBytes / size)};
}

// Returns the number of scalar elements after the packs.
template <typename T>
size_t TailCount(size_t count, Split split) {
  return count - split.head - split.packs * Pack<T>::kLanes;
}

// dst[i] = op(a[i], b[i]) for this thread's share of [0, count): indices
// first, first + stride, ... of the head, the packs and the tail. dst may
// equal a or b.
template <typename T, typename Op>
CHORUS_HOST_DEVICE inline void CombineRange(Op op, T* dst, const T* a,
                                            const T* b, size_t count,
                                            Split split, size_t first,
                                            size_t stride) {
  for (size_t i = first; i < split.head; i += stride) dst[i] = op(a[i], b[i]);
  constexpr int kLanes = Pack<T>::kLanes;
  T* dst_body = dst + split.head;
  const T* a_body = a + split.head;
  const T* b_body = b + split.head;
  for (size_t p = first; p < split.packs; p += stride) {
    const size_t offset = p * kLanes;
    const Pack<T> x = LoadPack(a_body + offset);
    const Pack<T> y = LoadPack(b_body + offset);
    Pack<T> result;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int lane = 0; lane < kLanes; ++lane) {
      result.lane[lane] = op(x.lane[lane], y.lane[lane]);
    }
    StorePack(dst_body + offset, result);
  }
  for (size_t i = split.head + split.packs * kLanes + first; i < count;
       i += stride) {
    dst[i] = op(a[i], b[i]);
  }
}

// data[i] = finalize(data[i]) for this thread's share of [0, count), split
// as in CombineRange.
template <typename T>
CHORUS_HOST_DEVICE inline void FinalizeRange(reduce::AvgFinalize finalize,
                                             T* data, size_t count, Split split,
                                             size_t first, size_t stride) {
  for (size_t i = first; i < split.head; i += stride) {
    data[i] = finalize(data[i]);
  }
  constexpr int kLanes = Pack<T>::kLanes;
  T* body = data + split.head;
  for (size_t p = first; p < split.packs; p += stride) {
    Pack<T> pack = LoadPack(body + p * kLanes);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int lane = 0; lane < kLanes; ++lane) {
      pack.lane[lane] = finalize(pack.lane[lane]);
    }
    StorePack(body + p * kLanes, pack);
  }
  for (size_t i = split.head + split.packs * kLanes + first; i < count;
       i += stride) {
    data[i] = finalize(data[i]);
  }
}

}  // namespace internal
}  // namespace cuda_reduce
}  // namespace chorus

#endif  // CHORUS_SERVER_REDUCE_CUDA_COMBINE_RANGE_H_
