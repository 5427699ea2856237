#include "server/worker/algorithms/scratch.h"

#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace chorus {
namespace {

struct Pool {
  absl::Mutex mu;
  std::vector<std::unique_ptr<std::string>> idle ABSL_GUARDED_BY(mu);
};

Pool& GetPool() {
  static Pool* pool = new Pool();
  return *pool;
}

}  // namespace

Scratch::Scratch() {
  Pool& pool = GetPool();
  absl::MutexLock lock(&pool.mu);
  if (!pool.idle.empty()) {
    buffer_ = std::move(pool.idle.back());
    pool.idle.pop_back();
  }
  if (buffer_ == nullptr) buffer_ = std::make_unique<std::string>();
}

Scratch::~Scratch() {
  Pool& pool = GetPool();
  absl::MutexLock lock(&pool.mu);
  if (static_cast<int>(pool.idle.size()) < kMaxIdle) {
    pool.idle.push_back(std::move(buffer_));
  }
}

}  // namespace chorus
