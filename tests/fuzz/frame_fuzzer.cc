// frame_fuzzer: the TCP data plane's receiving protocol. Input: the bytes a
// peer sends on one connection (hello, wire frames, maybe a goodbye),
// read by ReadFrameStream exactly as TcpListener reads a socket.
//
// Checked, besides crashes and ASan/UBSan reports:
// - every message handed on re-encodes (EncodeFrameHeader + payload) to
//   exactly the bytes it was read from, in order, right after the hello;
// - the stream's end matches what follows the last message: kGoodbye when a
//   header with the goodbye flag does, kMalformed when a bad hello or a header
//   that does not decode does, kClosed when the bytes end before a whole frame;
// - nothing is handed on after a bad hello.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/worker/dataplane/frame_reader.h"
#include "server/worker/dataplane/wire_frame.h"

namespace chorus {
namespace {

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "invariant failed: %s\n", what);
  std::abort();
}

class MemorySource final : public ByteSource {
 public:
  explicit MemorySource(absl::string_view bytes) : bytes_(bytes) {}
  bool Read(char* out, size_t size) override {
    const size_t n = std::min(size, bytes_.size());
    std::memcpy(out, bytes_.data(), n);
    bytes_.remove_prefix(n);
    return n == size;
  }

 private:
  absl::string_view bytes_;
};

// True when `rest` holds less than one whole frame.
bool LessThanAFrame(absl::string_view rest) {
  if (rest.size() < kFrameHeaderBytes) return true;
  absl::StatusOr<FrameHeader> header =
      DecodeFrameHeader(rest.substr(0, kFrameHeaderBytes));
  if (!header.ok()) return false;
  return rest.size() - kFrameHeaderBytes <
         header->group_bytes + header->payload_bytes;
}

}  // namespace
}  // namespace chorus

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace chorus;
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  MemorySource source(input);
  std::string consumed;
  bool ok = true;
  const StreamEnd end =
      ReadFrameStream(source, [&](MessageKey key, std::string payload) {
        absl::StatusOr<std::string> header =
            EncodeFrameHeader(key, payload.size());
        if (!header.ok()) Fail("a message was handed on that cannot be sent");
        consumed += *header;
        consumed += payload;
        return ok;
      });
  const bool hello_ok = input.substr(0, kWireHello.size()) == kWireHello;
  if (!hello_ok) {
    if (!consumed.empty()) Fail("messages handed on after a bad hello");
    if (input.size() < kWireHello.size() ? end != StreamEnd::kClosed
                                         : end != StreamEnd::kMalformed) {
      Fail("a bad or short hello did not end the stream as it should");
    }
    return 0;
  }
  absl::string_view rest = input.substr(kWireHello.size());
  if (rest.substr(0, consumed.size()) != consumed) {
    Fail("messages do not re-encode to the bytes they came from");
  }
  rest.remove_prefix(consumed.size());
  switch (end) {
    case StreamEnd::kGoodbye: {
      if (rest.size() < kFrameHeaderBytes) Fail("kGoodbye without a frame");
      absl::StatusOr<FrameHeader> goodbye =
          DecodeFrameHeader(rest.substr(0, kFrameHeaderBytes));
      if (!goodbye.ok() || !goodbye->goodbye) {
        Fail("kGoodbye without a goodbye frame");
      }
      break;
    }
    case StreamEnd::kMalformed:
      if (rest.size() < kFrameHeaderBytes ||
          DecodeFrameHeader(rest.substr(0, kFrameHeaderBytes)).ok()) {
        Fail("kMalformed after a header that decodes");
      }
      break;
    case StreamEnd::kClosed:
      if (!LessThanAFrame(rest)) Fail("kClosed with a whole frame left");
      break;
    case StreamEnd::kStopped:
      Fail("kStopped though the callback never stopped");
  }
  return 0;
}
