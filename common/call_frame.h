// The framing of the coordinator's call port: collective calls, commits and
// failure reports between a worker and the coordinator as plain TCP frames,
// for calls whose cost is mostly the round trip (small all-reduces,
// barriers). A connection starts with the client's hello, kCallHello; then
// each side sends frames, a 4-byte little-endian length followed by that many
// bytes of a serialized message: chorus.v1.CallPortRequest from the worker,
// CallPortReply from the coordinator (see coordinator.proto).
//
// Stateless functions and a parser used by one thread at a time.
#ifndef CHORUS_COMMON_CALL_FRAME_H_
#define CHORUS_COMMON_CALL_FRAME_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace chorus {

inline constexpr absl::string_view kCallHello = "CHORUS-CALL/1\n";
inline constexpr size_t kCallFrameHeaderBytes = 4;

// Appends a frame holding `payload` to `out`.
void AppendCallFrame(absl::string_view payload, std::string* out);

// Cuts whole frames off the front of a byte buffer that grows as data
// arrives.
class CallFrameParser {
 public:
  explicit CallFrameParser(uint64_t max_payload_bytes)
      : max_payload_bytes_(max_payload_bytes) {}

  // Adds received bytes.
  void Append(absl::string_view bytes) {
    buffer_.append(bytes.data(), bytes.size());
  }

  // Moves the next whole frame's payload into `payload` and returns true;
  // returns false when no whole frame is buffered yet. Returns
  // RESOURCE_EXHAUSTED (and keeps failing) when a frame announces more than
  // the limit: the stream cannot be trusted past it.
  absl::StatusOr<bool> Next(std::string* payload);

  // Forgets everything buffered and any failure (for a new connection).
  void Reset() {
    buffer_.clear();
    consumed_ = 0;
    failed_ = absl::OkStatus();
  }

  // Bytes buffered and not yet handed out.
  size_t buffered() const { return buffer_.size() - consumed_; }

 private:
  const uint64_t max_payload_bytes_;
  std::string buffer_;
  size_t consumed_ = 0;
  absl::Status failed_;
};

}  // namespace chorus

#endif  // CHORUS_COMMON_CALL_FRAME_H_
