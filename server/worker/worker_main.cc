// chorus-worker: the daemon that owns a host's devices and registers them
// with the coordinator.

#include <glog/logging.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/adaptive_spin.h"
#include "common/coordinator_target.h"
#include "common/daemon.h"
#include "common/device.h"
#include "common/metrics_flags.h"
#include "common/net.h"
#include "common/security_flags.h"
#include "common/tcp_socket.h"
#include "server/worker/local/call_socket.h"
#include "server/worker/local/local_worker.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7000",
          "Address of chorus-coordinator, host:port; or several "
          "(host:port,host:port,...) where coordinators run with --etcd: the "
          "worker follows the one that leads.");
ABSL_FLAG(std::string, listen, "",
          "Address this worker serves its peers on, host:port; port 0 picks "
          "a free port. Default: 0.0.0.0:0 (every interface) with TLS or "
          "--insecure, else 127.0.0.1:0. Without TLS a non-loopback address "
          "is refused unless --insecure is given. The local API answers "
          "here too, but only callers on loopback, or with TLS a client or "
          "admin certificate.");
ABSL_FLAG(std::string, local_socket, "default",
          "Unix domain socket the local API (which runs collectives as any "
          "rank) is served on, mode 0600: only this user may connect. "
          "'default' is $XDG_RUNTIME_DIR/chorus/worker.sock, or "
          "/tmp/chorus-UID/worker.sock without XDG_RUNTIME_DIR (where "
          "chorusctl and the Python client look when given no worker); "
          "empty turns it off. A socket another live process serves is "
          "refused.");
ABSL_FLAG(bool, local_call_socket, true,
          "Also serve the local API's collectives as plain frames on a second "
          "Unix socket beside --local_socket (its path with .calls "
          "appended, mode 0600): a small collective from Python costs less "
          "there than a gRPC call. Clients learn its path from JoinGroup "
          "and fall back to gRPC without it (as when it cannot be made: "
          "the worker logs why and goes on). Nothing without "
          "--local_socket.");
ABSL_FLAG(std::string, advertise_address, "",
          "Address peers use to reach this worker, host:port or just host "
          "(then with the bound port); default: the listen host and the "
          "bound port; listening on all interfaces, the local address of "
          "this host's route to the coordinator (this machine's hostname "
          "when the coordinator is on a loopback address). The address "
          "chosen is logged at startup. Anything else ends the worker with "
          "INVALID_ARGUMENT.");
ABSL_FLAG(int32_t, data_port, 0,
          "Port of the TCP data plane (on the listen host) that peers send "
          "collective data to; 0 picks a free port. It is registered with the "
          "coordinator, and peers learn it from their group joins.");
ABSL_FLAG(bool, use_call_port, true,
          "Send collective calls, commits and failure reports to the "
          "coordinator's call port (frames on one TCP connection, lower "
          "latency; mutual TLS when TLS is on) when it has one; false sends "
          "one unary gRPC call each.");
ABSL_FLAG(bool, check_results, false,
          "Hash the result of every data-plane all_reduce, all_gather and "
          "broadcast as it is written and have the coordinator compare the "
          "ranks' hashes at the commit: a difference ends the call with "
          "DATA_LOSS on every rank. Every worker of a group must have it on "
          "for the group's calls to be checked. Off by default: it costs a "
          "pass over each output; measured at 64 MiB f32 with 4 ranks on a "
          "2-core machine, +25% under same_host (57-59 ms -> 72-74 ms) and "
          "within run-to-run noise on the TCP ring (bench/README.md).");
ABSL_FLAG(bool, bound_same_host, true,
          "Run an all_reduce between ranks on this host again through the "
          "shared memory of an earlier one without asking the coordinator, "
          "once the coordinator planned same_host for its shape (dtype, "
          "count, op) in the group epoch: the ranks compare their calls in "
          "shared memory and take any call that differs, comes late or "
          "fails to the coordinator, which judges it as any other. Not with "
          "--check_results. An all_reduce small enough to ride with the call "
          "asks the coordinator for such a plan from its shape's second "
          "call. Measured on a 2-core machine (chorus-bench, median time "
          "per call): 1 MiB f32 at 2 ranks 298-1168 us -> 148-158 us, at 4 "
          "ranks 979-1408 -> 276-400 us; 64 KiB at 2 ranks 150-362 -> 23-24 "
          "us; 8 bytes at 2 ranks 33-158 -> about 7 us (bench/README.md). "
          "false: every call asks the coordinator.");
