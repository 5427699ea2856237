#include "common/metrics_flags.h"

#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "common/daemon.h"
#include "common/metrics.h"
#include "common/security_flags.h"

ABSL_FLAG(std::string, metrics_listen, "",
          "If set, serve Prometheus metrics at /metrics on this host:port "
          "(port 0 picks one; the coordinator also serves its status page "
          "at /). Plain HTTP without TLS, and then only on a loopback "
          "address unless --insecure; HTTPS with TLS, answering only "
          "clients with an admin or client certificate of the CA.");
ABSL_FLAG(bool, collect_metrics, true,
          "Count collectives, bytes per peer and reduce time for /metrics. "
          "Off only to measure what counting costs (gauges and connection "
          "counts stay on).");
ABSL_FLAG(std::string, metrics_port_file, "",
          "If set, write the bound --metrics_listen port to this file.");

namespace chorus {

void ApplyCollectMetricsFlag() {
  DefaultMetrics().set_enabled(absl::GetFlag(FLAGS_collect_metrics));
}

absl::StatusOr<std::unique_ptr<HttpEndpoint>> StartMetricsFromFlags(
    std::vector<HttpPage> pages) {
  ApplyCollectMetricsFlag();
  const std::string listen = absl::GetFlag(FLAGS_metrics_listen);
  if (listen.empty()) return nullptr;
  absl::StatusOr<std::unique_ptr<HttpEndpoint>> endpoint =
      HttpEndpoint::Start(listen, InsecureFlag(), std::move(pages));
  if (!endpoint.ok()) return endpoint.status();
  if (const std::string path = absl::GetFlag(FLAGS_metrics_port_file);
      !path.empty()) {
    if (absl::Status written = WritePortFile(path, (*endpoint)->port());
        !written.ok()) {
      return written;
    }
  }
  return endpoint;
}

}  // namespace chorus
