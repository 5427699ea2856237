// chorus-coordinator: the cluster's registry of workers and devices.

#include <glog/logging.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/adaptive_spin.h"
#include "common/clock.h"
#include "common/daemon.h"
#include "common/metrics_flags.h"
#include "common/net.h"
#include "common/security_flags.h"
#include "common/tcp_socket.h"
#include "server/coordinator/call_port.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_metrics.h"
#include "server/coordinator/coordinator_service.h"
#include "server/coordinator/election/election_flags.h"
#include "server/coordinator/planner.h"
#include "server/coordinator/status_page.h"

ABSL_FLAG(std::string, listen, "",
          "Address to serve on, host:port; port 0 picks a free port. "
          "Default: 0.0.0.0:7000 (every interface) with TLS or --insecure, "
          "else 127.0.0.1:7000. Without TLS a non-loopback address is "
          "refused unless --insecure is given.");
ABSL_FLAG(int32_t, call_port, 0,
          "Port of the call port on the --listen host, where workers send "
          "collective calls as frames on one TCP connection (lower latency "
          "than gRPC; mutual TLS with the same certificates when TLS is on); "
          "0 picks a free one, -1 turns it off. Workers learn it when they "
          "register.");
ABSL_FLAG(std::string, port_file, "",
          "If set, write the bound port to this file once serving.");
ABSL_FLAG(absl::Duration, lease_timeout, absl::Seconds(5),
          "A worker that sends no heartbeat for this long is evicted. "
          "Workers heartbeat every quarter of it.");
ABSL_FLAG(uint64_t, inline_max_bytes, chorus::PlannerOptions().inline_max_bytes,
          "Collectives whose payload is at most this many bytes ride with "
          "the call and are computed by the coordinator (one round trip).");
ABSL_FLAG(uint64_t, recursive_doubling_max_bytes,
          chorus::PlannerOptions().recursive_doubling_max_bytes,
          "All-reduces up to this size, in groups of at most "
          "--recursive_doubling_max_ranks, use recursive doubling between the "
          "workers; larger ones a chunked ring.");
ABSL_FLAG(bool, same_host_plan, chorus::PlannerOptions().same_host,
          "Plan all-reduces above --same_host_inline_max_bytes as same_host "
          "(ranks "
          "exchange data through shared memory) when every rank's worker "
          "runs on one host. Workers that cannot map each other's memory "
          "(e.g. ptrace is restricted) fall back to the ring on their own.");
ABSL_FLAG(uint64_t, same_host_inline_max_bytes,
          chorus::PlannerOptions().same_host_inline_max_bytes,
          "In groups planned same_host (see --same_host_plan), all-reduces "
          "ride with the call only up to this many bytes (and "
          "--inline_max_bytes); larger ones use same_host. A smaller "
          "all-reduce is planned same_host too when every rank asks for it "
          "(CollectiveRequest.repeats_same_host: workers with "
          "--bound_same_host ask from a shape's second call, one call at a "
          "time), so that its repetitions run without the coordinator. 0 "
          "plans every all-reduce with data same_host.");
ABSL_FLAG(bool, leader_calls, chorus::PlannerOptions().leader_calls,
          "Groups that are not elastic (and have at most --member_list_max "
          "ranks) run the calls that would be inline at the worker of their "
          "rank 0 instead (plan `leader`), which computes them when every "
          "rank is there within --leader_patience with the same call; the "
          "coordinator "
          "is not asked per call. Any other call (a rank missing, late or on "
          "another plan, calls that differ) goes to the coordinator from "
          "every rank, which judges it as usual. Off by default: a call the "
          "leader ends is not in the flight recorder (chorusctl trace) or the "
          "coordinator's metrics.");