ABSL_FLAG(std::string, name, "",
          "Stable name of this worker; a restarted worker with the same name "
          "replaces its old entry. Default: the name its TLS certificate "
          "gives (chorus://worker/NAME), else the advertised address. With "
          "TLS it must be the certificate's name.");
ABSL_FLAG(std::string, devices, "",
          "Comma-separated devices to register instead of the discovered "
          "ones, e.g. cpu,cuda:0. Any device this worker cannot serve is "
          "refused with UNIMPLEMENTED and the worker exits non-zero.");
ABSL_FLAG(uint64_t, max_shared_bytes, chorus::kDefaultMaxSharedBytes,
          "Most bytes of shared memory regions (WorkerLocal.OpenSharedRegion) "
          "the daemon holds at once for the applications on its host, "
          "through which their collectives read input and write output in "
          "place; memory is used only as it is written, and a region that "
          "took the output of a plan other than same_host also keeps an "
          "output-sized buffer for the next such call. 0 turns shared memory "
          "off (OpenSharedRegion then answers "
          "UNIMPLEMENTED and clients stream instead). Default 16 GiB.");
ABSL_FLAG(uint64_t, max_tensor_bytes, chorus::kDefaultMaxTensorBytes,
          "Largest input or output, in bytes, of one collective an "
          "application streams through the local API (CollectiveChunked) or "
          "runs on shared memory; "
          "a larger one is refused with RESOURCE_EXHAUSTED before it takes "
          "a sequence number. The daemon holds a call's whole input and "
          "output in memory. Default 4 GiB. The unary Collective is bounded "
          "by the 64 MiB gRPC message limit instead.");
ABSL_FLAG(std::string, port_file, "",
          "If set, write the bound port to this file once registered.");
ABSL_FLAG(absl::Duration, rpc_timeout, absl::Seconds(5),
          "Deadline of each call to the coordinator.");
ABSL_FLAG(absl::Duration, spin, chorus::kDefaultSpin,
          "How long a thread waiting for a peer's data, the coordinator's "
          "reply or a client's next call polls before it blocks, yielding "
          "its core to any other runnable thread between polls (a peer's "
          "small data-plane frames it reads off the connection itself, "
          "without TLS); shortened where waits keep running past it. "
          "Measured: 8-byte all_reduce latency 0.2x at 2 ranks on one "
          "host. 0: block at once.");
ABSL_FLAG(absl::Duration, register_timeout, absl::InfiniteDuration(),
          "Give up (exit non-zero) if the coordinator cannot be reached for "
          "this long at start; 'inf' keeps trying.");

namespace {

int Fail(const absl::Status& status, absl::string_view what) {
  std::cerr << "chorus-worker: " << what << ": "
            << status.ToString(absl::StatusToStringMode::kWithNoExtraData)
            << std::endl;
  return 1;
}

// Turns on TLS as the flags ask, settles the worker's name with its
// certificate and applies the secure-by-default rule to --listen. Returns
// INVALID_ARGUMENT or FAILED_PRECONDITION saying what to change.
absl::Status ConfigureSecurity(chorus::RuntimeOptions* options) {
  absl::StatusOr<std::optional<chorus::Identity>> tls =
      chorus::ApplySecurityFlags();
  if (!tls.ok()) return tls.status();
  if (tls->has_value()) {
    const chorus::Identity& identity = **tls;
    if (identity.role != chorus::Role::kWorker) {
      return absl::InvalidArgumentError(
          absl::StrCat("the TLS certificate names ", identity.Uri(),
                       "; a worker needs chorus://worker/NAME"));
    }
    if (options->name.empty()) options->name = identity.name;
    if (options->name != identity.name) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--name=", options->name, " but the TLS certificate names ",
          identity.Uri(), "; the coordinator would refuse the registration"));
    }
  }
  if (options->listen.empty()) {
    options->listen = chorus::TlsEnabled() || chorus::InsecureFlag()
                          ? "0.0.0.0:0"
                          : "127.0.0.1:0";
  }
  absl::StatusOr<chorus::HostPort> listen =
      chorus::SplitHostPort(options->listen);
  if (!listen.ok()) return listen.status();
  return chorus::CheckPlaintextListen("--listen", listen->host,
                                      chorus::InsecureFlag());
}

