// LeaseSweeper: a background thread that evicts workers from a Registry as
// soon as their leases expire, and reports each eviction.
//
// Lifecycle: Start() once; the destructor (or Stop()) stops and joins the
// thread. The thread waits on a condition with a deadline; it never spins.
// Thread safety: Start/Stop from one thread. The registry is not owned.
#ifndef CHORUS_SERVER_COORDINATOR_LEASE_SWEEPER_H_
#define CHORUS_SERVER_COORDINATOR_LEASE_SWEEPER_H_

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/coordinator/registry.h"

namespace chorus {

class LeaseSweeper {
 public:
  using EvictionCallback = std::function<void(const WorkerRecord&)>;

  // `registry` is not owned. `on_evict` runs on the sweeper thread, without
  // locks held, once per evicted worker.
  LeaseSweeper(Registry* registry, EvictionCallback on_evict);
  ~LeaseSweeper();

  LeaseSweeper(const LeaseSweeper&) = delete;
  LeaseSweeper& operator=(const LeaseSweeper&) = delete;

  void Start();
  // Stops and joins the thread; idempotent.
  void Stop();

 private:
  void Run();

  Registry* const registry_;  // not owned
  const EvictionCallback on_evict_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_LEASE_SWEEPER_H_
