// LeaderElection: campaigns for the leadership of a Chorus cluster on etcd
// and keeps it, so that several coordinators run and exactly one decides.
//
// The leader holds key `<prefix>/leader` (its address as value), attached
// to an etcd lease it renews every third of the lease's TTL. The others
// are standbys: each watches the key and campaigns again the moment it is
// deleted (the leader resigned, or its lease expired: it died, stopped, or
// lost etcd). A leader counts its lease from the moment it sent the renewal
// that etcd answered, so it stops leading (CheckLeading() refuses) no later
// than etcd lets another coordinator take the key: two coordinators never
// decide at once. A leader that stops leading for any reason other than
// Stop() is deposed: `on_deposed` runs (the coordinator then drops all it
// decided with and comes back as a standby).
//
// Lifecycle: construct (it refuses, as a standby), Start() campaigns on a
// thread of its own until Stop() (also run by the destructor), which resigns: a
// leader revokes its lease so that a standby takes over at once. Thread safety:
// all methods are thread-safe; `on_deposed` runs on the election's thread,
// once.
#ifndef CHORUS_SERVER_COORDINATOR_ELECTION_LEADER_ELECTION_H_
#define CHORUS_SERVER_COORDINATOR_ELECTION_LEADER_ELECTION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/coordinator/leadership.h"

namespace chorus {

class EtcdClient;

struct ElectionOptions {
  // The key the leader holds, e.g. "/chorus/prod/leader".
  std::string key;
  // The etcd lease's TTL (whole seconds; etcd may raise it): how long the
  // cluster goes without a leader when the leader dies.
  absl::Duration lease = absl::Seconds(5);
  // Pause before trying again while etcd cannot be reached.
  absl::Duration retry_interval = absl::Milliseconds(500);
};

class LeaderElection final : public Leadership {
 public:
  // `etcd` is not owned and must outlive this object. `on_deposed` gets
  // why this coordinator stopped leading.
  LeaderElection(EtcdClient* etcd, ElectionOptions options,
                 std::function<void(const absl::Status& why)> on_deposed);
  ~LeaderElection() override;

  LeaderElection(const LeaderElection&) = delete;
  LeaderElection& operator=(const LeaderElection&) = delete;

  // Sets what runs each time this coordinator wins the key, before it
  // leads: it gets the key's create revision (the fence of the leader's
  // writes) and takes over the state; an error gives the leadership up as
  // a deposition does. Call before Start().
  void OnElected(std::function<absl::Status(int64_t fence)> on_elected) {
    on_elected_ = std::move(on_elected);
  }

  // Starts campaigning as `address` (this coordinator's address as
  // workers and clients reach it). Until it leads, CheckLeading() refuses.
  void Start(const std::string& address);
  // Stops campaigning and resigns. Idempotent.
  void Stop();

  // OK while this coordinator leads and its lease surely holds; otherwise
  // UNAVAILABLE with a NOT_LEADER detail naming the leader it knows.
  absl::Status CheckLeading() const override;
  // Whether CheckLeading() is OK now.
  bool Leading() const;
  // The leader's address as last seen ("" while none is known).
  std::string Leader() const;
  // How many times this coordinator became leader.
  int64_t TimesElected() const { return elected_.load(); }
  // How many times the leader it knows changed to another coordinator.
  int64_t LeaderChanges() const { return leader_changes_.load(); }
  // Writes it made to etcd (leases granted and revoked, the key created);
  // none per collective.
  int64_t EtcdWrites() const { return etcd_writes_.load(); }
  // One line for people: "leader", or "standby; the leader is HOST:PORT".
  std::string Describe() const;

 private:
  void Run();
  // Holds the key until the lease is lost or Stop(); false when stopped.
  bool Lead(absl::Duration ttl);
  // A live lease for campaigning: renews the one held or grants another.
  // Sets `*renewed_at` to when the renewal that etcd answered was sent.
  absl::StatusOr<absl::Duration> LiveLease(int64_t* renewed_at);
  // Waits until `deadline` or Stop(); returns true if stopping.
  bool WaitUntil(absl::Time deadline);
  void SetLeader(const std::string& leader);
  std::string Address() const;

  EtcdClient* const etcd_;
  const ElectionOptions options_;
  const std::function<void(const absl::Status&)> on_deposed_;
  std::function<absl::Status(int64_t)> on_elected_;

  // Until when (steady clock, nanoseconds) this coordinator surely leads;
  // 0 while it does not.
  std::atomic<int64_t> leading_until_{0};
  std::atomic<int64_t> elected_{0};
  std::atomic<int64_t> leader_changes_{0};
  std::atomic<int64_t> etcd_writes_{0};
  // Only the election's thread uses it.
  int64_t lease_id_ = 0;

  mutable absl::Mutex mu_;
  std::string address_ ABSL_GUARDED_BY(mu_);
  std::string leader_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_ELECTION_LEADER_ELECTION_H_
