#include "server/worker/dataplane/wire_frame.h"

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/little_endian.h"

namespace chorus {
namespace {

constexpr char kMagic[4] = {'C', 'H', 'R', 'S'};
constexpr uint16_t kVersion = 1;

}  // namespace

absl::StatusOr<std::string> EncodeFrameHeader(const MessageKey& key,
                                              uint64_t payload_bytes) {
  if (key.group.size() > kMaxFrameGroupBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group name of ", key.group.size(),
        " bytes is over the data-plane limit of ", kMaxFrameGroupBytes));
  }
  if (payload_bytes > kMaxFramePayloadBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("data-plane message of ", payload_bytes,
                     " bytes is over the limit of ", kMaxFramePayloadBytes));
  }
  if (key.from_rank < 0 || key.to_rank < 0) {
    return absl::InvalidArgumentError("negative rank in a data-plane message");
  }
  std::string out(kFrameHeaderBytes + key.group.size(), '\0');
  char* p = out.data();
  std::copy(kMagic, kMagic + 4, p);
  StoreLittleEndian(kVersion, 2, p + 4);
  StoreLittleEndian(key.group.size(), 2, p + 6);
  StoreLittleEndian(key.epoch, 8, p + 8);
  StoreLittleEndian(key.sequence, 8, p + 16);
  StoreLittleEndian(static_cast<uint32_t>(key.from_rank), 4, p + 24);
  StoreLittleEndian(static_cast<uint32_t>(key.to_rank), 4, p + 28);
  StoreLittleEndian(key.tag, 4, p + 32);
  StoreLittleEndian(payload_bytes, 8, p + 40);
  std::copy(key.group.begin(), key.group.end(), p + kFrameHeaderBytes);
  return out;
}

std::string EncodeGoodbyeFrame() {
  std::string out(kFrameHeaderBytes, '\0');
  std::copy(kMagic, kMagic + 4, out.data());
  StoreLittleEndian(kVersion, 2, out.data() + 4);
  StoreLittleEndian(kFrameGoodbye, 4, out.data() + 36);
  return out;
}

absl::StatusOr<FrameHeader> DecodeFrameHeader(absl::string_view header) {
  if (header.size() != kFrameHeaderBytes) {
    return absl::InvalidArgumentError("truncated data-plane frame header");
  }
  const char* p = header.data();
  if (!std::equal(kMagic, kMagic + 4, p)) {
    return absl::InvalidArgumentError("not a data-plane frame (bad magic)");
  }
  const uint64_t version = LoadLittleEndian(p + 4, 2);
  if (version != kVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("data-plane frame version ", version,
                     " is not supported (this worker speaks ", kVersion, ")"));
  }
  const uint64_t flags = LoadLittleEndian(p + 36, 4);
  if ((flags & ~uint64_t{kFrameGoodbye}) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data-plane frame with unknown flags ", flags));
  }
  FrameHeader out;
  out.goodbye = flags == kFrameGoodbye;
  out.group_bytes = LoadLittleEndian(p + 6, 2);
  out.payload_bytes = LoadLittleEndian(p + 40, 8);
  if (out.goodbye && (out.group_bytes != 0 || out.payload_bytes != 0)) {
    return absl::InvalidArgumentError(
        "data-plane goodbye frame with a group or payload");
  }
  if (out.group_bytes > kMaxFrameGroupBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("data-plane frame group name of ", out.group_bytes,
                     " bytes is over the limit of ", kMaxFrameGroupBytes));
  }
  if (out.payload_bytes > kMaxFramePayloadBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("data-plane frame payload of ", out.payload_bytes,
                     " bytes is over the limit of ", kMaxFramePayloadBytes));
  }
  const uint64_t from = LoadLittleEndian(p + 24, 4);
  const uint64_t to = LoadLittleEndian(p + 28, 4);
  if (from > INT32_MAX || to > INT32_MAX) {
    return absl::InvalidArgumentError("negative rank in a data-plane frame");
  }
  out.key.epoch = LoadLittleEndian(p + 8, 8);
  out.key.sequence = LoadLittleEndian(p + 16, 8);
  out.key.from_rank = static_cast<int>(from);
  out.key.to_rank = static_cast<int>(to);
  out.key.tag = static_cast<uint32_t>(LoadLittleEndian(p + 32, 4));
  return out;
}

}  // namespace chorus
