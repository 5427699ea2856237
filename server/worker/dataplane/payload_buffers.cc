#include "server/worker/dataplane/payload_buffers.h"

#include <utility>

namespace chorus {

bool PayloadBuffers::Take(size_t size, std::string* out) {
  if (size < kMinPooledBytes) return false;
  absl::MutexLock lock(&mu_);
  auto it = kept_.find(size);
  if (it == kept_.end() || it->second.buffers.empty()) return false;
  *out = std::move(it->second.buffers.back());
  it->second.buffers.pop_back();
  it->second.used = ++tick_;
  // Sizes seen once (the last chunk of a block) leave no entry behind.
  if (it->second.buffers.empty()) kept_.erase(it);
  kept_bytes_ -= size;
  return true;
}

void PayloadBuffers::Give(std::string buffer) {
  const size_t size = buffer.size();
  if (size < kMinPooledBytes || size > kMaxPooledBytes) return;
  // Freed after the lock is released, as `buffer` is when not kept.
  std::vector<std::string> evicted;
  absl::MutexLock lock(&mu_);
  auto found = kept_.find(size);
  if (found != kept_.end() && found->second.buffers.size() >= kMaxPerSize) {
    found->second.used = ++tick_;
    return;
  }
  while (kept_bytes_ + size > kMaxPooledBytes) {
    if (!EvictStalestLocked(size, &evicted)) return;
  }
  SameSize& same = kept_[size];
  same.buffers.push_back(std::move(buffer));
  same.used = ++tick_;
  kept_bytes_ += size;
}

bool PayloadBuffers::EvictStalestLocked(size_t keep,
                                        std::vector<std::string>* evicted) {
  auto stalest = kept_.end();
  for (auto it = kept_.begin(); it != kept_.end(); ++it) {
    if (it->first == keep) continue;
    if (stalest == kept_.end() || it->second.used < stalest->second.used) {
      stalest = it;
    }
  }
  if (stalest == kept_.end()) return false;
  kept_bytes_ -= stalest->first;
  evicted->push_back(std::move(stalest->second.buffers.back()));
  stalest->second.buffers.pop_back();
  if (stalest->second.buffers.empty()) kept_.erase(stalest);
  return true;
}

size_t PayloadBuffers::kept_bytes() const {
  absl::MutexLock lock(&mu_);
  return kept_bytes_;
}

}  // namespace chorus
