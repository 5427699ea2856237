// Where a worker is, as its peers and the coordinator see it: this host's
// name and machine identity, and the address peers use to reach the worker
// (chosen from its listen address and the coordinator's, or given, and
// checked so that peers can use it).
//
// Pure functions over the host's names and routes; thread-safe.
#ifndef CHORUS_SERVER_WORKER_WORKER_ADDRESS_H_
#define CHORUS_SERVER_WORKER_WORKER_ADDRESS_H_

#include <string>

#include "absl/status/statusor.h"

namespace chorus {

// This host's name ("" when it cannot be read).
std::string Hostname();

// This machine's id and this process's network namespace,
// "<machine id>/net:[<inode>]"; "" when either cannot be read. Two workers
// with the same value share the machine's memory and its loopback.
std::string MachineIdentity();

// Returns the address peers use to reach a worker that listens on `listen`
// (bound to `port`) with its coordinator at `coordinator`: `advertise`
// (host:port, or a host to which the bound port is added) when given, else
// the listen host, or listening on every interface, this host's address on
// its route to the coordinator (its hostname when the coordinator is on a
// loopback address). Sets `*why` to how it was chosen, for the log.
// INVALID_ARGUMENT for an address peers could not use: a malformed one, a
// host with no route, a loopback address while the coordinator is on
// another host, a routable address while listening on loopback only, or
// listening on loopback with the coordinator on another host.
absl::StatusOr<std::string> ChoosePeerAddress(const std::string& listen,
                                              const std::string& advertise,
                                              const std::string& coordinator,
                                              int port, std::string* why);

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_WORKER_ADDRESS_H_
