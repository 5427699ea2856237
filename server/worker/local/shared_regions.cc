#include "server/worker/local/shared_regions.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace chorus {
namespace {

// "chorus-" and 32 hex digits from the kernel's random source: a client
// that finds this name behind /proc/<pid>/fd/<fd> has found this region.
absl::StatusOr<std::string> RandomName() {
  char random[16];
  size_t got = 0;
  while (got < sizeof(random)) {
    const ssize_t n = getrandom(random + got, sizeof(random) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::InternalError(
          absl::StrCat("getrandom failed: ", std::strerror(errno)));
    }
    got += static_cast<size_t>(n);
  }
  return absl::StrCat("chorus-", absl::BytesToHexString(absl::string_view(
                                     random, sizeof(random))));
}

}  // namespace

absl::StatusOr<std::shared_ptr<SharedRegion>> SharedRegion::Create(
    uint64_t id, uint64_t bytes) {
  absl::StatusOr<std::string> name = RandomName();
  if (!name.ok()) return name.status();
  absl::StatusOr<std::unique_ptr<MemfdRegion>> memory =
      MemfdRegion::Create(*name, bytes);
  if (!memory.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot make a shared region of ", bytes,
                     " bytes: ", memory.status().message()));
  }
  return std::shared_ptr<SharedRegion>(
      new SharedRegion(id, *std::move(memory)));
}

SharedRegion::SharedRegion(uint64_t id, std::unique_ptr<MemfdRegion> memory)
    : id_(id), memory_(std::move(memory)) {}

SharedRegion::~SharedRegion() = default;

absl::StatusOr<absl::Span<char>> SharedRegion::Range(uint64_t offset,
                                                     uint64_t bytes,
                                                     const char* what) const {
  std::optional<absl::Span<char>> range = memory_->Range(offset, bytes);
  if (!range.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " (", bytes, " bytes at offset ", offset,
                     ") goes past the end of shared region ", id_, " of ",
                     memory_->bytes(), " bytes"));
  }
  return *range;
}

std::string SharedRegion::TakeScratch() {
  absl::MutexLock lock(&mu_);
  return std::move(scratch_);
}

void SharedRegion::GiveScratch(std::string scratch) {
  absl::MutexLock lock(&mu_);
  if (scratch.capacity() > scratch_.capacity()) scratch_ = std::move(scratch);
}

absl::StatusOr<std::shared_ptr<SharedRegion>> SharedRegions::Open(
    const std::string& group, int rank, uint64_t epoch, uint64_t bytes) {
  if (max_bytes_ == 0) {
    return absl::UnimplementedError(
        "this worker shares no memory with applications "
        "(--max_shared_bytes=0): use Collective or CollectiveChunked");
  }
  if (bytes == 0) {
    return absl::InvalidArgumentError("a shared region needs at least 1 byte");
  }
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    if (bytes > max_bytes_ - held_bytes_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("a shared region of ", bytes,
                       " bytes would put this worker over "
                       "its limit of ",
                       max_bytes_,
                       " bytes of shared regions "
                       "(--max_shared_bytes); it holds ",
                       held_bytes_));
    }
    // Counted now, so that regions made at once cannot pass the bound.
    held_bytes_ += bytes;
    id = next_id_++;
  }
  absl::StatusOr<std::shared_ptr<SharedRegion>> made =
      SharedRegion::Create(id, bytes);
  absl::MutexLock lock(&mu_);
  if (!made.ok()) {
    held_bytes_ -= bytes;
    return made.status();
  }
  regions_[Key(group, rank, epoch, id)] = *made;
  return made;
}

absl::StatusOr<std::shared_ptr<SharedRegion>> SharedRegions::Find(
    const std::string& group, int rank, uint64_t epoch, uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(Key(group, rank, epoch, id));
  if (it == regions_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, " of group ", group, " holds no shared region ", id,
        " (OpenSharedRegion makes one; it ends with ReleaseSharedRegion or "
        "when the rank leaves)"));
  }
  return it->second;
}

absl::Status SharedRegions::Release(const std::string& group, int rank,
                                    uint64_t epoch, uint64_t id) {
  std::shared_ptr<SharedRegion> released;  // unmapped outside the lock
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(Key(group, rank, epoch, id));
  if (it == regions_.end()) {
    return absl::NotFoundError(absl::StrCat("rank ", rank, " of group ", group,
                                            " holds no shared region ", id));
  }
  held_bytes_ -= it->second->bytes();
  released = std::move(it->second);
  regions_.erase(it);
  return absl::OkStatus();
}

void SharedRegions::Forget(const std::string& group, int rank, uint64_t epoch) {
  std::map<Key, std::shared_ptr<SharedRegion>> forgotten;
  absl::MutexLock lock(&mu_);
  auto it = regions_.lower_bound(Key(group, rank, epoch, 0));
  while (it != regions_.end() && std::get<0>(it->first) == group &&
         std::get<1>(it->first) == rank && std::get<2>(it->first) == epoch) {
    held_bytes_ -= it->second->bytes();
    forgotten.insert(regions_.extract(it++));
  }
}

uint64_t SharedRegions::HeldBytes() const {
  absl::MutexLock lock(&mu_);
  return held_bytes_;
}

}  // namespace chorus
