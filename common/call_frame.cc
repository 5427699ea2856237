#include "common/call_frame.h"

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/little_endian.h"

namespace chorus {

void AppendCallFrame(absl::string_view payload, std::string* out) {
  const uint32_t size = static_cast<uint32_t>(payload.size());
  char header[kCallFrameHeaderBytes];
  StoreLittleEndian(size, kCallFrameHeaderBytes, header);
  out->append(header, kCallFrameHeaderBytes);
  out->append(payload.data(), payload.size());
}

absl::StatusOr<bool> CallFrameParser::Next(std::string* payload) {
  if (!failed_.ok()) return failed_;
  if (buffered() < kCallFrameHeaderBytes) return false;
  const uint64_t size =
      LoadLittleEndian(buffer_.data() + consumed_, kCallFrameHeaderBytes);
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
