// CoordinatorSession: a worker's membership in the cluster. It registers the
// worker's devices with the coordinator, renews the lease with heartbeats,
// registers again on its own when the coordinator forgets the worker (for
// example after a coordinator restart), and deregisters on Shutdown().
//
// Lifecycle: construct, Start() once, then Shutdown() (also run by the
// destructor). Between them a background thread sends heartbeats; it waits
// on a condition with a deadline and never spins.
// Thread safety: RequestStop() and the accessors may be called from any
// thread; Start() and Shutdown() from the owning thread.
#ifndef CHORUS_SERVER_WORKER_COORDINATOR_SESSION_H_
#define CHORUS_SERVER_WORKER_COORDINATOR_SESSION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "server/common/device.h"

namespace chorus {

struct SessionOptions {
  // Coordinator address, "host:port".
  std::string coordinator;
  std::string name;
  std::string host;
  // Machine and network namespace (RegisterWorkerRequest.machine).
  std::string machine;
  // Where this worker serves its peers, "host:port", and the port of its
  // TCP data plane on that host.
  std::string address;
  uint32_t data_port = 0;
  std::vector<Device> devices;
  bool cuda_support = false;
  // Deadline of each call to the coordinator.
  absl::Duration rpc_timeout = absl::Seconds(5);
  // How long Start() keeps trying to reach the coordinator;
  // InfiniteDuration() keeps trying until RequestStop().
  absl::Duration register_timeout = absl::InfiniteDuration();
  // Pause between attempts while the coordinator is unreachable.
  absl::Duration retry_interval = absl::Milliseconds(500);
  // Runs on the heartbeat thread for each group epoch the coordinator
  // aborted that has a member on this worker.
  std::function<void(const std::string& group, uint64_t epoch,
                     const absl::Status& status)>
      on_group_aborted;
  // Runs on the heartbeat thread when the coordinator no longer knows this
  // worker (it restarted, or evicted us): every group formed before is gone.
  std::function<void(const absl::Status& why)> on_forgotten;
};

class CoordinatorSession {
 public:
  explicit CoordinatorSession(SessionOptions options);
  ~CoordinatorSession();

  CoordinatorSession(const CoordinatorSession&) = delete;
  CoordinatorSession& operator=(const CoordinatorSession&) = delete;

  // Registers, retrying while the coordinator is unreachable, then starts
  // heartbeats. Returns OK once registered; the coordinator's refusal
  // (UNIMPLEMENTED for an unsupported device, INVALID_ARGUMENT);
  // DEADLINE_EXCEEDED when register_timeout passed; CANCELLED when
  // RequestStop() was called first.
  absl::Status Start();

  // Asks Start() and the heartbeat thread to stop; returns at once.
  void RequestStop();

  // Blocks until RequestStop() is called.
  void WaitForStopRequest();

  // Stops heartbeats and deregisters (one call, with the RPC deadline).
  // Idempotent.
  void Shutdown();

  // The id the coordinator gave this worker (0 before registration). It
  // changes when the worker registers again after a coordinator restart.
  uint64_t worker_id() const;
  uint64_t incarnation() const { return incarnation_; }
  // The coordinator's call port as of the last registration (0: none).
  int call_port() const;
  // The lease the coordinator gave at the last registration (zero before
  // the first).
  absl::Duration lease() const;

 private:
  // One registration attempt; on success records the id and lease.
  absl::Status RegisterOnce();
  void HeartbeatLoop();
  // Waits until `deadline` or a stop request; returns true if stopping.
  bool WaitForStopUntil(absl::Time deadline);

  const SessionOptions options_;
  const uint64_t incarnation_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;

  mutable absl::Mutex mu_;
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t worker_id_ ABSL_GUARDED_BY(mu_) = 0;
  int call_port_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  absl::Duration lease_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  // Newest abort notice seen; only the heartbeat thread uses it.
  uint64_t aborts_seen_ = 0;
  std::thread heartbeat_thread_;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_COORDINATOR_SESSION_H_