ABSL_FLAG(absl::Duration, leader_patience,
          chorus::PlannerOptions().leader_patience,
          "How long the ranks of a call that agree among themselves wait "
          "for each other before they take it to the coordinator: at rank "
          "0's worker under --leader_calls, and in shared memory when they "
          "repeat a same-host all_reduce (chorus-worker --bound_same_host). "
          "At most a quarter of the call's timeout; 1 ms to 1 h.");
ABSL_FLAG(bool, nccl_plan, chorus::PlannerOptions().nccl,
          "Plan collectives too large for inline as nccl (NCCL moves and "
          "combines the data between the GPUs) when every rank is on a GPU "
          "(Cuda(n), one rank per GPU) of a worker built with NCCL: "
          "all_reduce, broadcast, reduce, all_gather and reduce_scatter in a "
          "type Chorus reduces in as it is. Off by default: NCCL's own "
          "connections are neither authenticated nor encrypted, even when "
          "Chorus runs with TLS.");
ABSL_FLAG(int32_t, recursive_doubling_max_ranks,
          chorus::PlannerOptions().recursive_doubling_max_ranks,
          "Largest group that uses recursive doubling (measured: with 4 ranks "
          "on one host the ring is faster at every size).");
ABSL_FLAG(uint64_t, chunk_bytes, chorus::PlannerOptions().chunk_bytes,
          "Largest data-plane chunk in the plans, 1 byte to 64 MiB; a plan "
          "uses smaller ones (down to 64 KiB) so that each step moves at "
          "least four.");
ABSL_FLAG(int32_t, max_world_size, chorus::GroupTableOptions().max_world_size,
          "Largest group a join may ask for.");
ABSL_FLAG(int32_t, member_list_max, chorus::GroupTableOptions().member_list_max,
          "Groups of at most this many ranks get every member in each join "
          "reply; larger ones only the world size, and workers ask for the "
          "members they talk to (a full list per rank makes a rendezvous "
          "cost ranks * ranks). 0: never list them to workers that can ask.");
ABSL_FLAG(absl::Duration, spin, chorus::kDefaultSpin,
          "How long the call port's serving thread polls for the next frame "
          "before it blocks, yielding its core to any other runnable thread "
          "between polls; shortened while frames keep coming later than "
          "that. Measured: 8-byte all_reduce latency 0.2x at 2 ranks on one "
          "host. 0: block at once.");
ABSL_FLAG(absl::Duration, max_wait, absl::Minutes(10),
          "The longest a join or collective may wait for its peers; also the "
          "deadline of calls whose client set none.");
ABSL_FLAG(absl::Duration, stall_report_after, absl::Seconds(10),
          "Log the ranks a collective is still waiting for once it has "
          "waited this long (also shown live by `chorusctl stalls`).");
ABSL_FLAG(uint64_t, trace_entries, chorus::GroupTableOptions().trace_entries,
          "The flight recorder keeps this many recent collectives of each "
          "group (`chorusctl trace`); 0 turns it off.");
ABSL_FLAG(uint64_t, trace_groups, chorus::GroupTableOptions().trace_groups,
          "The flight recorder keeps the collectives of this many groups, "
          "forgetting the one used longest ago.");
ABSL_FLAG(uint64_t, trace_rank_records,
          chorus::GroupTableOptions().trace_rank_records,
          "Of a large group the flight recorder keeps fewer collectives: as "
          "many as hold this many ranks' records (about 64 bytes each), and "
          "at least the last one; the default keeps 16 calls of a group of "
          "65,536 ranks.");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(2),
          "On SIGTERM, how long in-flight calls may take to finish.");

