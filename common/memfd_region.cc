#include "common/memfd_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace chorus {
namespace {

// RESOURCE_EXHAUSTED: `step` failed, with errno's words.
absl::Status Refused(const char* step) {
  return absl::ResourceExhaustedError(
      absl::StrCat(step, " failed: ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<MemfdRegion>> MemfdRegion::Create(
    const std::string& name, uint64_t bytes) {
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Refused("memfd_create");
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const absl::Status refused = Refused("sizing and sealing the memfd");
    close(fd);
    return refused;
  }
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    const absl::Status refused = Refused("mmap");
    close(fd);
    return refused;
  }
  return std::unique_ptr<MemfdRegion>(
      new MemfdRegion(name, bytes, fd, static_cast<char*>(data)));
}

MemfdRegion::MemfdRegion(std::string name, uint64_t bytes, int fd, char* data)
    : name_(std::move(name)), bytes_(bytes), fd_(fd), data_(data) {}

MemfdRegion::~MemfdRegion() {
  munmap(data_, bytes_);
  close(fd_);
}

std::optional<absl::Span<char>> MemfdRegion::Range(uint64_t offset,
                                                   uint64_t bytes) const {
  if (offset > bytes_ || bytes > bytes_ - offset) return std::nullopt;
  return absl::Span<char>(data_ + offset, bytes);
}

}  // namespace chorus
