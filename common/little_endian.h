// Little-endian integers inside byte strings, whatever the host's byte
// order: the integers of Chorus's own wire formats (data-plane frames, call
// port frames, leader-plan messages) are written and read through these.
//
// Stateless functions; thread-safe.
#ifndef CHORUS_COMMON_LITTLE_ENDIAN_H_
#define CHORUS_COMMON_LITTLE_ENDIAN_H_

#include <cstdint>

namespace chorus {

// Writes the low `bytes` bytes (1-8) of `value` to `out`, lowest first.
inline void StoreLittleEndian(uint64_t value, int bytes, char* out) {
  for (int i = 0; i < bytes; ++i) {
    out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  }
}

// Returns the integer of `bytes` bytes (1-8) at `in`, lowest first.
inline uint64_t LoadLittleEndian(const char* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) {
    value |= static_cast<uint64_t>(static_cast<unsigned char>(in[i]))
             << (8 * i);
  }
  return value;
}

}  // namespace chorus

#endif  // CHORUS_COMMON_LITTLE_ENDIAN_H_
