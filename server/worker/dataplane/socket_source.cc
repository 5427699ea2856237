#include "server/worker/dataplane/socket_source.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/status/statusor.h"
#include "common/tcp_socket.h"
#include "common/tls_stream.h"
#include "server/worker/dataplane/wire_frame.h"

namespace chorus {

bool SocketSource::Read(char* out, size_t size) {
  if (tls_ != nullptr) return tls_->ReadFull(out, size);  // buffers itself
  const size_t buffered = std::min(size, end_ - begin_);
  std::memcpy(out, buffer_.data() + begin_, buffered);
  begin_ += buffered;
  out += buffered;
  size -= buffered;
  if (size == 0) return true;
  // A large payload goes straight to where it belongs.
  if (size >= kBufferBytes / 2) return ReadFull(fd_, out, size);
  begin_ = 0;
  end_ = 0;
  while (end_ < size) {
    const ssize_t n = recv(fd_, buffer_.data() + end_, kBufferBytes - end_, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    end_ += static_cast<size_t>(n);
  }
  std::memcpy(out, buffer_.data(), size);
  begin_ = size;
  return true;
}

bool SocketSource::HasBuffered() const {
  return tls_ != nullptr || begin_ < end_;
}

SocketSource::Intake SocketSource::ReceiveWholeFrame() {
  if (HasBuffered()) return Intake::kLeftToReader;
  char header[kFrameHeaderBytes];
  const ssize_t peeked =
      recv(fd_, header, sizeof(header), MSG_PEEK | MSG_DONTWAIT);
  if (peeked < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    return Intake::kNothingYet;
  }
  // The end of the stream, an error: the reader's to handle.
  if (peeked <= 0) return Intake::kLeftToReader;
  if (peeked < static_cast<ssize_t>(sizeof(header))) {
    return Intake::kNothingYet;
  }
  absl::StatusOr<FrameHeader> frame =
      DecodeFrameHeader(absl::string_view(header, sizeof(header)));
  // A goodbye, a malformed or a large frame is the reader's too.
  if (!frame.ok() || frame->goodbye) return Intake::kLeftToReader;
  const uint64_t whole =
      kFrameHeaderBytes + frame->group_bytes + frame->payload_bytes;
  if (whole > kBufferBytes) return Intake::kLeftToReader;
  begin_ = 0;
  end_ = 0;
  while (end_ < whole) {
    const ssize_t n =
        recv(fd_, buffer_.data() + end_, whole - end_, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the rest has not come yet, or the end did
    end_ += static_cast<size_t>(n);
  }
  return end_ == whole ? Intake::kWholeFrame : Intake::kLeftToReader;
}

}  // namespace chorus
