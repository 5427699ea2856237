// The authorization table: every entry of every door a Chorus daemon opens
// (each gRPC method, the call port's request kinds, the data port's frames,
// each HTTP path) with the certificate roles it answers when TLS is on.
// Each door asks Authorize() with its entry's name before anything else;
// tests try every entry with every role (authorization_test.cc), and check
// that every method of the services is in the table.
//
// What the roles are for: a worker acts for itself only (its registration,
// its ranks; the handlers check that after the table); an admin lists and
// watches; a client runs collectives through a worker's local API over TCP
// and scrapes metrics. Without TLS there are no roles: the doors' own rules
// apply (loopback only unless --insecure, Unix sockets of the same user).
//
// Jobs: a worker or client of one job reaches no other job's worker (its
// local API, its data plane, its metrics); the coordinator keeps each job's
// groups apart (coordinator.h).
//
// Stateless; thread-safe.
#ifndef CHORUS_COMMON_AUTHORIZATION_H_
#define CHORUS_COMMON_AUTHORIZATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/transport_security.h"

namespace chorus {

// Roles as bits of a mask.
inline constexpr uint32_t RoleBit(Role role) {
  return uint32_t{1} << static_cast<int>(role);
}

struct DoorEntry {
  // "chorus.v1.Coordinator/ListWorkers", "call port: Commit",
  // "data port: frames", "GET /metrics".
  absl::string_view name;
  // The RoleBit()s it answers.
  uint32_t roles = 0;
  // Why, for a refused caller (empty: nothing to add).
  absl::string_view hint;
  // Whether a worker or client must be of the job of the daemon that serves
  // the entry (a worker's; the coordinator's is the default job). Admins
  // serve every job.
  bool own_job = false;
};

// Every entry, in the order of the doors.
const std::vector<DoorEntry>& AuthorizationTable();

// Returns OK when `caller` may use `entry`; UNAUTHENTICATED when its
// certificate was revoked (revocation.h); PERMISSION_DENIED "ENTRY needs
// a ROLE certificate; the caller is URI" otherwise, or "ENTRY serves job J
// here; the caller is URI" for a caller of another job at an own_job entry
// (the serving job is this process's, OwnIdentity()); INTERNAL for an entry
// not in the table (a door that forgot to list it refuses everyone).
absl::Status Authorize(absl::string_view entry, const Identity& caller);

// Returns "job \"J\"", or "the default job" for an empty `job`.
std::string JobName(absl::string_view job);

}  // namespace chorus

#endif  // CHORUS_COMMON_AUTHORIZATION_H_
