// ReadFrameStream: the receiving half of the TCP data plane's protocol,
// apart from the socket. It checks the hello, then decodes wire frames
// (wire_frame.h) one after another and hands each message to a callback,
// until a goodbye frame, the end of the bytes, a malformed frame, or the
// callback asks to stop. ReadHello() and ReadFrame() are its two steps, for
// a reader that reads a frame at a time. A payload is read in steps of at most
// kFrameReadStep bytes, so a peer that announces a large payload and then
// stops costs no more memory than it sent.
//
// Stateless function; thread-compatible (the source and callback are the
// caller's).
#ifndef CHORUS_SERVER_WORKER_DATAPLANE_FRAME_READER_H_
#define CHORUS_SERVER_WORKER_DATAPLANE_FRAME_READER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "server/worker/dataplane/inbox.h"
#include "server/worker/dataplane/payload_buffers.h"

namespace chorus {

inline constexpr uint64_t kFrameReadStep = 4 << 20;

// Where the bytes come from.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads exactly `size` bytes into `out`; false when the bytes ended (or
  // failed) first.
  virtual bool Read(char* out, size_t size) = 0;
};

enum class StreamEnd {
  kGoodbye,    // the sender closed on purpose
  kClosed,     // the bytes ended, possibly mid-frame
  kMalformed,  // a bad hello or frame header; `why` says what
  kStopped,    // the callback returned false
};

// Called with each message read; returns false to stop reading.
using FrameCallback = std::function<bool(MessageKey key, std::string data)>;

// Reads the hello and then frames from `source`, calling `on_message` for
// each. Returns how the stream ended; `why` (if not null) gets a reason for
// kMalformed. When `buffers` (if not null) keeps a buffer of a payload's
// size, the payload is read into it at once (the announced size then costs
// nothing beyond what was kept); other payloads are read in steps as above.
// Reads and checks the hello. Returns nullopt when it is right; kClosed
// when the bytes ended first; kMalformed (with `why`, if not null) when it
// is not the hello.
std::optional<StreamEnd> ReadHello(ByteSource& source,
                                   std::string* why = nullptr);

// Reads one frame; its message goes to `*key` and `*data`. Returns nullopt
// when a message was read; kGoodbye, kClosed, or kMalformed (with `why`)
// otherwise. `buffers` as for ReadFrameStream().
std::optional<StreamEnd> ReadFrame(ByteSource& source, MessageKey* key,
                                   std::string* data, std::string* why,
                                   PayloadBuffers* buffers);

StreamEnd ReadFrameStream(ByteSource& source, const FrameCallback& on_message,
                          std::string* why = nullptr,
                          PayloadBuffers* buffers = nullptr);

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_DATAPLANE_FRAME_READER_H_
