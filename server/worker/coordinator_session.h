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
#include "common/coordinator_target.h"
#include "common/device.h"

namespace chorus {

struct SessionOptions {
  // Coordinator address, "host:port", or several ("a:7000,b:7000"): the
  // session follows the leader among them (coordinator_target.h).
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
  // RegisterWorkerRequest.nccl_version (0: no NCCL).
  uint32_t nccl_version = 0;
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
  // Runs on the heartbeat thread when the worker registered again with a
  // coordinator that kept its registration and groups (a new leader of
  // several, after a failover).
  std::function<void()> on_kept;
  // The devices this worker withdrew so far (GPUs whose context faulted),
  // told the coordinator with every heartbeat; called on the heartbeat
  // thread.
  std::function<std::vector<Device>()> withdrawn;
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

  // Has the heartbeat thread send its next heartbeat now rather than at its
  // interval (registering again when the coordinator no longer knows this
  // worker, e.g. it restarted), then run `then` on that thread once that
  // heartbeat and any registration it led to ended, whatever they gave.
  // A caller whose call the coordinator refused for an unknown worker id
  // sends it again from `then` with worker_id(). Runs `then` at once when
  // no heartbeats run (before Start(), once stopping). `then` must not
  // block for long: heartbeats wait for it.
  void CheckRegistrationThen(std::function<void()> then);

  // Runs `then` on the heartbeat thread after the next heartbeat that is
  // due anyway (within retry_interval while the coordinator cannot be
  // reached, within the heartbeat interval otherwise), once it and any
  // registration it led to ended; at once when no heartbeats run. For
  // calls that wait for the cluster to fail over to another coordinator
  // without hurrying the heartbeats. `then` must not block for long.
  void AfterNextBeat(std::function<void()> then);

  // How many times this worker registered, with any coordinator: it
  // changes when the worker moved to another coordinator (a failover).
  uint64_t registrations() const;

  // The id the coordinator gave this worker (0 before registration). It
  // changes when the worker registers again after a coordinator restart.
  uint64_t worker_id() const;
  uint64_t incarnation() const { return incarnation_; }
  // The coordinator's call port as of the last registration (0: none).
  int call_port() const;
  // The coordinator the worker talks to now ("host:port"), and a stub for
  // it: after the leader changed, the new leader's.
  std::string coordinator() const { return target_.address(); }
  // How many coordinators the session may move between (more than one:
  // the cluster fails over, and calls wait for it rather than fail).
  size_t coordinators() const { return target_.size(); }
  std::shared_ptr<v1::Coordinator::Stub> stub() const;
  // Moves to another coordinator as CoordinatorTarget::Follow() says for a
  // call to `tried` that failed with `status`; true when it moved (the
  // next heartbeat goes there, and registers when it does not know this
  // worker).
  bool Follow(const std::string& tried, const absl::Status& status);
  // The lease the coordinator gave at the last registration (zero before
  // the first).
  absl::Duration lease() const;

 private:
  // What the heartbeat thread remembers between heartbeats.
  struct Beats {
    // The last heartbeat or registration could not reach the coordinator.
    bool coordinator_lost = false;
    // Heartbeats failed in a row since the coordinator was lost.
    int failed = 0;
  };

  // One registration attempt (and one more at the leader when a standby
  // named it); on success records the id and lease.
  absl::Status RegisterOnce(bool followed = false);
  void HeartbeatLoop();
  // One heartbeat, and a registration when the coordinator forgot us.
  void Beat(Beats* beats);
  // Whether the heartbeat thread should stop waiting: a stop, or a check
  // asked for.
  // Registers again after the coordinator said it does not know this
  // worker (`why`); runs on_forgotten unless the coordinator kept the
  // registration (a failover to a coordinator that took it over).
  void RegisterAgain(const absl::Status& why, Beats* beats);
  bool StopOrCheckLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until `deadline` or a stop request; returns true if stopping.
  bool WaitForStopUntil(absl::Time deadline);

  const SessionOptions options_;
  const uint64_t incarnation_;
  CoordinatorTarget target_;

  mutable absl::Mutex mu_;
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t worker_id_ ABSL_GUARDED_BY(mu_) = 0;
  int call_port_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t registrations_ ABSL_GUARDED_BY(mu_) = 0;
  // Whether the last registration was one the coordinator already held.
  bool kept_ ABSL_GUARDED_BY(mu_) = false;
  // What runs after the next heartbeat that is due anyway.
  std::vector<std::function<void()>> after_beat_ ABSL_GUARDED_BY(mu_);
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  absl::Duration lease_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  // Whether the heartbeat thread runs (from Start() until it stops).
  bool heartbeating_ ABSL_GUARDED_BY(mu_) = false;
  // What CheckRegistrationThen() left for the end of the next heartbeat.
  std::vector<std::function<void()>> after_check_ ABSL_GUARDED_BY(mu_);
  // The stub for target_'s address, and that address.
  mutable std::shared_ptr<v1::Coordinator::Stub> stub_ ABSL_GUARDED_BY(mu_);
  mutable std::string stub_address_ ABSL_GUARDED_BY(mu_);
  // Newest abort notice seen; only the heartbeat thread uses it.
  uint64_t aborts_seen_ = 0;
  std::thread heartbeat_thread_;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_COORDINATOR_SESSION_H_
