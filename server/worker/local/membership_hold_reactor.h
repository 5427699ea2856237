// MembershipHoldReactor: the server side of WorkerLocal.HoldMembership. It
// reads the hold naming a membership, checks it with the service, then
// waits (a pending read, no thread) until the client releases it or the
// stream ends, and tells the core (LocalCalls::EndHold): a stream that ends
// without a release means the client process is gone, and the core reports
// the rank, unless the worker is shutting down.
//
// Lifecycle: made with new by LocalApiService::HoldMembership; deletes
// itself when gRPC is done with it. Thread safety: gRPC runs its reactions
// one at a time.
#ifndef CHORUS_SERVER_WORKER_LOCAL_MEMBERSHIP_HOLD_REACTOR_H_
#define CHORUS_SERVER_WORKER_LOCAL_MEMBERSHIP_HOLD_REACTOR_H_

#include <grpcpp/support/server_callback.h>

#include <string>

#include "chorus/v1/worker.grpc.pb.h"
#include "server/worker/local/local_calls.h"
#include "server/worker/membership.h"

namespace chorus {

class MembershipHoldReactor final
    : public grpc::ServerReadReactor<v1::MembershipHold> {
 public:
  // `peer` names the client for the report (its gRPC peer string).
  MembershipHoldReactor(LocalCalls* calls, std::string peer);

  void OnReadDone(bool ok) override;
  void OnDone() override { delete this; }

 private:
  LocalCalls* const calls_;  // not owned
  const std::string peer_;
  v1::MembershipHold hold_;
  bool held_ = false;
  Membership membership_;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_LOCAL_MEMBERSHIP_HOLD_REACTOR_H_