// The worker's options from its flags. Returns what ConfigureSecurity and
// the device list's parser return.
absl::StatusOr<chorus::LocalWorkerOptions> OptionsFromFlags() {
  chorus::LocalWorkerOptions worker;
  chorus::RuntimeOptions& options = worker.runtime;
  if (const std::string spec = absl::GetFlag(FLAGS_devices); !spec.empty()) {
    absl::StatusOr<std::vector<chorus::Device>> parsed =
        chorus::ParseDeviceList(spec);
    if (!parsed.ok()) return parsed.status();
    options.devices = *std::move(parsed);
  }
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  if (absl::Status listed =
          chorus::CoordinatorTarget::Check(options.coordinator);
      !listed.ok()) {
    return listed;
  }
  options.listen = absl::GetFlag(FLAGS_listen);
  options.advertise_address = absl::GetFlag(FLAGS_advertise_address);
  options.name = absl::GetFlag(FLAGS_name);
  options.data_port = absl::GetFlag(FLAGS_data_port);
  options.call_port = absl::GetFlag(FLAGS_use_call_port);
  options.check_results = absl::GetFlag(FLAGS_check_results);
  options.bound_same_host = absl::GetFlag(FLAGS_bound_same_host);
  options.rpc_timeout = absl::GetFlag(FLAGS_rpc_timeout);
  options.spin = std::max(absl::GetFlag(FLAGS_spin), absl::ZeroDuration());
  options.unix_socket_path = absl::GetFlag(FLAGS_local_socket);
  if (options.unix_socket_path == "default") {
    options.unix_socket_path = chorus::DefaultLocalSocketPath();
  }
  if (absl::Status secured = ConfigureSecurity(&options); !secured.ok()) {
    return secured;
  }
  options.register_timeout = absl::GetFlag(FLAGS_register_timeout);
  worker.max_tensor_bytes = absl::GetFlag(FLAGS_max_tensor_bytes);
  worker.max_shared_bytes = absl::GetFlag(FLAGS_max_shared_bytes);
  worker.call_socket = absl::GetFlag(FLAGS_local_call_socket);
  return worker;
}

// Logs where the worker serves and with which devices.
void LogServing(const chorus::LocalWorkerOptions& options,
                chorus::WorkerRuntime& runtime) {
  const std::string& socket = options.runtime.unix_socket_path;
  LOG(INFO) << "chorus-worker serving on " << runtime.address()
            << (socket.empty() ? std::string()
                               : absl::StrCat(" and unix:", socket))
            << (chorus::TlsEnabled() ? " with mutual TLS" : "")
            << " with devices "
            << absl::StrJoin(runtime.devices(), ",",
                             [](std::string* out, const chorus::Device& d) {
                               out->append(chorus::CanonicalName(d));
                             });
}

}  // namespace

int main(int argc, char** argv) {
  chorus::InitDaemon(
      argc, argv,
      "Registers this host's devices with a Chorus "
      "coordinator, keeps its lease, serves its peers and the local API "
      "applications issue collectives through.\n"
      "Usage: chorus-worker --coordinator=HOST:PORT [--devices=cpu,cuda:0] "
      "[--name=NAME] [--listen=HOST:PORT] [--port_file=PATH]");
  absl::StatusOr<chorus::LocalWorkerOptions> options = OptionsFromFlags();
  if (!options.ok()) return Fail(options.status(), "cannot start");
  absl::StatusOr<std::unique_ptr<chorus::LocalWorker>> created =
      chorus::LocalWorker::Create(*options);
  if (!created.ok()) {
    return Fail(created.status(), chorus::IsDeviceRefusal(created.status())
                                      ? "device refused"
                                      : "cannot start");
  }
  chorus::LocalWorker& worker = **created;
  chorus::WorkerRuntime& runtime = worker.runtime();
  absl::StatusOr<std::unique_ptr<chorus::HttpEndpoint>> metrics =
      chorus::StartMetricsFromFlags({});
  if (!metrics.ok()) return Fail(metrics.status(), "cannot start");

  // The signal thread only asks the runtime to stop; main does the rest.
  std::thread([&runtime] {
    const int signal = chorus::WaitForTerminationSignal();
    LOG(INFO) << "signal " << signal << ": shutting down";
    runtime.RequestStop();
  }).detach();

  LogServing(*options, runtime);
  absl::Status registered = worker.Register();
  if (absl::IsCancelled(registered)) return 0;
  if (!registered.ok()) return Fail(registered, "registration refused");
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    absl::Status written = chorus::WritePortFile(path, runtime.port());
    if (!written.ok()) return Fail(written, "cannot write --port_file");
  }

  runtime.WaitForStopRequest();
  worker.Shutdown();
  metrics->reset();
  LOG(INFO) << "chorus-worker stopped";
  return 0;
}
