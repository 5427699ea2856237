// MemfdRegion: shared memory another process on the host can map. It is
// one memfd (an anonymous file that lives in memory) of a fixed size,
// sealed so that its size can no longer change, mapped read-write here.
// Another process maps the same pages by opening /proc/<pid>/fd/<fd>
// (which needs the permission process_vm_readv needs), so it can never
// have its mapping cut short under it by a truncate. Memory is used only as
// it is written.
//
// Used by the worker's shared regions (local/shared_regions.h: memory an
// application and its worker daemon both map) and by the same_host plan's
// segments (algorithms/shared_segments.h: memory the ranks of one host
// read from each other).
//
// Lifecycle: Create() makes and maps it; the destructor unmaps it and
// closes the memfd (a process that opened it keeps its own mapping).
// Thread safety: its accessors are thread-safe; its bytes are the callers'
// to order.
#ifndef CHORUS_COMMON_MEMFD_REGION_H_
#define CHORUS_COMMON_MEMFD_REGION_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace chorus {

class MemfdRegion {
 public:
  // Makes a memfd named `name` (what /proc/<pid>/fd/<fd> shows, as
  // "/memfd:<name>") of `bytes`, seals its size and maps it. Returns the
  // region, or RESOURCE_EXHAUSTED when the system refuses (0 bytes
  // included), whose message names the step that failed and errno's words
  // ("memfd_create failed: ...", "sizing and sealing the memfd failed:
  // ...", "mmap failed: ...").
  static absl::StatusOr<std::unique_ptr<MemfdRegion>> Create(
      const std::string& name, uint64_t bytes);
  ~MemfdRegion();
  MemfdRegion(const MemfdRegion&) = delete;
  MemfdRegion& operator=(const MemfdRegion&) = delete;

  uint64_t bytes() const { return bytes_; }
  // The memfd: open while the region lives.
  int fd() const { return fd_; }
  const std::string& name() const { return name_; }
  // The mapping of all bytes().
  char* data() const { return data_; }

  // Returns `bytes` of the region from `offset`, or nullopt when they go
  // past its end (overflowing sums included).
  std::optional<absl::Span<char>> Range(uint64_t offset, uint64_t bytes) const;

 private:
  MemfdRegion(std::string name, uint64_t bytes, int fd, char* data);

  const std::string name_;
  const uint64_t bytes_;
  const int fd_;
  char* const data_;
};

}  // namespace chorus

#endif  // CHORUS_COMMON_MEMFD_REGION_H_
