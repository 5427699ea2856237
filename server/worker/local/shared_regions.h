// Shared memory between a worker daemon and the applications on its host
// (WorkerLocal.OpenSharedRegion): a SharedRegion is one sealed memfd
// (common/memfd_region.h) the daemon maps and an application maps
// too, by opening /proc/<pid>/fd/<fd>, so that a collective reads its input
// and writes its output in place instead of carrying them in gRPC messages.
// SharedRegions holds the regions of every joined rank, bounded in total
// bytes.
// Exists because: a Python rank's 64 MiB all_reduce through its daemon took
// 64.5 ms with its arrays in messages and 41.3 ms in shared memory, against
// 35.9 ms for embedded ranks (bench/README.md, "Python client next to
// embedded ranks").
//
// Lifecycle: a region is made by SharedRegions::Open and stays in the table
// until Release() or Forget() of its membership; calls that use it hold a
// shared_ptr, so it is unmapped only once the last of them ended.
// Thread safety: SharedRegion's accessors are thread-safe (its bytes are
// the callers' to order); all SharedRegions methods are thread-safe.
#ifndef CHORUS_SERVER_WORKER_LOCAL_SHARED_REGIONS_H_
#define CHORUS_SERVER_WORKER_LOCAL_SHARED_REGIONS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/memfd_region.h"

namespace chorus {

// The bytes of regions one daemon holds at once unless it says otherwise
// (--max_shared_bytes): 16 GiB. Memory is used only as it is written.
inline constexpr uint64_t kDefaultMaxSharedBytes = uint64_t{16} << 30;

class SharedRegion {
 public:
  // Makes a sealed memfd of `bytes` (its size can no longer change, so a
  // client cannot truncate it under the daemon) and maps it. Returns the
  // region, or RESOURCE_EXHAUSTED when the system refuses (errno's words).
  static absl::StatusOr<std::shared_ptr<SharedRegion>> Create(uint64_t id,
                                                              uint64_t bytes);
  ~SharedRegion();
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  uint64_t id() const { return id_; }
  uint64_t bytes() const { return memory_->bytes(); }
  int fd() const { return memory_->fd(); }
  // The memfd's name ("chorus-" and 32 random hex digits).
  const std::string& name() const { return memory_->name(); }

  // Returns `bytes` of the region from `offset`, or INVALID_ARGUMENT
  // (naming `what`, e.g. "shared_input") when they go past its end.
  absl::StatusOr<absl::Span<char>> Range(uint64_t offset, uint64_t bytes,
                                         const char* what) const;

  // A buffer for the output of a call that writes into this region,
  // reused from call to call so that a large output does not fault in
  // fresh memory each time; hand it back with GiveScratch().
  std::string TakeScratch();
  void GiveScratch(std::string scratch);

 private:
  SharedRegion(uint64_t id, std::unique_ptr<MemfdRegion> memory);

  const uint64_t id_;
  const std::unique_ptr<MemfdRegion> memory_;
  absl::Mutex mu_;
  std::string scratch_ ABSL_GUARDED_BY(mu_);
};

class SharedRegions {
 public:
  // `max_bytes` bounds the regions held at once; 0 turns them off.
  explicit SharedRegions(uint64_t max_bytes) : max_bytes_(max_bytes) {}

  // Makes a region of `bytes` for `rank` of `group` at `epoch`. Returns
  // it, or INVALID_ARGUMENT for 0 bytes, UNIMPLEMENTED when regions are
  // off, RESOURCE_EXHAUSTED over the bound or when the system refuses.
  absl::StatusOr<std::shared_ptr<SharedRegion>> Open(const std::string& group,
                                                     int rank, uint64_t epoch,
                                                     uint64_t bytes);

  // Returns region `id` of that rank, or FAILED_PRECONDITION when it holds
  // none of that number.
  absl::StatusOr<std::shared_ptr<SharedRegion>> Find(const std::string& group,
                                                     int rank, uint64_t epoch,
                                                     uint64_t id) const;

  // Drops region `id` of that rank from the table. Returns OK, or
  // NOT_FOUND when it holds none of that number.
  absl::Status Release(const std::string& group, int rank, uint64_t epoch,
                       uint64_t id);

  // Drops every region of that rank (it left).
  void Forget(const std::string& group, int rank, uint64_t epoch);

  // The bytes of regions in the table.
  uint64_t HeldBytes() const;

 private:
  using Key = std::tuple<std::string, int, uint64_t, uint64_t>;

  const uint64_t max_bytes_;
  mutable absl::Mutex mu_;
  // (group, rank, epoch, id) -> region.
  std::map<Key, std::shared_ptr<SharedRegion>> regions_ ABSL_GUARDED_BY(mu_);
  uint64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_LOCAL_SHARED_REGIONS_H_
