// SocketSource: the bytes of one data-plane connection, for ReadFrame()
// (frame_reader.h): through TLS when the connection has it, else from the
// socket through a 64 KiB buffer, so that a small frame's header, group and
// payload cost one receive, and a large payload goes straight to where it
// belongs.
//
// Besides the blocking reads of the connection's own thread, a plaintext
// source can take in a whole small frame without blocking
// (ReceiveWholeFrame), for a rank's thread that waits for that frame and
// reads it itself rather than waiting for the connection's thread to wake.
//
// Lifecycle: one per connection, used while its socket is open.
// Thread safety: thread-compatible (TcpListener holds the connection's read
// lock around every use).
#ifndef CHORUS_SERVER_WORKER_DATAPLANE_SOCKET_SOURCE_H_
#define CHORUS_SERVER_WORKER_DATAPLANE_SOCKET_SOURCE_H_

#include <cstddef>
#include <vector>

#include "server/worker/dataplane/frame_reader.h"

namespace chorus {

class TlsStream;

class SocketSource final : public ByteSource {
 public:
  static constexpr size_t kBufferBytes = 64 << 10;

  // Reads `fd`, through `tls` when not null (both not owned).
  SocketSource(int fd, TlsStream* tls) : fd_(fd), tls_(tls) {}

  // Blocks until `size` bytes were read into `out`; false when the
  // connection ended or failed first.
  bool Read(char* out, size_t size) override;

  // Returns whether bytes were received and not yet read; with TLS, always
  // true (its own buffer is not visible here, so a read may not wait for
  // the socket first).
  bool HasBuffered() const;

  enum class Intake {
    kWholeFrame,   // a whole frame is buffered: Read() returns it at once
    kNothingYet,   // not even a frame's header has come
    kLeftToReader  // the next bytes are for a blocking reader to read
  };

  // Without blocking, and only without TLS and with nothing buffered: when
  // the socket holds the start of a well-formed frame that is not a goodbye
  // and fits the buffer, receives that frame. Bytes of a frame that came
  // only in part stay buffered (kLeftToReader; HasBuffered() says so).
  Intake ReceiveWholeFrame();

 private:
  const int fd_;
  TlsStream* const tls_;
  // Bytes received and not yet read: buffer_[begin_, end_).
  std::vector<char> buffer_ = std::vector<char>(kBufferBytes);
  size_t begin_ = 0;
  size_t end_ = 0;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_DATAPLANE_SOCKET_SOURCE_H_
