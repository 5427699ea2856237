// The coordinator's flags for running several coordinators on etcd
// (--etcd and its TLS, key prefix, lease and advertised address), and what
// they start: an EtcdClient and a LeaderElection.
//
// Thread safety: call from main, after the flags are parsed.
#ifndef CHORUS_SERVER_COORDINATOR_ELECTION_ELECTION_FLAGS_H_
#define CHORUS_SERVER_COORDINATOR_ELECTION_ELECTION_FLAGS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/coordinator/election/etcd_client.h"
#include "server/coordinator/election/etcd_state_log.h"
#include "server/coordinator/election/leader_election.h"

namespace chorus {

// The election the flags ask for, and where the leader writes its state;
// all null without --etcd.
struct Election {
  std::unique_ptr<EtcdClient> etcd;
  std::unique_ptr<EtcdStateLog> state;
  std::unique_ptr<LeaderElection> election;
};

// Checks the etcd flags against the worker lease `lease_timeout`. Returns
// INVALID_ARGUMENT saying which flag to change.
absl::Status CheckElectionFlags(absl::Duration lease_timeout);

// The election the flags ask for, not started (it refuses until elected);
// `on_deposed` runs when it loses a leadership it held. Returns an empty
// Election without --etcd; EtcdClient::Create's errors.
absl::StatusOr<Election> ElectionFromFlags(
    absl::Duration lease_timeout,
    std::function<void(const absl::Status& why)> on_deposed);

// Starts `election` campaigning for a coordinator serving on `listen_host`
// at `port` (advertised as --advertise says). Nothing without --etcd.
void StartElection(Election& election, const std::string& listen_host,
                   int port);

// Adds the election's gauges to the process's registry:
// chorus_coordinator_leading (1 or 0), chorus_coordinator_leader_changes
// and chorus_coordinator_etcd_writes. `election` (with --etcd) must
// outlive every render.
void ExportElectionGauges(const Election* election);

// Replaces this process with a fresh run of `argv` (its own program): a
// deposed leader drops everything it decided with and comes back as a
// standby. Every descriptor but the standard ones closes on the way.
// Returns only when exec failed.
void RestartProcess(const std::vector<std::string>& argv);

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_ELECTION_ELECTION_FLAGS_H_
