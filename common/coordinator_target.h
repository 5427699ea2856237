// CoordinatorTarget: the coordinators a daemon or client may reach, as the
// user lists them ("a:7000,b:7000,c:7000"), and the one it talks to now.
// It follows the leader: a refusal from a standby (UNAVAILABLE with a
// NOT_LEADER ErrorDetail naming the leader) moves it to that leader, and a
// coordinator that cannot be reached to the next one in the list. With one
// coordinator listed it never moves.
//
// Lifecycle: construct, then use; channels are made when first needed and
// kept. Thread safety: all methods are thread-safe.
#ifndef CHORUS_COMMON_COORDINATOR_TARGET_H_
#define CHORUS_COMMON_COORDINATOR_TARGET_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/transport_security.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace chorus {

class CoordinatorTarget {
 public:
  // Checks `list` (comma-separated host:port): INVALID_ARGUMENT for an
  // empty list or an entry that is not host:port.
  static absl::Status Check(const std::string& list);
  // The coordinators of `list`, starting with the first; calls to an entry
  // that Check() refuses fail as a call to an unreachable address does.
  explicit CoordinatorTarget(const std::string& list);

  CoordinatorTarget(const CoordinatorTarget&) = delete;
  CoordinatorTarget& operator=(const CoordinatorTarget&) = delete;

  // The coordinator calls go to now, "host:port".
  std::string address() const;
  // The channel to address(), made once per address.
  std::shared_ptr<grpc::Channel> channel() const;
  // The list as given, for messages, and how many coordinators it names.
  const std::string& list() const { return list_; }
  size_t size() const { return addresses_.size(); }

  // Looks at how a call to `tried` failed: moves to the leader a standby
  // named, or to the next coordinator listed when `tried` could not be
  // reached (UNAVAILABLE or DEADLINE_EXCEEDED without a detail). Returns
  // true when calls now go elsewhere (a retry may succeed there).
  bool Follow(const std::string& tried, const absl::Status& status);

 private:
  const std::string list_;
  const std::vector<std::string> addresses_;

  mutable absl::Mutex mu_;
  // What address() gives: one of addresses_ or a leader a standby named.
  std::string current_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 1;
  mutable absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>>
      channels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace chorus

#endif  // CHORUS_COMMON_COORDINATOR_TARGET_H_
