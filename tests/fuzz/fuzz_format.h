// The input format the Chorus fuzzers share with make_seeds: a sequence of
// records, each one op byte, a 2-byte little-endian payload length and the
// payload (a serialized chorus.v1 message). A record whose length runs past
// the end of the input takes what is left.
//
//   request_fuzzer: the op byte's low 3 bits pick the request (RequestOp);
//     bits 3-6 pick how long the call may wait (or how far the clock moves
//     for kAdvance); bit 7 (kMirror) makes a Collective or Commit also be
//     made by every other rank of the group, with the same spec and inputs
//     of the right size, so that matches complete.
//   chunk_fuzzer: the op byte's low 3 bits pick what happens with the
//     payload's chorus.v1.Chunk (ChunkOp); bits 3-7 pick the stream or the
//     message it applies to.
//
// Header-only; plain functions.
#ifndef CHORUS_TESTS_FUZZ_FUZZ_FORMAT_H_
#define CHORUS_TESTS_FUZZ_FUZZ_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace chorus {
namespace fuzz {

enum RequestOp : uint8_t {
  kRegister = 0,       // RegisterWorkerRequest
  kJoin = 1,           // JoinGroupRequest
  kCollective = 2,     // CollectiveRequest
  kCommit = 3,         // CommitRequest
  kReportFailure = 4,  // ReportFailureRequest
  kAdvance = 5,        // no payload: advance the clock, evict, expire
  kHeartbeat = 6,      // HeartbeatRequest
  kDeregister = 7,     // DeregisterRequest
};

enum ChunkOp : uint8_t {
  // Deliver on stream (bits 3-7) % kChunkStreams; three values of the
  // eight, so that most records deliver.
  kDeliver = 0,
  kDeliverToo = 1,
  kDeliverAlso = 2,
  kTake = 3,   // Take the chunk's key with a deadline already passed
  kAbort = 4,  // Abort the chunk's group and epoch
  kAbortAllSeen = 5,
  kCloseStream = 6,  // close stream (bits 3-7) % kStreams and open a new one
  kTakeStored = 7,   // Take the (bits 3-7)-th stored message, if any
};

inline constexpr uint8_t kOpMask = 0x07;
inline constexpr uint8_t kMirror = 0x80;
inline constexpr int kChunkStreams = 3;

// Bits 3-6 of a request op byte.
inline int RequestAmount(uint8_t tag) { return (tag >> 3) & 0x0f; }
// Bits 3-7 of a chunk op byte.
inline int ChunkSelector(uint8_t tag) { return tag >> 3; }

inline uint8_t RequestTag(RequestOp op, int amount = 0, bool mirror = false) {
  return static_cast<uint8_t>(op | ((amount & 0x0f) << 3) |
                              (mirror ? kMirror : 0));
}

inline uint8_t ChunkTag(ChunkOp op, int selector = 0) {
  return static_cast<uint8_t>(op | ((selector & 0x1f) << 3));
}

// Appends one record to `out`. Payloads over 65535 bytes are cut.
inline void AppendRecord(uint8_t tag, absl::string_view payload,
                         std::string* out) {
  if (payload.size() > 0xffff) payload = payload.substr(0, 0xffff);
  out->push_back(static_cast<char>(tag));
  out->push_back(static_cast<char>(payload.size() & 0xff));
  out->push_back(static_cast<char>(payload.size() >> 8));
  out->append(payload.data(), payload.size());
}

// Reads records from an input.
class RecordReader {
 public:
  explicit RecordReader(absl::string_view input) : rest_(input) {}

  // Returns false at the end of the input.
  bool Next(uint8_t* tag, absl::string_view* payload) {
    if (rest_.empty()) return false;
    *tag = static_cast<uint8_t>(rest_[0]);
    rest_.remove_prefix(1);
    size_t length = 0;
    if (rest_.size() >= 2) {
      length = static_cast<uint8_t>(rest_[0]) |
               (static_cast<size_t>(static_cast<uint8_t>(rest_[1])) << 8);
      rest_.remove_prefix(2);
    } else {
      length = rest_.size();
    }
    if (length > rest_.size()) length = rest_.size();
    *payload = rest_.substr(0, length);
    rest_.remove_prefix(length);
    return true;
  }

 private:
  absl::string_view rest_;
};

}  // namespace fuzz
}  // namespace chorus

#endif  // CHORUS_TESTS_FUZZ_FUZZ_FORMAT_H_