namespace {

// The core's options as the flags give them; epochs start after
// `first_epoch`.
chorus::CoordinatorOptions CoreOptionsFromFlags(uint64_t first_epoch) {
  chorus::CoordinatorOptions options;
  options.lease_timeout = absl::GetFlag(FLAGS_lease_timeout);
  options.max_wait = absl::GetFlag(FLAGS_max_wait);
  options.stall_report_after = absl::GetFlag(FLAGS_stall_report_after);
  chorus::GroupTableOptions& groups = options.groups;
  groups.max_world_size = absl::GetFlag(FLAGS_max_world_size);
  groups.member_list_max = absl::GetFlag(FLAGS_member_list_max);
  groups.planner.inline_max_bytes = absl::GetFlag(FLAGS_inline_max_bytes);
  groups.planner.recursive_doubling_max_bytes =
      absl::GetFlag(FLAGS_recursive_doubling_max_bytes);
  groups.planner.recursive_doubling_max_ranks =
      absl::GetFlag(FLAGS_recursive_doubling_max_ranks);
  groups.planner.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  groups.planner.same_host = absl::GetFlag(FLAGS_same_host_plan);
  groups.planner.same_host_inline_max_bytes =
      absl::GetFlag(FLAGS_same_host_inline_max_bytes);
  groups.planner.nccl = absl::GetFlag(FLAGS_nccl_plan);
  groups.planner.leader_calls = absl::GetFlag(FLAGS_leader_calls);
  groups.planner.leader_patience = absl::GetFlag(FLAGS_leader_patience);
  groups.first_epoch = first_epoch;
  groups.trace_entries = absl::GetFlag(FLAGS_trace_entries);
  groups.trace_groups = absl::GetFlag(FLAGS_trace_groups);
  groups.trace_rank_records = absl::GetFlag(FLAGS_trace_rank_records);
  return options;
}

// Starts the call port --call_port asks for on the --listen host; null when
// it is off. INVALID_ARGUMENT for a port out of range, or CallPort::Start's
// error.
absl::StatusOr<std::unique_ptr<chorus::CallPort>> StartCallPort(
    chorus::Coordinator* core, const chorus::Leadership* leadership) {
  const int port = absl::GetFlag(FLAGS_call_port);
  if (port == -1) return nullptr;
  if (port < -1 || port > 65535) {
    return absl::InvalidArgumentError(
        "--call_port must be -1 (off), 0 (any) or a port number");
  }
  absl::StatusOr<chorus::HostPort> listen =
      chorus::SplitHostPort(absl::GetFlag(FLAGS_listen));
  if (!listen.ok()) return listen.status();
  return chorus::CallPort::Start(
      listen->host, port, core, chorus::kDefaultMaxMessageBytes,
      chorus::TlsEnabled(), leadership,
      std::max(absl::GetFlag(FLAGS_spin), absl::ZeroDuration()));
}

// Turns on TLS as the flags ask and applies the secure-by-default rule to
// --listen. Returns INVALID_ARGUMENT or FAILED_PRECONDITION saying what to
// change.
absl::Status ConfigureSecurity() {
  absl::StatusOr<std::optional<chorus::Identity>> tls =
      chorus::ApplySecurityFlags();
  if (!tls.ok()) return tls.status();
  if (tls->has_value() && (*tls)->role != chorus::Role::kCoordinator) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the TLS certificate names ", (*tls)->Uri(),
        "; a coordinator needs one that names chorus://coordinator"));
  }
  if (chorus::TlsEnabled() && absl::GetFlag(FLAGS_nccl_plan)) {
    LOG(WARNING) << "--nccl_plan with TLS: the data of collectives planned "
                    "nccl travels over NCCL's own connections, which are "
                    "neither authenticated nor encrypted";
  }
  if (absl::GetFlag(FLAGS_listen).empty()) {
    absl::SetFlag(&FLAGS_listen, chorus::TlsEnabled() || chorus::InsecureFlag()
                                     ? "0.0.0.0:7000"
                                     : "127.0.0.1:7000");
  }
  absl::StatusOr<chorus::HostPort> listen =
      chorus::SplitHostPort(absl::GetFlag(FLAGS_listen));
  if (!listen.ok()) return listen.status();
  return chorus::CheckPlaintextListen("--listen", listen->host,
                                      chorus::InsecureFlag());
}

