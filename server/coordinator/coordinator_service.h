// CoordinatorService: the gRPC adapter of the coordinator. It turns
// chorus.v1.Coordinator requests into calls on the core (coordinator.h) and
// the core's absl::Status into grpc::Status; it holds no rules of its own.
// A coordinator that does not lead (a standby, see leadership.h) answers
// every call with UNAVAILABLE naming the leader before anything else. With
// mutual TLS on, it checks who calls: worker RPCs only from the worker
// they name (PERMISSION_DENIED otherwise, before the core sees the call),
// ListWorkers, ListGroups, GetTrace and WatchEvents only from an admin
// certificate. Calls that wait (JoinGroup, Collective, Commit) complete from
// the core's callbacks; no thread blocks per waiting call. Each WatchEvents
// stream is a reactor subscribed to the core's events, woken when one comes,
// with one write in flight (the core's event hub queues the rest); no
// thread waits per watcher either.
//
// JoinGroup is served as raw bytes: every rank of a group gets the same
// response, listing every member, so it is serialized once per formed group
// and the bytes are shared by all the replies (a rendezvous of N ranks then
// encodes N members rather than N * N). A rank that can ask for members
// (JoinGroupRequest.members_on_request) of a group above --member_list_max
// gets a reply without them, so the rendezvous also sends N members' worth
// of bytes rather than N * N; it asks with GetGroupMembers.
//
// Lifecycle: owned by the coordinator's main, registered with its server,
// destroyed after the server shut down. Thread safety: all methods may run
// concurrently on gRPC's callback threads. The core is not owned.
#ifndef CHORUS_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
#define CHORUS_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_

#include <grpcpp/support/byte_buffer.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/leadership.h"

namespace chorus {

class CoordinatorService final
    : public v1::Coordinator::WithRawCallbackMethod_JoinGroup<
          v1::Coordinator::CallbackService> {
 public:
  // `core` and `leadership` are not owned; a null `leadership` means this
  // coordinator always leads (no election).
  explicit CoordinatorService(Coordinator* core,
                              const Leadership* leadership = nullptr);

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
  // The members a rank asked for (Coordinator::Members).
  grpc::ServerUnaryReactor* GetGroupMembers(
      grpc::CallbackServerContext* context,
      const v1::GetGroupMembersRequest* request,
      v1::GetGroupMembersResponse* response) override;
  grpc::ServerUnaryReactor* Collective(
      grpc::CallbackServerContext* context,
      const v1::CollectiveRequest* request,
      v1::CollectiveResponse* response) override;
  grpc::ServerUnaryReactor* ListGroups(
      grpc::CallbackServerContext* context,
      const v1::ListGroupsRequest* request,
      v1::ListGroupsResponse* response) override;
  grpc::ServerUnaryReactor* GetTrace(grpc::CallbackServerContext* context,
                                     const v1::GetTraceRequest* request,
                                     v1::GetTraceResponse* response) override;
  grpc::ServerUnaryReactor* Commit(grpc::CallbackServerContext* context,
                                   const v1::CommitRequest* request,
                                   v1::CommitResponse* response) override;
  grpc::ServerUnaryReactor* ReportFailure(
      grpc::CallbackServerContext* context,
      const v1::ReportFailureRequest* request,
      v1::ReportFailureResponse* response) override;
  // Streams the core's events until the client ends the call (CANCELLED)
  // or the core shuts down (UNAVAILABLE); PERMISSION_DENIED at once for a
  // caller without an admin certificate under TLS.
  grpc::ServerWriteReactor<v1::Event>* WatchEvents(
      grpc::CallbackServerContext* context,
      const v1::WatchEventsRequest* request) override;
  // A store operation on the caller's job's keys (Coordinator::Store).
  grpc::ServerUnaryReactor* Store(grpc::CallbackServerContext* context,
                                  const v1::StoreRequest* request,
                                  v1::StoreResponse* response) override;

  // Tells workers that register from now on about the call port (0: none).
  void SetCallPort(int port) { call_port_.store(port); }

 private:
  // With TLS on, OK only when the calling worker is worker `id` (or no
  // worker has that id) and PERMISSION_DENIED otherwise, naming what
  // `action` was; OK with TLS off.
  absl::Status AuthorizeWorkerId(const grpc::CallbackServerContext& context,
                                 absl::string_view action, uint64_t id) const;
  // As AuthorizeWorkerId; returns the caller's job (empty: the default job,
  // and with TLS off).
  absl::StatusOr<std::string> AuthorizeWorkerJob(
      const grpc::CallbackServerContext& context, absl::string_view action,
      uint64_t id) const;
  // As AuthorizeWorkerId, for a call as `rank` of `group` at `epoch` of the
  // caller's job. Returns that job (empty: the default job, and with TLS
  // off).
  absl::StatusOr<std::string> AuthorizeRank(
      const grpc::CallbackServerContext& context, absl::string_view action,
      const std::string& group, uint64_t epoch, int rank) const;

  // The serialized JoinGroupResponse for `view` of `job`, made once per
  // group epoch where it lists the members (`list_members`).
  grpc::ByteBuffer JoinResponseBytes(const std::string& job,
                                     const GroupView& view, bool list_members);

  // The last response JoinResponseBytes made, and for which group epoch.
  struct CachedJoinResponse {
    std::string job;
    std::string group;
    uint64_t epoch = 0;
    grpc::ByteBuffer bytes;
  };

  Coordinator* const core_;             // not owned
  const Leadership* const leadership_;  // not owned; may be null

  absl::Mutex join_response_mu_;
  CachedJoinResponse join_response_ ABSL_GUARDED_BY(join_response_mu_);

  std::atomic<int> call_port_{0};
};

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
