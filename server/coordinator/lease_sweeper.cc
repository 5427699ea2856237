#include "server/coordinator/lease_sweeper.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"

namespace chorus {

LeaseSweeper::LeaseSweeper(Registry* registry, EvictionCallback on_evict)
    : registry_(registry), on_evict_(std::move(on_evict)) {}

LeaseSweeper::~LeaseSweeper() { Stop(); }

void LeaseSweeper::Start() {
  thread_ = std::thread([this] { Run(); });
}

void LeaseSweeper::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void LeaseSweeper::Run() {
  while (true) {
    // Wake just after the earliest lease can expire; with no workers, check
    // again after one lease period (a worker registered meanwhile expires no
    // earlier than that).
    const absl::Time wake =
        std::min(registry_->NextExpiry() + absl::Milliseconds(1),
                 absl::Now() + registry_->lease_timeout());
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithDeadline(absl::Condition(&stopping_), wake);
      if (stopping_) return;
    }
    for (const WorkerRecord& record : registry_->EvictExpired()) {
      on_evict_(record);
    }
  }
}

}  // namespace chorus
