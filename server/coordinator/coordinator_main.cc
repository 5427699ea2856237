// chorus-coordinator: the cluster's registry of workers and devices.

#include <glog/logging.h>

#include <string>

#include "absl/flags/flag.h"
#include "absl/time/time.h"
#include "server/common/clock.h"
#include "server/common/daemon.h"
#include "server/common/device.h"
#include "server/common/net.h"
#include "server/coordinator/coordinator_service.h"
#include "server/coordinator/lease_sweeper.h"
#include "server/coordinator/registry.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:7000",
          "Address to serve on, host:port; port 0 picks a free port.");
ABSL_FLAG(std::string, port_file, "",
          "If set, write the bound port to this file once serving.");
ABSL_FLAG(absl::Duration, lease_timeout, absl::Seconds(5),
          "A worker that sends no heartbeat for this long is evicted. "
          "Workers heartbeat every quarter of it.");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(2),
          "On SIGTERM, how long in-flight calls may take to finish.");

int main(int argc, char** argv) {
  chorus::InitDaemon(argc, argv,
                     "chorus-coordinator: keeps the registry of Chorus "
                     "workers and their devices.\n"
                     "Usage: chorus-coordinator --listen=HOST:PORT "
                     "[--lease_timeout=5s] [--port_file=PATH]");
  const absl::Duration lease = absl::GetFlag(FLAGS_lease_timeout);
  if (lease <= absl::ZeroDuration()) {
    LOG(ERROR) << "--lease_timeout must be positive";
    return 2;
  }

  chorus::Registry registry(chorus::RealClock::Get(), lease);
  chorus::CoordinatorService service(&registry, chorus::RealClock::Get());
  chorus::LeaseSweeper sweeper(&registry, [](const chorus::WorkerRecord& r) {
    LOG(WARNING) << "evicted worker " << r.id << " \"" << r.registration.name
                 << "\": no heartbeat within the lease";
  });

  chorus::ServerOptions options;
  options.listen_address = absl::GetFlag(FLAGS_listen);
  options.services = {&service};
  absl::StatusOr<chorus::StartedServer> server = chorus::StartServer(options);
  if (!server.ok()) {
    LOG(ERROR) << server.status();
    return 1;
  }
  sweeper.Start();
  LOG(INFO) << "chorus-coordinator serving on " << options.listen_address
            << " (port " << server->port << "), lease " << lease;
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    absl::Status written = chorus::WritePortFile(path, server->port);
    if (!written.ok()) {
      LOG(ERROR) << written;
      return 1;
    }
  }

  const int signal = chorus::WaitForTerminationSignal();
  LOG(INFO) << "signal " << signal << ": shutting down";
  server->server->Shutdown(
      chorus::DeadlineAfter(absl::GetFlag(FLAGS_shutdown_grace)));
  sweeper.Stop();
  LOG(INFO) << "chorus-coordinator stopped";
  return 0;
}
