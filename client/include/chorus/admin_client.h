// AdminClient: inspects a Chorus cluster through its coordinator (registered
// workers and their devices, groups and their pending collectives).
//
// Lifecycle: Connect() returns a client bound to one coordinator address; the
// connection is made lazily and re-made after failures.
// Thread safety: every method is thread-safe.
#ifndef CHORUS_CLIENT_INCLUDE_CHORUS_ADMIN_CLIENT_H_
#define CHORUS_CLIENT_INCLUDE_CHORUS_ADMIN_CLIENT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.grpc.pb.h"

namespace chorus {

class AdminClient {
 public:
  // `coordinator` is "host:port". Every call carries a deadline of `timeout`.
  static std::unique_ptr<AdminClient> Connect(const std::string& coordinator,
                                              absl::Duration timeout);

  // Returns the registered workers ordered by id, or the call's status
  // (UNAVAILABLE when the coordinator cannot be reached, DEADLINE_EXCEEDED).
  absl::StatusOr<std::vector<v1::WorkerInfo>> ListWorkers() const;

  // Returns the formed groups ordered by name, each with its members and the
  // collective it is waiting on, if any; codes as ListWorkers().
  absl::StatusOr<std::vector<v1::GroupInfo>> ListGroups() const;

 private:
  AdminClient(std::unique_ptr<v1::Coordinator::Stub> stub,
              absl::Duration timeout);

  std::unique_ptr<v1::Coordinator::Stub> stub_;
  absl::Duration timeout_;
};

}  // namespace chorus

#endif  // CHORUS_CLIENT_INCLUDE_CHORUS_ADMIN_CLIENT_H_
