// LocalApiService: the worker daemon's API for applications
// (chorus.v1.WorkerLocal). An application joins a group as one rank through
// the daemon and issues collectives by sequence number; the daemon runs them
// with its WorkerRuntime. Each call that waits on peers runs on a task
// thread, so gRPC's callback threads never block.
//
// Lifecycle: constructed before the runtime's server starts (it is one of
// its services) and bound to the runtime with Bind(); Drain() waits for the
// calls in flight. Thread safety: all methods are thread-safe.
#ifndef CHORUS_SERVER_WORKER_LOCAL_API_SERVICE_H_
#define CHORUS_SERVER_WORKER_LOCAL_API_SERVICE_H_

#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "chorus/v1/worker.grpc.pb.h"
#include "server/worker/task_runner.h"
#include "server/worker/worker_runtime.h"

namespace chorus {

class LocalApiService final : public v1::WorkerLocal::CallbackService {
 public:
  LocalApiService() = default;

  // Sets the runtime calls run on (not owned). Calls before Bind() get
  // UNAVAILABLE.
  void Bind(WorkerRuntime* runtime);

  // Waits for the calls in flight to end.
  void Drain() { tasks_.WaitIdle(); }

  grpc::ServerUnaryReactor* JoinGroup(grpc::CallbackServerContext* context,
                                      const v1::LocalJoinRequest* request,
                                      v1::LocalJoinResponse* response) override;
  grpc::ServerUnaryReactor* Collective(
      grpc::CallbackServerContext* context,
      const v1::LocalCollectiveRequest* request,
      v1::LocalCollectiveResponse* response) override;

 private:
  WorkerRuntime* runtime() const;

  mutable absl::Mutex mu_;
  WorkerRuntime* runtime_ ABSL_GUARDED_BY(mu_) = nullptr;  // not owned
  // (group, rank) -> membership.
  absl::flat_hash_map<std::pair<std::string, int>, Membership> memberships_
      ABSL_GUARDED_BY(mu_);
  TaskRunner tasks_;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_LOCAL_API_SERVICE_H_
