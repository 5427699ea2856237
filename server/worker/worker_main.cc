// chorus-worker: the daemon that owns a host's devices and registers them
// with the coordinator.

#include <glog/logging.h>
#include <unistd.h>

#include <iostream>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "server/common/daemon.h"
#include "server/common/device.h"
#include "server/common/net.h"
#include "server/worker/coordinator_session.h"
#include "server/worker/device_discovery.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7000",
          "Address of chorus-coordinator, host:port.");
ABSL_FLAG(std::string, listen, "0.0.0.0:0",
          "Address this worker serves its peers on, host:port; port 0 picks "
          "a free port.");
ABSL_FLAG(std::string, advertise_address, "",
          "Address peers use to reach this worker; default: the listen host "
          "(or this machine's hostname when listening on all interfaces) and "
          "the bound port.");
ABSL_FLAG(std::string, name, "",
          "Stable name of this worker; a restarted worker with the same name "
          "replaces its old entry. Default: the advertised address.");
ABSL_FLAG(std::string, devices, "",
          "Comma-separated devices to register instead of the discovered "
          "ones, e.g. cpu,cuda:0. Any device this worker cannot serve is "
          "refused with UNIMPLEMENTED and the worker exits non-zero.");
ABSL_FLAG(std::string, port_file, "",
          "If set, write the bound port to this file once registered.");
ABSL_FLAG(absl::Duration, rpc_timeout, absl::Seconds(5),
          "Deadline of each call to the coordinator.");
ABSL_FLAG(absl::Duration, register_timeout, absl::InfiniteDuration(),
          "Give up (exit non-zero) if the coordinator cannot be reached for "
          "this long at start; 'inf' keeps trying.");

namespace {

std::string Hostname() {
  char buffer[256] = {};
  if (gethostname(buffer, sizeof(buffer) - 1) != 0) return "localhost";
  return buffer;
}

std::string AdvertisedAddress(const std::string& listen, int port) {
  std::string host = listen.substr(0, listen.rfind(':'));
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") {
    host = Hostname();
  }
  return absl::StrCat(host, ":", port);
}

int Fail(const absl::Status& status, absl::string_view what) {
  std::cerr << "chorus-worker: " << what << ": " << status << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  chorus::InitDaemon(
      argc, argv,
      "chorus-worker: registers this host's devices with a Chorus "
      "coordinator, keeps its lease and serves its peers.\n"
      "Usage: chorus-worker --coordinator=HOST:PORT [--devices=cpu,cuda:0] "
      "[--name=NAME] [--listen=HOST:PORT] [--port_file=PATH]");

  std::vector<chorus::Device> requested;
  if (const std::string spec = absl::GetFlag(FLAGS_devices); !spec.empty()) {
    absl::StatusOr<std::vector<chorus::Device>> parsed =
        chorus::ParseDeviceList(spec);
    if (!parsed.ok()) return Fail(parsed.status(), "bad --devices");
    requested = *std::move(parsed);
  }
  const chorus::DiscoveredDevices discovered = chorus::DiscoverDevices();
  absl::StatusOr<std::vector<chorus::Device>> devices =
      chorus::SelectDevices(requested, discovered);
  if (!devices.ok()) return Fail(devices.status(), "device refused");

  chorus::ServerOptions server_options;
  server_options.listen_address = absl::GetFlag(FLAGS_listen);
  absl::StatusOr<chorus::StartedServer> server =
      chorus::StartServer(server_options);
  if (!server.ok()) return Fail(server.status(), "cannot serve");

  chorus::SessionOptions options;
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  options.address = absl::GetFlag(FLAGS_advertise_address);
  if (options.address.empty()) {
    options.address =
        AdvertisedAddress(server_options.listen_address, server->port);
  }
  options.host = Hostname();
  options.name = absl::GetFlag(FLAGS_name);
  if (options.name.empty()) options.name = options.address;
  options.devices = *devices;
  options.cuda_support = discovered.support.cuda_built;
  options.rpc_timeout = absl::GetFlag(FLAGS_rpc_timeout);
  options.register_timeout = absl::GetFlag(FLAGS_register_timeout);
  chorus::CoordinatorSession session(options);

  // The signal thread only asks the session to stop; main does the rest.
  std::thread([&session] {
    const int signal = chorus::WaitForTerminationSignal();
    LOG(INFO) << "signal " << signal << ": shutting down";
    session.RequestStop();
  }).detach();

  LOG(INFO) << "chorus-worker \"" << options.name << "\" serving on "
            << options.address << " with devices "
            << absl::StrJoin(options.devices, ",",
                             [](std::string* out, const chorus::Device& d) {
                               out->append(chorus::CanonicalName(d));
                             });
  absl::Status started = session.Start();
  if (absl::IsCancelled(started)) {
    server->server->Shutdown(chorus::DeadlineAfter(absl::Seconds(1)));
    return 0;
  }
  if (!started.ok()) return Fail(started, "registration refused");
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    absl::Status written = chorus::WritePortFile(path, server->port);
    if (!written.ok()) return Fail(written, "cannot write --port_file");
  }

  session.WaitForStopRequest();
  session.Shutdown();
  server->server->Shutdown(chorus::DeadlineAfter(absl::Seconds(2)));
  LOG(INFO) << "chorus-worker stopped";
  return 0;
}
