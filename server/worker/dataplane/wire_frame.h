// The framing of data-plane messages on a raw TCP connection between two
// workers. Each message is a fixed 48-byte header, the group name, then the
// payload:
//
//   offset size  field
//   0      4     magic "CHRS"
//   4      2     version (1)
//   6      2     group name length in bytes (at most kMaxFrameGroupBytes)
//   8      8     epoch
//   16     8     sequence
//   24     4     from rank
//   28     4     to rank
//   32     4     tag
//   36     4     flags: kFrameGoodbye, or 0
//   40     8     payload length in bytes (at most kMaxFramePayloadBytes)
//
// Integers are little-endian whatever the host. A connection opens with a
// fixed hello (kWireHello) so that a stray client is refused at once, and a
// sender that closes it on purpose first sends a goodbye frame (no group,
// no payload), so the receiver can tell a clean close from a lost peer.
//
// Stateless functions; thread-safe.
#ifndef CHORUS_SERVER_WORKER_DATAPLANE_WIRE_FRAME_H_
#define CHORUS_SERVER_WORKER_DATAPLANE_WIRE_FRAME_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/worker/dataplane/inbox.h"

namespace chorus {

inline constexpr size_t kFrameHeaderBytes = 48;
inline constexpr size_t kMaxFrameGroupBytes = 1024;
// A payload is one chunk of a collective; the coordinator plans chunks of
// at most 64 MiB (--chunk_bytes), like the gRPC message limit.
inline constexpr uint64_t kMaxFramePayloadBytes = 64ull << 20;
// The first bytes a connecting worker sends.
inline constexpr absl::string_view kWireHello = "CHORUS-DATA/1\n";

// Flag of the frame a sender sends before closing its connection.
inline constexpr uint32_t kFrameGoodbye = 1;

// The header fields of one frame.
struct FrameHeader {
  MessageKey key;  // key.group is filled from the bytes after the header
  uint64_t group_bytes = 0;
  uint64_t payload_bytes = 0;
  bool goodbye = false;
};

// Returns the header and group name of a frame for `key` with a payload of
// `payload_bytes`. Returns INVALID_ARGUMENT when the group name or payload
// is over its limit or a rank is negative.
absl::StatusOr<std::string> EncodeFrameHeader(const MessageKey& key,
                                              uint64_t payload_bytes);

// Returns the goodbye frame.
std::string EncodeGoodbyeFrame();

// Decodes the fixed part of a header (`header` is kFrameHeaderBytes long);
// the group name that follows is not read. Returns INVALID_ARGUMENT for a
// wrong magic or version, an unknown flag, a goodbye frame with a group or
// payload, a group length or payload length over its limit, or a negative
// rank.
absl::StatusOr<FrameHeader> DecodeFrameHeader(absl::string_view header);

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_DATAPLANE_WIRE_FRAME_H_
