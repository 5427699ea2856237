// EtcdClient: the coordinator's connection to an etcd cluster (its v3 gRPC
// API), with just what leader election and the leader's state need: leases,
// a conditional create, writes fenced by the leader's key, reads, and
// waiting for a key to change.
//
// It holds one channel per endpoint and uses one at a time; a call that
// finds its endpoint unreachable (UNAVAILABLE) moves to the next endpoint
// for the following calls, so a cluster that lost a member is still
// reached. Every call has a deadline.
//
// Lifecycle: Create(), then use; destroy after the calls returned.
// Thread safety: all methods are thread-safe.
#ifndef CHORUS_SERVER_COORDINATOR_ELECTION_ETCD_CLIENT_H_
#define CHORUS_SERVER_COORDINATOR_ELECTION_ETCD_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace grpc {
class Channel;
class ClientContext;
}  // namespace grpc

namespace chorus {

struct EtcdOptions {
  // "http://host:port" or "https://host:port" (or "host:port", plain).
  std::vector<std::string> endpoints;
  // PEM files for https endpoints: the CA that signed etcd's certificate,
  // and this client's certificate and key when etcd asks for one.
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  // Deadline of each call.
  absl::Duration rpc_timeout = absl::Seconds(2);
};

// A key's value and when it was created (etcd's create_revision).
struct EtcdValue {
  std::string value;
  int64_t create_revision = 0;
  int64_t lease = 0;
};

// How a conditional create ended.
struct EtcdCreate {
  // Whether the key was created (it did not exist).
  bool created = false;
  // The key as it is now: ours when created, the holder's otherwise.
  EtcdValue current;
  // The store's revision after the call.
  int64_t revision = 0;
};

// One key to write (a value) or delete (no value).
struct EtcdWrite {
  std::string key;
  std::optional<std::string> value;
};

class EtcdClient {
 public:
  // Parses the endpoints and reads the PEM files. INVALID_ARGUMENT for an
  // endpoint that is not a URL of host:port, https without --etcd_ca;
  // NOT_FOUND for a PEM file that cannot be read.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(
      const EtcdOptions& options);
  ~EtcdClient();

  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // Grants a lease of `ttl` (rounded up to whole seconds; etcd may raise
  // it). Returns its id and the TTL etcd granted; UNAVAILABLE or
  // DEADLINE_EXCEEDED when etcd cannot be reached.
  absl::StatusOr<std::pair<int64_t, absl::Duration>> GrantLease(
      absl::Duration ttl);
  // Renews lease `id`. Returns the TTL it has from now on, or NOT_FOUND
  // when etcd no longer has it (it expired); UNAVAILABLE or
  // DEADLINE_EXCEEDED when etcd cannot be reached.
  absl::StatusOr<absl::Duration> KeepAlive(int64_t id);
  // Revokes lease `id`, deleting the keys attached to it. Returns etcd's
  // status.
  absl::Status RevokeLease(int64_t id);

  // Creates `key` with `value` attached to lease `lease` unless the key
  // exists. Returns what is there after; UNAVAILABLE or DEADLINE_EXCEEDED
  // when etcd cannot be reached.
  absl::StatusOr<EtcdCreate> CreateIfAbsent(const std::string& key,
                                            const std::string& value,
                                            int64_t lease);
  // Makes `writes` in one transaction, only if `fence_key` still has the
  // create revision `fence_revision` (the leader's key as this leader
  // created it). Returns OK when written; FAILED_PRECONDITION when the key
  // is another's or gone (nothing was written); UNAVAILABLE or
  // DEADLINE_EXCEEDED when etcd cannot be reached (it may have been).
  absl::Status FencedWrite(const std::string& fence_key, int64_t fence_revision,
                           const std::vector<EtcdWrite>& writes);
  // Reads every key that starts with `prefix`, with its value, in key
  // order. Returns etcd's status when it cannot.
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> List(
      const std::string& prefix);

  // Reads `key`. Returns its value, NOT_FOUND when it does not exist, or
  // etcd's status.
  absl::StatusOr<EtcdValue> Get(const std::string& key);

  // Waits until `key` changes after store revision `after` (created,
  // changed or deleted), or until `deadline`. Returns OK when it changed
  // (or may have: the watch ended early), DEADLINE_EXCEEDED when it did not
  // by `deadline`; UNAVAILABLE when etcd cannot be reached.
  // CANCELLED after CancelWaits().
  absl::Status WaitForChange(const std::string& key, int64_t after,
                             absl::Time deadline);
  // Ends every WaitForChange(), now and later, with CANCELLED.
  void CancelWaits();

 private:
  explicit EtcdClient(std::vector<std::shared_ptr<grpc::Channel>> channels,
                      std::vector<std::string> endpoints,
                      absl::Duration rpc_timeout);

  // The channel calls use now, and its endpoint for messages.
  std::shared_ptr<grpc::Channel> Current(std::string* endpoint);
  // Moves to the next endpoint when `status` says this one is unreachable.
  absl::Status Note(const absl::Status& status, const std::string& endpoint);

  const std::vector<std::shared_ptr<grpc::Channel>> channels_;
  const std::vector<std::string> endpoints_;
  const absl::Duration rpc_timeout_;

  absl::Mutex mu_;
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;
  // The contexts of the waits in progress, for CancelWaits().
  absl::flat_hash_set<grpc::ClientContext*> waits_ ABSL_GUARDED_BY(mu_);
  bool waits_cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_ELECTION_ETCD_CLIENT_H_
