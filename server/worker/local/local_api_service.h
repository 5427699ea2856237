// LocalApiService: the gRPC door of the worker's local calls
// (chorus.v1.WorkerLocal). Each method checks the caller (CheckLocalCaller),
// translates its request, calls the core (LocalCalls) once and translates
// the outcome back; the streams have reactors of their own
// (ChunkedCallReactor, MembershipHoldReactor). A join holds no thread while
// its group assembles, and a collective none while it is matched: gRPC's
// callback threads never block.
//
// Lifecycle: made before the runtime's server starts (it is one of its
// services), with the core it serves (not owned; outlives it).
// Thread safety: all methods are thread-safe.
#ifndef CHORUS_SERVER_WORKER_LOCAL_LOCAL_API_SERVICE_H_
#define CHORUS_SERVER_WORKER_LOCAL_LOCAL_API_SERVICE_H_

#include "absl/status/status.h"
#include "chorus/v1/worker.grpc.pb.h"
#include "server/worker/local/local_calls.h"

namespace chorus {

// Who may use the local API, which runs collectives as any rank: callers on
// the worker's Unix socket; over TCP, with TLS on, a client or admin
// certificate (as the authorization table says for `entry`, the method's
// full name), and without TLS only a loopback caller. Returns OK, or
// PERMISSION_DENIED / UNAUTHENTICATED saying what the caller lacks.
absl::Status CheckLocalCaller(const grpc::CallbackServerContext& context,
                              absl::string_view entry);

class LocalApiService final : public v1::WorkerLocal::CallbackService {
 public:
  explicit LocalApiService(LocalCalls* calls) : calls_(calls) {}

  grpc::ServerUnaryReactor* JoinGroup(grpc::CallbackServerContext* context,
                                      const v1::LocalJoinRequest* request,
                                      v1::LocalJoinResponse* response) override;
  grpc::ServerUnaryReactor* Collective(
      grpc::CallbackServerContext* context,
      const v1::LocalCollectiveRequest* request,
      v1::LocalCollectiveResponse* response) override;
  grpc::ServerBidiReactor<v1::LocalChunkedRequest, v1::LocalChunkedResponse>*
  CollectiveChunked(grpc::CallbackServerContext* context) override;
  grpc::ServerReadReactor<v1::MembershipHold>* HoldMembership(
      grpc::CallbackServerContext* context,
      v1::MembershipHoldReply* reply) override;
  grpc::ServerUnaryReactor* OpenSharedRegion(
      grpc::CallbackServerContext* context,
      const v1::SharedRegionRequest* request,
      v1::SharedRegion* response) override;
  grpc::ServerUnaryReactor* ReleaseSharedRegion(
      grpc::CallbackServerContext* context,
      const v1::SharedRegionRelease* request,
      v1::SharedRegionReleased* response) override;

 private:
  LocalCalls* const calls_;  // not owned
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_LOCAL_LOCAL_API_SERVICE_H_
