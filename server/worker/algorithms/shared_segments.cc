#include "server/worker/algorithms/shared_segments.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"

namespace chorus {
namespace {

// The header: the segment's id, then its stage.
constexpr uint64_t kHeaderBytes = 64;
constexpr uint64_t kStageOffset = 8;
constexpr uint64_t kFingerprintOffset = 16;
// Segment sizes are rounded up to this, so slightly different sizes share.
constexpr uint64_t kGranule = 2 << 20;
// Free segments and unused peer mappings kept for reuse.
constexpr size_t kFreeSegments = 4;
constexpr size_t kIdleMappings = 16;

std::string Errno() { return std::strerror(errno); }

// The stage word in the header of a segment mapped at `base`.
const std::atomic<uint64_t>* StageOf(const char* base) {
  return reinterpret_cast<const std::atomic<uint64_t>*>(base + kStageOffset);
}

// The fingerprint words of a segment mapped at `base`.
std::atomic<uint64_t>* FingerprintOf(char* base) {
  return reinterpret_cast<std::atomic<uint64_t>*>(base + kFingerprintOffset);
}

}  // namespace

SharedSegments& SharedSegments::Get() {
  static SharedSegments* segments = new SharedSegments();
  return *segments;
}

SharedSegments::Own SharedSegments::LeaseOf(Segment& segment) {
  return Own{segment.id,
             segment.memory->fd(),
             segment.memory->data() + kHeaderBytes,
             segment.memory->bytes() - kHeaderBytes,
             ++segment.tickets,
             reinterpret_cast<std::atomic<uint64_t>*>(segment.memory->data() +
                                                      kStageOffset),
             FingerprintOf(segment.memory->data())};
}

void SharedSegments::UnmapMapping(const Mapping& mapping) {
  munmap(const_cast<char*>(mapping.base), kHeaderBytes + mapping.capacity);
}

absl::StatusOr<SharedSegments::Own> SharedSegments::Acquire(uint64_t bytes) {
  {
    absl::MutexLock lock(&mu_);
    auto fits = std::find_if(free_.begin(), free_.end(), [&](const Segment& s) {
      return s.memory->bytes() - kHeaderBytes >= bytes;
    });
    if (fits != free_.end()) {
      leased_.push_back(std::move(*fits));
      free_.erase(fits);
      return LeaseOf(leased_.back());
    }
  }
  const uint64_t capacity = std::max<uint64_t>(
      kGranule, (bytes + kGranule - 1) / kGranule * kGranule);
  absl::StatusOr<std::unique_ptr<MemfdRegion>> memory =
      MemfdRegion::Create("chorus-same-host", kHeaderBytes + capacity);
  if (!memory.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot make a shared segment of ", capacity,
                     " bytes: ", memory.status().message()));
  }
  Segment segment;
  segment.memory = *std::move(memory);
  absl::BitGen gen;
  segment.id = absl::Uniform<uint64_t>(gen) | 1;
  std::memcpy(segment.memory->data(), &segment.id, sizeof(segment.id));
  absl::MutexLock lock(&mu_);
  leased_.push_back(std::move(segment));
  return LeaseOf(leased_.back());
}

void SharedSegments::Release(const Own& own) {
  Segment dropped;  // unmapped and closed outside the lock
  absl::MutexLock lock(&mu_);
  auto it = std::find_if(leased_.begin(), leased_.end(),
                         [&](const Segment& s) { return s.id == own.id; });
  if (it == leased_.end()) return;
  free_.insert(free_.begin(), std::move(*it));
  leased_.erase(it);
  if (free_.size() <= kFreeSegments) return;
  dropped = std::move(free_.back());
  free_.pop_back();
}

void SharedSegments::Discard(const Own& own) {
  Segment dropped;  // unmapped and closed outside the lock
  absl::MutexLock lock(&mu_);
  auto it = std::find_if(leased_.begin(), leased_.end(),
                         [&](const Segment& s) { return s.id == own.id; });
  if (it == leased_.end()) return;
  dropped = std::move(*it);
  leased_.erase(it);
}

absl::StatusOr<SharedSegments::Peer> SharedSegments::MapPeer(uint64_t pid,
                                                             int fd,
                                                             uint64_t id,
                                                             uint64_t bytes) {
  {
    absl::MutexLock lock(&mu_);
    for (auto it = mappings_.begin(); it != mappings_.end(); ++it) {
      if (it->pid != pid || it->id != id || it->capacity < bytes) continue;
      ++it->users;
      mappings_.splice(mappings_.begin(), mappings_, it);
      return Peer{it->base + kHeaderBytes, it->capacity, &*it,
                  StageOf(it->base),
                  FingerprintOf(const_cast<char*>(it->base))};
    }
  }
  const std::string path = absl::StrCat("/proc/", pid, "/fd/", fd);
  const int opened = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (opened < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot open ", path, ": ", Errno()));
  }
  const off_t size = lseek(opened, 0, SEEK_END);
  if (size < 0 || static_cast<uint64_t>(size) < kHeaderBytes + bytes) {
    close(opened);
    return absl::UnavailableError(
        absl::StrCat(path, " is not a shared segment of ", bytes, " bytes"));
  }
  void* base = mmap(nullptr, size, PROT_READ, MAP_SHARED, opened, 0);
  close(opened);
  if (base == MAP_FAILED) {
    return absl::UnavailableError(
        absl::StrCat("cannot map ", path, ": ", Errno()));
  }
  uint64_t seen = 0;
  std::memcpy(&seen, base, sizeof(seen));
  if (seen != id) {
    munmap(base, size);
    return absl::UnavailableError(
        absl::StrCat(path, " is not the segment its owner named"));
  }
  Mapping mapping{pid, id, static_cast<const char*>(base),
                  static_cast<uint64_t>(size) - kHeaderBytes, 1};
  std::vector<Mapping> dropped;
  Peer peer;
  {
    absl::MutexLock lock(&mu_);
    mappings_.push_front(mapping);
    peer = Peer{mapping.base + kHeaderBytes, mapping.capacity,
                &mappings_.front(), StageOf(mapping.base),
                FingerprintOf(const_cast<char*>(mapping.base))};
    size_t idle = 0;
    for (auto it = mappings_.begin(); it != mappings_.end();) {
      if (it->users == 0 && ++idle > kIdleMappings) {
        dropped.push_back(*it);
        it = mappings_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const Mapping& m : dropped) UnmapMapping(m);
  return peer;
}

void SharedSegments::Unmap(const Peer& peer) {
  absl::MutexLock lock(&mu_);
  static_cast<Mapping*>(peer.handle)->users--;
}

}  // namespace chorus
