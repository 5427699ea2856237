#include "common/call_frame.h"

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace chorus {

void AppendCallFrame(absl::string_view payload, std::string* out) {
  const uint32_t size = static_cast<uint32_t>(payload.size());
  char header[kCallFrameHeaderBytes];
  for (size_t i = 0; i < kCallFrameHeaderBytes; ++i) {
    header[i] = static_cast<char>((size >> (8 * i)) & 0xff);
  }
  out->append(header, kCallFrameHeaderBytes);
  out->append(payload.data(), payload.size());
}

absl::StatusOr<bool> CallFrameParser::Next(std::string* payload) {
  if (!failed_.ok()) return failed_;
  if (buffered() < kCallFrameHeaderBytes) return false;
  const unsigned char* header =
      reinterpret_cast<const unsigned char*>(buffer_.data() + consumed_);
  uint64_t size = 0;
  for (size_t i = 0; i < kCallFrameHeaderBytes; ++i) {
    size |= static_cast<uint64_t>(header[i]) << (8 * i);
  }
  if (size > max_payload_bytes_) {
    failed_ = absl::ResourceExhaustedError(
        absl::StrCat("a call frame of ", size, " bytes is over the limit of ",
                     max_payload_bytes_));
    return failed_;
  }
  if (buffered() < kCallFrameHeaderBytes + size) return false;
  payload->assign(buffer_, consumed_ + kCallFrameHeaderBytes, size);
  consumed_ += kCallFrameHeaderBytes + size;
  // Drop what was handed out once it is most of the buffer.
  if (consumed_ > 4096 && consumed_ * 2 > buffer_.size()) {
    buffer_.erase(0, consumed_);
    consumed_ = 0;
  }
  return true;
}

}  // namespace chorus
