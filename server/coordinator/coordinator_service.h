// CoordinatorService: the gRPC adapter of the coordinator. It turns
// chorus.v1.Coordinator requests into calls on the core (Registry) and the
// core's absl::Status into grpc::Status; it holds no logic of its own.
//
// Lifecycle: owned by the coordinator's main, registered with its server,
// destroyed after the server shut down. Thread safety: all methods may run
// concurrently on gRPC's callback threads. The registry is not owned.
#ifndef CHORUS_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
#define CHORUS_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_

#include "chorus/v1/coordinator.grpc.pb.h"
#include "server/common/clock.h"
#include "server/coordinator/registry.h"

namespace chorus {

class CoordinatorService final : public v1::Coordinator::CallbackService {
 public:
  // Neither argument is owned.
  CoordinatorService(Registry* registry, Clock* clock);

  grpc::ServerUnaryReactor* RegisterWorker(
      grpc::CallbackServerContext* context,
      const v1::RegisterWorkerRequest* request,
      v1::RegisterWorkerResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* Deregister(
      grpc::CallbackServerContext* context,
      const v1::DeregisterRequest* request,
      v1::DeregisterResponse* response) override;
  grpc::ServerUnaryReactor* ListWorkers(
      grpc::CallbackServerContext* context,
      const v1::ListWorkersRequest* request,
      v1::ListWorkersResponse* response) override;

 private:
  Registry* const registry_;  // not owned
  Clock* const clock_;        // not owned
};

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
