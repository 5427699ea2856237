#include "client/python/embedded/embedded_worker.h"

#include <atomic>
#include <utility>

#include "client/python/embedded/tls_admission.h"

namespace chorus {
namespace {

// Forks this process is down from the one that loaded the module: each
// fork's child adds one (pthread_atfork), so that telling a fork apart
// costs no system call per collective.
std::atomic<uint64_t> forks_below{0};

}  // namespace

void CountFork() { forks_below.fetch_add(1, std::memory_order_relaxed); }

EmbeddedWorker::EmbeddedWorker()
    : owner_(forks_below.load(std::memory_order_relaxed)) {}

EmbeddedWorker::~EmbeddedWorker() = default;

absl::StatusOr<std::unique_ptr<EmbeddedWorker>> EmbeddedWorker::Start(
    LocalWorkerOptions options, const std::string& tls_dir, int emulated_gpus) {
  std::unique_ptr<EmbeddedWorker> embedded(new EmbeddedWorker());
  if (emulated_gpus > 0) {
    embedded->emulated_ =
        std::make_shared<EmulatedDeviceRuntime>(emulated_gpus);
    options.runtime.device_runtime = embedded->emulated_.get();
  }
  absl::Status admitted = AdmitWorker(tls_dir, &options.runtime.name);
  if (!admitted.ok()) return admitted;
  absl::StatusOr<std::unique_ptr<LocalWorker>> started =
      LocalWorker::Start(std::move(options));
  if (!started.ok()) {
    WorkerGone();
    return started.status();
  }
  embedded->worker_ = *std::move(started);
  return embedded;
}

bool EmbeddedWorker::OwnedHere() const {
  return forks_below.load(std::memory_order_relaxed) == owner_;
}

bool EmbeddedWorker::AddQueue(std::shared_ptr<ReplyQueue> queue) {
  absl::MutexLock lock(&mu_);
  if (closed_) return false;
  queues_.push_back(std::move(queue));
  return true;
}

void EmbeddedWorker::Close() {
  std::vector<std::weak_ptr<ReplyQueue>> queues;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    queues.swap(queues_);
  }
  worker_->Shutdown();
  WorkerGone();
  for (const std::weak_ptr<ReplyQueue>& weak : queues) {
    if (std::shared_ptr<ReplyQueue> queue = weak.lock()) queue->Close();
  }
}

}  // namespace chorus
