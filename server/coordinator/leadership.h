// Leadership: whether this coordinator decides now. Without --etcd a
// coordinator always does (no Leadership object: a null pointer); with it,
// only the elected leader does, and only while its etcd lease surely holds
// (election/leader_election.h). The doors (the gRPC service, the call
// port) ask before handing a request to the core, so a standby or a
// deposed leader decides nothing.
//
// Thread safety: CheckLeading() may be called from any thread, often.
#ifndef CHORUS_SERVER_COORDINATOR_LEADERSHIP_H_
#define CHORUS_SERVER_COORDINATOR_LEADERSHIP_H_

#include "absl/status/status.h"

namespace chorus {

class Leadership {
 public:
  virtual ~Leadership() = default;

  // Returns OK while this coordinator leads; otherwise UNAVAILABLE with an
  // ErrorDetail (reason NOT_LEADER) whose `leader` names the coordinator
  // that leads (empty while none is known).
  virtual absl::Status CheckLeading() const = 0;
};

// CheckLeading() of `leadership`, or OK when it is null (no election).
inline absl::Status CheckLeading(const Leadership* leadership) {
  return leadership == nullptr ? absl::OkStatus() : leadership->CheckLeading();
}

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_LEADERSHIP_H_
