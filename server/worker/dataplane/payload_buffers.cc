#include "server/worker/dataplane/payload_buffers.h"

#include <utility>

namespace chorus {

bool PayloadBuffers::Take(size_t size, std::string* out) {
  if (size < kMinPooledBytes) return false;
  absl::MutexLock lock(&mu_);
  auto it = kept_.find(size);
  if (it == kept_.end() || it->second.empty()) return false;
  *out = std::move(it->second.back());
  it->second.pop_back();
  // Sizes seen once (the last chunk of a block) leave no entry behind.
  if (it->second.empty()) kept_.erase(it);
  kept_bytes_ -= size;
  return true;
}

void PayloadBuffers::Give(std::string buffer) {
  const size_t size = buffer.size();
  if (size < kMinPooledBytes) return;
  absl::MutexLock lock(&mu_);
  if (kept_bytes_ + size > kMaxPooledBytes) return;
  std::vector<std::string>& same = kept_[size];
  if (same.size() >= kMaxPerSize) return;
  same.push_back(std::move(buffer));
  kept_bytes_ += size;
}

size_t PayloadBuffers::kept_bytes() const {
  absl::MutexLock lock(&mu_);
  return kept_bytes_;
}

}  // namespace chorus
