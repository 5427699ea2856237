// The coordinator's gauges, sampled from the core whenever Prometheus
// scrapes (metrics.h): chorus_workers, chorus_groups{state},
// chorus_pending_collectives{phase} (matching: waiting for some ranks'
// calls; committing: running on the data plane, waiting for commits),
// chorus_stalled_groups (a collective waiting for ranks longer than the
// stall threshold) and chorus_call_port_connections. The counters
// (collectives, aborts, registrations) are counted where they happen.
//
// Thread safety: the gauges read the core through its thread-safe methods.
#ifndef CHORUS_SERVER_COORDINATOR_COORDINATOR_METRICS_H_
#define CHORUS_SERVER_COORDINATOR_COORDINATOR_METRICS_H_

#include "absl/time/time.h"
#include "server/coordinator/call_port.h"
#include "server/coordinator/coordinator.h"

namespace chorus {

// Adds the gauges of `core` and `call_port` (null: none) to the process's
// registry; both must outlive every later render. A group counts as stalled
// once its oldest collective has waited `stall_after`.
void ExportCoordinatorGauges(const Coordinator* core, const CallPort* call_port,
                             absl::Duration stall_after);

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_COORDINATOR_METRICS_H_
