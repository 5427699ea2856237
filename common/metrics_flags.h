// The daemons' flags for their HTTP port: --metrics_listen (where Prometheus
// scrapes /metrics, and the coordinator serves its status page at /) and
// --metrics_port_file, and --collect_metrics.
//
// Thread safety: call from main, after the flags are parsed and TLS is
// configured (security_flags.h).
#ifndef CHORUS_COMMON_METRICS_FLAGS_H_
#define CHORUS_COMMON_METRICS_FLAGS_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/http_endpoint.h"

namespace chorus {

// Turns counting on or off as --collect_metrics says (for programs that
// count but serve no HTTP port, e.g. a benchmark's ranks).
void ApplyCollectMetricsFlag();

// Starts the HTTP port the flags ask for, serving /metrics and `pages`, and
// writes its port to --metrics_port_file; null when --metrics_listen is
// empty. Codes as HttpEndpoint::Start, and INTERNAL when the port file
// cannot be written.
absl::StatusOr<std::unique_ptr<HttpEndpoint>> StartMetricsFromFlags(
    std::vector<HttpPage> pages);

}  // namespace chorus

#endif  // CHORUS_COMMON_METRICS_FLAGS_H_