// Checks the flags the core and the workers' data plane rely on and turns
// on TLS as they ask. Returns INVALID_ARGUMENT or FAILED_PRECONDITION saying
// what to change.
absl::Status CheckFlags() {
  if (absl::GetFlag(FLAGS_lease_timeout) <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--lease_timeout must be positive");
  }
  // Workers refuse data-plane messages over 64 MiB (the gRPC message limit
  // and the TCP data plane's frame limit).
  const uint64_t chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  if (chunk_bytes == 0 || chunk_bytes > (64u << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--chunk_bytes must be between 1 and 64 MiB, not ", chunk_bytes));
  }
  absl::Status election =
      chorus::CheckElectionFlags(absl::GetFlag(FLAGS_lease_timeout));
  if (!election.ok()) return election;
  return ConfigureSecurity();
}

// Exports the gauges and serves the status page (and Prometheus metrics) on
// --metrics_listen, if given. Returns StartMetricsFromFlags' errors.
absl::StatusOr<std::unique_ptr<chorus::HttpEndpoint>> StartStatusPage(
    const chorus::Coordinator& core, const chorus::CallPort* call_port,
    absl::Duration stall_after, const chorus::Election* started) {
  chorus::ExportCoordinatorGauges(&core, call_port, stall_after);
  const chorus::LeaderElection* election = started->election.get();
  if (election != nullptr) chorus::ExportElectionGauges(started);
  return chorus::StartMetricsFromFlags({chorus::HttpPage{
      "/", "text/html; charset=utf-8",
      [&core, election](const std::map<std::string, std::string>&) {
        chorus::StatusPageOptions options;
        if (election != nullptr) options.leadership = election->Describe();
        return chorus::RenderStatusPage(core, options);
      }}});
}

// Stops serving on a termination signal: calls waiting in the core end
// with UNAVAILABLE, then the call port's connections close (their workers
// see UNAVAILABLE), then the gRPC server, which gives calls in flight
// --shutdown_grace.
void ShutDown(chorus::Coordinator& core, chorus::CallPort* call_port,
              grpc::Server& server) {
  core.Shutdown(absl::UnavailableError(
      "the coordinator is shutting down; join the group again once it is "
      "back"));
  if (call_port != nullptr) call_port->Shutdown();
  server.Shutdown(chorus::DeadlineAfter(absl::GetFlag(FLAGS_shutdown_grace)));
}

// The election --etcd asks for (none without it). A leader that lost its
// etcd lease comes back as a standby with nothing of what it decided: a
// fresh run of `command_line`.
absl::StatusOr<chorus::Election> ElectionOf(
    const chorus::CoordinatorOptions& core_options,
    const std::vector<std::string>& command_line) {
  return chorus::ElectionFromFlags(core_options.lease_timeout,
                                   [&command_line](const absl::Status& why) {
                                     LOG(ERROR) << "deposed (" << why.message()
                                                << "); restarting as a standby";
                                     chorus::RestartProcess(command_line);
                                     std::_Exit(3);
                                   });
}

// With --etcd: once elected, the coordinator fences its writes on its
// leader key and takes over the workers and groups the leaders before it
// wrote, before it serves anything.
void TakeOverWhenElected(chorus::Election& election,
                         chorus::Coordinator& core) {
  if (election.election == nullptr) return;
  chorus::EtcdStateLog* state = election.state.get();
  election.election->OnElected([state, &core](int64_t fence) {
    state->SetFence(fence);
    absl::StatusOr<chorus::StoredState> loaded = state->Load();
    if (!loaded.ok()) return loaded.status();
    core.Restore(*loaded);
    return absl::OkStatus();
  });
}

// Logs where the coordinator serves and writes --port_file. Returns
// WritePortFile's error.
absl::Status AnnounceServing(const std::string& listen, int port,
                             absl::Duration lease,
                             const chorus::CallPort* call_port) {
  LOG(INFO) << "chorus-coordinator serving on " << listen << " (port " << port
            << "), lease " << lease
            << (call_port != nullptr
                    ? absl::StrCat(", call port ", call_port->port())
                    : std::string(", no call port"))
            << (chorus::TlsEnabled() ? ", mutual TLS" : ", plaintext");
  const std::string path = absl::GetFlag(FLAGS_port_file);
  return path.empty() ? absl::OkStatus() : chorus::WritePortFile(path, port);
}

// Abseil built without NDEBUG checks every lock for deadlocks in one global
// graph, including the mutexes gRPC creates for each call (about 5% of the
// coordinator's CPU with 1,024 ranks). The unit tests keep checking the
// coordinator's own locks.
void IgnoreLockOrderChecks() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> command_line(argv, argv + argc);
  chorus::InitDaemon(argc, argv,
                     "Keeps the registry of Chorus "
                     "workers and their devices.\n"
                     "Usage: chorus-coordinator --listen=HOST:PORT "
                     "[--lease_timeout=5s] [--port_file=PATH]");
  IgnoreLockOrderChecks();
  if (absl::Status checked = CheckFlags(); !checked.ok()) {
    LOG(ERROR) << checked;
    return 2;
  }

  chorus::Clock* clock = chorus::RealClock::Get();
  chorus::CoordinatorOptions core_options =
      CoreOptionsFromFlags(absl::ToUnixMicros(clock->Now()));
  absl::StatusOr<chorus::Election> election =
      ElectionOf(core_options, command_line);
  if (!election.ok()) {
    LOG(ERROR) << election.status();
    return 2;
  }
  core_options.groups.log = election->state.get();
  core_options.leadership = election->election.get();
  chorus::Coordinator core(clock, core_options);
  TakeOverWhenElected(*election, core);
  const chorus::Leadership* leadership = election->election.get();
  chorus::CoordinatorService service(&core, leadership);

  absl::StatusOr<std::unique_ptr<chorus::CallPort>> call_port =
      StartCallPort(&core, leadership);
  if (!call_port.ok()) {
    LOG(ERROR) << "call port: "
               << call_port.status().ToString(
                      absl::StatusToStringMode::kWithNoExtraData);
    return 1;
  }
  if (*call_port != nullptr) service.SetCallPort((*call_port)->port());

  chorus::ServerOptions options;
  options.listen_address = absl::GetFlag(FLAGS_listen);
  options.services = {&service};
  options.health_names = {chorus::v1::Coordinator::service_full_name()};
  absl::StatusOr<chorus::StartedServer> server = chorus::StartServer(options);
  if (!server.ok()) {
    LOG(ERROR) << server.status().ToString(
        absl::StatusToStringMode::kWithNoExtraData);
    return 1;
  }
  absl::StatusOr<std::unique_ptr<chorus::HttpEndpoint>> metrics =
      StartStatusPage(core, call_port->get(), core_options.stall_report_after,
                      &*election);
  if (!metrics.ok()) {
    LOG(ERROR) << metrics.status().ToString(
        absl::StatusToStringMode::kWithNoExtraData);
    return 2;
  }
  core.StartTimers();
  chorus::StartElection(*election,
                        chorus::SplitHostPort(options.listen_address)
                            .value_or(chorus::HostPort())
                            .host,
                        server->port);
  if (absl::Status announced =
          AnnounceServing(options.listen_address, server->port,
                          core_options.lease_timeout, call_port->get());
      !announced.ok()) {
    LOG(ERROR) << announced;
    return 1;
  }

  const int signal = chorus::WaitForTerminationSignal();
  LOG(INFO) << "signal " << signal << ": shutting down";
  // A leader resigns first: a standby takes over without waiting.
  if (election->election != nullptr) election->election->Stop();
  ShutDown(core, call_port->get(), *server->server);
  metrics->reset();
  LOG(INFO) << "chorus-coordinator stopped";
  return 0;
}
