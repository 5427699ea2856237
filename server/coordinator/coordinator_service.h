// CoordinatorService: the gRPC adapter of the coordinator. It turns
// chorus.v1.Coordinator requests into calls on the core (Registry,
// GroupTable) and the core's absl::Status into grpc::Status; it holds no
// logic of its own. Calls that wait (JoinGroup, Collective) complete from the
// core's callbacks; no thread blocks per waiting call.
//
// The core ends a waiting call slightly before the client's deadline, so the
// client receives the descriptive DEADLINE_EXCEEDED (naming the missing
// ranks) rather than its own bare one.
//
// Collective calls also come on long-lived CollectiveStream streams (one
// CollectiveStreamReactor each); every call on them takes the same path into
// the core as a unary Collective call. EndStreams() finishes them when the
// coordinator shuts down, since a stream, unlike a unary call, would
// otherwise stay open until the server's shutdown grace ran out.
//
// JoinGroup is served as raw bytes: every rank of a group gets the same
// response, listing every member, so it is serialized once per formed group
// and the bytes are shared by all the replies (a rendezvous of N ranks then
// encodes N members rather than N * N).
//
// Lifecycle: owned by the coordinator's main, registered with its server,
// destroyed after the server shut down. Thread safety: all methods may run
// concurrently on gRPC's callback threads. Pointers are not owned.
#ifndef CHORUS_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
#define CHORUS_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_

#include <grpcpp/support/byte_buffer.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "server/common/clock.h"
#include "server/coordinator/collective_stream_reactor.h"
#include "server/coordinator/group_table.h"
#include "server/coordinator/registry.h"

namespace chorus {

struct CoordinatorServiceOptions {
  // Deadline of a waiting call whose client set none, and the most any
  // call may wait.
  absl::Duration max_wait = absl::Minutes(10);
};

class CoordinatorService final
    : public v1::Coordinator::WithRawCallbackMethod_JoinGroup<
          v1::Coordinator::CallbackService>,
      private CollectiveStreamHost {
 public:
  // None of the pointers is owned. `deadline_added` runs (without locks)
  // whenever a waiting call with deadline `t` was added, so the owner can
  // make sure GroupTable::ExpireDeadlines runs by then.
  CoordinatorService(Registry* registry, GroupTable* groups, Clock* clock,
                     CoordinatorServiceOptions options,
                     std::function<void(absl::Time)> deadline_added);

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
  // Request and response are a v1::JoinGroupRequest and JoinGroupResponse.
  grpc::ServerUnaryReactor* JoinGroup(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Collective(
      grpc::CallbackServerContext* context,
      const v1::CollectiveRequest* request,
      v1::CollectiveResponse* response) override;
  grpc::ServerBidiReactor<v1::CollectiveStreamRequest,
                          v1::CollectiveStreamReply>*
  CollectiveStream(grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* ListGroups(
      grpc::CallbackServerContext* context,
      const v1::ListGroupsRequest* request,
      v1::ListGroupsResponse* response) override;
  grpc::ServerUnaryReactor* Commit(grpc::CallbackServerContext* context,
                                   const v1::CommitRequest* request,
                                   v1::CommitResponse* response) override;
  grpc::ServerUnaryReactor* ReportFailure(
      grpc::CallbackServerContext* context,
      const v1::ReportFailureRequest* request,
      v1::ReportFailureResponse* response) override;

  // Finishes every open collective stream with `status` once the replies
  // already queued on it were written, and every stream opened later at
  // once. Call after the core ended its pending calls, before the server
  // shuts down.
  void EndStreams(const absl::Status& status);

  // Where a call port (call_port.h) takes its calls into the core.
  CollectiveCallHost* call_host() { return this; }
  // Tells workers that register from now on about the call port (0: none).
  void SetCallPort(int port) { call_port_.store(port); }

 private:
  // The time the core should end a call from `context`.
  absl::Time CoreDeadline(const grpc::CallbackServerContext& context) const;

  // CollectiveStreamHost:
  void StartCollective(const v1::CollectiveRequest& request,
                       absl::Time client_deadline,
                       GroupTable::CollectiveCallback done) override;
  void StartCommit(const v1::CommitRequest& request, absl::Time client_deadline,
                   std::function<void(absl::Status)> done) override;
  absl::Time Now() override { return clock_->Now(); }
  void StreamDone(CollectiveStreamReactor* stream) override;
  // The serialized JoinGroupResponse for `view`, made once per group epoch.
  grpc::ByteBuffer JoinResponseBytes(const GroupView& view);

  // The last response JoinResponseBytes made, and for which group epoch.
  struct CachedJoinResponse {
    std::string group;
    uint64_t epoch = 0;
    grpc::ByteBuffer bytes;
  };

  Registry* const registry_;  // not owned
  GroupTable* const groups_;  // not owned
  Clock* const clock_;        // not owned
  const CoordinatorServiceOptions options_;
  const std::function<void(absl::Time)> deadline_added_;

  absl::Mutex join_response_mu_;
  CachedJoinResponse join_response_ ABSL_GUARDED_BY(join_response_mu_);

  absl::Mutex streams_mu_;
  absl::flat_hash_set<CollectiveStreamReactor*> streams_
      ABSL_GUARDED_BY(streams_mu_);
  bool streams_ended_ ABSL_GUARDED_BY(streams_mu_) = false;
  absl::Status streams_end_status_ ABSL_GUARDED_BY(streams_mu_);
  std::atomic<int> call_port_{0};
};

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
