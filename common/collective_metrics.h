// Collective metrics: how the daemons count the collectives they see end,
// in the process's MetricsRegistry (metrics.h):
//   chorus_collectives_total{kind,plan,code}  calls that ended, by kind, the
//       plan they ran under ("auto" when none was chosen, e.g. a mismatch)
//       and the status code (OK, ABORTED, ...);
//   chorus_collective_seconds{kind,size}      how long each took, by kind and
//       payload (count times the element size, SizeBucket());
//   chorus_reduce_bytes_total{engine}, chorus_reduce_seconds_total{engine}
//       the bytes a worker's reduce engine ("cpu", "cuda") combined and the
//       time it took (the CPU engine only: CUDA kernels run asynchronously);
//   chorus_data_plane_connections{direction}  open TCP data-plane connections.
// The coordinator counts each collective of a group once (first call to
// verdict); a worker counts each rank's call (issue to result).
//
// Pure functions over the registry; thread-safe.
#ifndef CHORUS_COMMON_COLLECTIVE_METRICS_H_
#define CHORUS_COMMON_COLLECTIVE_METRICS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "chorus/types.h"
#include "common/metrics.h"

namespace chorus {

// Counts one collective of `spec` that ran under `plan`, ended with `code`
// and took `took` (InfiniteDuration() or negative: not timed).
void RecordCollective(const CollectiveSpec& spec, Algorithm plan,
                      absl::StatusCode code, absl::Duration took);

// The number of open TCP data-plane connections of `direction` ("in":
// accepted from peers, "out": made to peers), chorus_data_plane_connections.
Level* DataPlaneConnections(const char* direction);

// Counts `bytes` combined by reduce engine `engine` in `took` (negative: not
// timed).
void RecordReduce(const char* engine, uint64_t bytes, absl::Duration took);

}  // namespace chorus

#endif  // CHORUS_COMMON_COLLECTIVE_METRICS_H_
