// Shared memory between the ranks of one host for the same_host plan.
//
// A rank copies its input into a segment of its own (a sealed memfd,
// common/memfd_region.h) and tells its peers the segment's pid,
// descriptor and id; a peer maps it read-only through /proc/<pid>/fd/<fd> (the
// same permission process_vm_readv needs) and then reads it with plain loads.
// Each segment starts with a 64-byte header holding its id, which a peer checks
// after mapping, so a reused descriptor number or a process in another pid
// namespace is never mistaken for the segment it was told about, and its
// stage: a word only the owner writes, which grows with every step of every
// call that leases the segment, and which peers wait on (futex_word.h). Each
// lease has a ticket, larger than every earlier lease's, for the call to
// derive its stages from. After the stage the header holds three words of
// the owner's call (its fingerprint), which only the bound same_host path
// writes (same_host_binding.h).
//
// Segments and peer mappings are kept for reuse across calls: the first
// call of a size pays for the pages, later ones only copy.
//
// Lifecycle: one process-wide instance (Get()); segments live until the
// process exits or the cache drops them.
// Thread safety: thread-safe. A segment is used by one call at a time; a
// peer mapping stays valid while its call holds it.
#ifndef CHORUS_SERVER_WORKER_ALGORITHMS_SHARED_SEGMENTS_H_
#define CHORUS_SERVER_WORKER_ALGORITHMS_SHARED_SEGMENTS_H_

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/memfd_region.h"

namespace chorus {

class SharedSegments {
 public:
  // A segment of this process, leased to one call.
  struct Own {
    uint64_t id = 0;
    int fd = -1;
    char* data = nullptr;  // after the header
    uint64_t capacity = 0;
    uint64_t ticket = 0;  // this lease's
    std::atomic<uint64_t>* stage = nullptr;
    std::atomic<uint64_t>* fingerprint = nullptr;  // kFingerprintWords
  };
  // A peer's segment mapped here, leased to one call.
  struct Peer {
    const char* data = nullptr;  // after the header
    uint64_t capacity = 0;
    void* handle = nullptr;
    const std::atomic<uint64_t>* stage = nullptr;
    const std::atomic<uint64_t>* fingerprint = nullptr;  // kFingerprintWords
  };

  // Words of a segment's fingerprint.
  static constexpr int kFingerprintWords = 3;

  static SharedSegments& Get();

  // Leases a segment of at least `bytes`. Returns it, or RESOURCE_EXHAUSTED
  // when memory cannot be had.
  absl::StatusOr<Own> Acquire(uint64_t bytes);
  void Release(const Own& segment);
  // Ends a lease for good: the segment is never leased again (its stage and
  // fingerprint stay as they are for peers that still map it), and its
  // memory goes once no peer maps it.
  void Discard(const Own& segment);

  // Maps peer `pid`'s segment `fd` whose header holds `id` and which has
  // at least `bytes` after it. Returns UNAVAILABLE when it cannot be opened
  // or mapped, or its header holds another id.
  absl::StatusOr<Peer> MapPeer(uint64_t pid, int fd, uint64_t id,
                               uint64_t bytes);
  void Unmap(const Peer& peer);

 private:
  struct Segment {
    uint64_t id = 0;
    std::unique_ptr<MemfdRegion> memory;  // header and data
    uint64_t tickets = 0;                 // leases so far
  };
  struct Mapping {
    uint64_t pid = 0;
    uint64_t id = 0;
    const char* base = nullptr;
    uint64_t capacity = 0;
    int users = 0;
  };

  // Leases `segment` (its next ticket).
  static Own LeaseOf(Segment& segment);
  static void UnmapMapping(const Mapping& mapping);

  absl::Mutex mu_;
  std::vector<Segment> free_ ABSL_GUARDED_BY(mu_);
  std::vector<Segment> leased_ ABSL_GUARDED_BY(mu_);
  // Most recently used first.
  std::list<Mapping> mappings_ ABSL_GUARDED_BY(mu_);
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_ALGORITHMS_SHARED_SEGMENTS_H_
