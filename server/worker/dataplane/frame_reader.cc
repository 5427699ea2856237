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

std::optional<StreamEnd> ReadHello(ByteSource& source, std::string* why) {
  std::string hello(kWireHello.size(), '\0');
  if (!source.Read(hello.data(), hello.size())) return StreamEnd::kClosed;
  if (hello == kWireHello) return std::nullopt;
  if (why != nullptr) {
    *why = "the connection did not open with the data-plane hello";
  }
  return StreamEnd::kMalformed;
}

std::optional<StreamEnd> ReadFrame(ByteSource& source, MessageKey* key,
                                   std::string* data, std::string* why,
                                   PayloadBuffers* buffers) {
  char header[kFrameHeaderBytes];
  if (!source.Read(header, sizeof(header))) return StreamEnd::kClosed;
  absl::StatusOr<FrameHeader> frame =
      DecodeFrameHeader(absl::string_view(header, sizeof(header)));
  if (!frame.ok()) {
    if (why != nullptr) *why = std::string(frame.status().message());
    return StreamEnd::kMalformed;
  }
  if (frame->goodbye) return StreamEnd::kGoodbye;
  *key = std::move(frame->key);
  key->group.resize(frame->group_bytes);
  if (!source.Read(key->group.data(), key->group.size())) {
    return StreamEnd::kClosed;
  }
  data->clear();
  if (!ReadPayload(source, frame->payload_bytes, buffers, data)) {
    return StreamEnd::kClosed;
  }
  return std::nullopt;
}

StreamEnd ReadFrameStream(ByteSource& source, const FrameCallback& on_message,
                          std::string* why, PayloadBuffers* buffers) {
  if (std::optional<StreamEnd> end = ReadHello(source, why)) return *end;
  while (true) {
    MessageKey key;
    std::string data;
    if (std::optional<StreamEnd> end =
            ReadFrame(source, &key, &data, why, buffers)) {
      return *end;
    }
    if (!on_message(std::move(key), std::move(data))) {
      return StreamEnd::kStopped;
    }
  }
}

}  // namespace chorus
