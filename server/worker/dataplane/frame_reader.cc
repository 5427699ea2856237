#include "server/worker/dataplane/frame_reader.h"

#include <algorithm>
#include <utility>

#include "absl/status/statusor.h"
#include "server/worker/dataplane/wire_frame.h"

namespace chorus {

namespace {

// Reads a payload of `size` bytes into `*data`: into a kept buffer of that
// size when `buffers` has one, else growing in steps of kFrameReadStep.
// Returns false when the bytes ended first.
bool ReadPayload(ByteSource& source, uint64_t size, PayloadBuffers* buffers,
                 std::string* data) {
  if (buffers != nullptr && buffers->Take(size, data)) {
    return source.Read(data->data(), data->size());
  }
  while (data->size() < size) {
    const size_t have = data->size();
    const size_t step =
        static_cast<size_t>(std::min<uint64_t>(size - have, kFrameReadStep));
    data->resize(have + step);
    if (!source.Read(data->data() + have, step)) return false;
  }
  return true;
}

}  // namespace

StreamEnd ReadFrameStream(ByteSource& source, const FrameCallback& on_message,
                          std::string* why, PayloadBuffers* buffers) {
  auto malformed = [why](std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    return StreamEnd::kMalformed;
  };
  std::string hello(kWireHello.size(), '\0');
  if (!source.Read(hello.data(), hello.size())) return StreamEnd::kClosed;
  if (hello != kWireHello) {
    return malformed("the connection did not open with the data-plane hello");
  }
  std::string header(kFrameHeaderBytes, '\0');
  while (source.Read(header.data(), header.size())) {
    absl::StatusOr<FrameHeader> frame = DecodeFrameHeader(header);
    if (!frame.ok()) return malformed(std::string(frame.status().message()));
    if (frame->goodbye) return StreamEnd::kGoodbye;
    MessageKey& key = frame->key;
    key.group.resize(frame->group_bytes);
    if (!source.Read(key.group.data(), key.group.size())) {
      return StreamEnd::kClosed;
    }
    std::string data;
    if (!ReadPayload(source, frame->payload_bytes, buffers, &data)) {
      return StreamEnd::kClosed;
    }
    if (!on_message(std::move(key), std::move(data))) {
      return StreamEnd::kStopped;
    }
  }
  return StreamEnd::kClosed;
}

}  // namespace chorus
