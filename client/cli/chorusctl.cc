// chorusctl: the command line client of a Chorus cluster.

#include <glog/logging.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "chorus/admin_client.h"
#include "chorus/communicator.h"
#include "client/cli/event_report.h"
#include "client/cli/rank_input.h"
#include "client/cli/trace_report.h"
#include "client/cli/values.h"
#include "common/collective.h"
#include "common/device_proto.h"
#include "common/local_socket_path.h"
#include "common/rank_list.h"
#include "common/security_flags.h"
#include "common/tcp_socket.h"
#include "common/transport_security.h"
#include "server/worker/local/local_worker.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7000",
          "Address of chorus-coordinator, host:port; or several "
          "(host:port,host:port,...) where coordinators run with --etcd: "
          "each call goes to the one that leads.");
ABSL_FLAG(std::optional<absl::Duration>, timeout, std::nullopt,
          "Deadline of each call, 60s when not given; a join or collective "
          "that not every rank reaches by then fails with DEADLINE_EXCEEDED "
          "naming the missing ranks. watch has no deadline unless this flag "
          "is given; with it, watch ends with DEADLINE_EXCEEDED once the time "
          "has passed.");
ABSL_FLAG(std::string, worker, "",
          "Run collectives through the worker daemon whose local API is at "
          "this address: unix:PATH (its --local_socket), 'local' (the "
          "default socket, $XDG_RUNTIME_DIR/chorus/worker.sock or "
          "/tmp/chorus-UID/worker.sock), or host:port (loopback, or with "
          "--tls_dir a client certificate). Empty: chorusctl joins as a "
          "worker of its own, registered with --coordinator (with TLS, under "
          "the name of its worker certificate).");
ABSL_FLAG(std::string, listen, "",
          "Without --worker: where chorusctl's own worker serves its peers, "
          "host:port (port 0 picks one). Default: 0.0.0.0:0 with TLS or "
          "--insecure, else 127.0.0.1:0, which serves only peers on this "
          "host (a coordinator on another host then refuses it). Without "
          "TLS a non-loopback address needs --insecure.");
ABSL_FLAG(std::string, group, "", "Group to join (collective commands).");
ABSL_FLAG(std::string, job, "",
          "trace: the job of --group (empty: the default job); groups and "
          "workers list every job's.");
ABSL_FLAG(int32_t, world, 1, "Number of ranks in the group.");
ABSL_FLAG(int32_t, rank, 0, "This rank, 0 .. world-1.");
ABSL_FLAG(std::string, dtype, "f32",
          "Element type: f16 bf16 f32 f64 i8 u8 i32 i64 u32 u64.");
ABSL_FLAG(std::string, op, "sum", "Reduce op: sum prod min max avg.");
ABSL_FLAG(int32_t, root, 0, "Root rank of reduce, broadcast, gather, scatter.");
ABSL_FLAG(int64_t, count, -1,
          "Collectives: elements per rank block; default: derived from the "
          "values given (needed off the root of broadcast and scatter). "
          "watch: exit after this many events; 0 or less (the default): "
          "until interrupted.");
ABSL_FLAG(std::string, algorithm, "auto",
          "Force a plan: auto, inline, recursive_doubling, ring, same_host "
          "(all_reduce between workers on one host), nccl (every rank on a "
          "GPU of a worker with NCCL, under a coordinator run with "
          "--nccl_plan).");
ABSL_FLAG(bool, json, false,
          "trace: print the entries as JSON (field names as PyTorch's Flight "
          "Recorder uses them) instead of lines and an analysis. watch: print "
          "each event as one JSON object per line.");
ABSL_FLAG(int32_t, recent, 20,
          "trace: how many of the last calls every rank made the straggler "
          "analysis looks at.");
ABSL_FLAG(std::string, input, "",
          "Collectives: read this rank's input from this file instead of "
          "VALUES: raw little-endian elements of --dtype back to back (as "
          "numpy's tofile() writes them); --count is derived from its size "
          "as from VALUES.");
ABSL_FLAG(std::string, fill, "",
          "Collectives: this rank's input is every element this value (of "
          "--dtype), as many as the collective takes for --count, which must "
          "be given; instead of VALUES.");
ABSL_FLAG(std::string, output, "",
          "Collectives: write this rank's output to this file as raw "
          "little-endian elements of --dtype instead of printing it.");
ABSL_FLAG(std::string, device, "cpu",
          "Device this rank's data lives on, e.g. cpu or cuda:0.");

namespace {

// The deadline of every call but watch's: --timeout, or 60 s.
absl::Duration CallTimeout() {
  return absl::GetFlag(FLAGS_timeout).value_or(absl::Seconds(60));
}

constexpr char kUsage[] =
    "Inspects and uses a Chorus cluster.\n"
    "Usage: chorusctl [flags] COMMAND [VALUES...]\n"
    "Commands:\n"
    "  workers      list registered workers: id, name, host, address,\n"
    "               incarnation, lease age and devices\n"
    "  groups       list groups: epoch, completed collectives, members, the\n"
    "               ranks a pending collective is waiting for, and why an\n"
    "               aborted group was aborted; then groups still forming\n"
    "               and the ranks their joins wait for\n"
    "  stalls       list only the collectives and joins waiting for ranks\n"
    "  trace        the coordinator's flight recorder for --group: each\n"
    "               recent collective (who called when, plan, verdict) and\n"
    "               an analysis naming the rank at fault (--json: raw)\n"
    "  watch        print the coordinator's events as they happen, one line\n"
    "               each: workers registered and lost, groups formed and\n"
    "               aborted, stalls started and ended, mismatches, deadlines\n"
    "               (--json: a JSON object per line; --count=N: exit after N\n"
    "               events). It waits for events with no deadline unless\n"
    "               --timeout is given\n"
    "  allreduce reduce broadcast allgather reducescatter gather scatter\n"
    "  alltoall barrier\n"
    "               join --group as --rank of --world and run the collective\n"
    "               on VALUES (this rank's input; or --input=FILE, or\n"
    "               --fill=VALUE with --count); print this rank's output\n"
    "               (or write it to --output=FILE)\n"
    "Example: chorusctl --coordinator=127.0.0.1:7000 --group=g --world=2 \\\n"
    "           --rank=0 --op=sum --dtype=f32 allreduce 1 2 3\n"
    "Values that start with '-' go after --: ... allreduce -- -1 2 3";

int Fail(const absl::Status& status) {
  std::cerr << "chorusctl: "
            << status.ToString(absl::StatusToStringMode::kWithNoExtraData)
            << std::endl;
  return 1;
}

// "cpu,cuda:0", and " (NCCL 2.28.9)" where its GPUs have NCCL.
std::string Devices(const chorus::WorkerInfo& worker) {
  std::string devices = absl::StrJoin(
      worker.devices, ",", [](std::string* out, const chorus::Device& d) {
        out->append(chorus::CanonicalName(d));
      });
  if (worker.nccl_version > 0) {
    const uint32_t v = worker.nccl_version;
    absl::StrAppend(&devices, " (NCCL ", v / 10000, ".", v / 100 % 100, ".",
                    v % 100, ")");
  }
  return devices;
}

// `name`, with its job when that is not the default one: "g (job blue)".
std::string WithJob(const std::string& name, const std::string& job) {
  return job.empty() ? name : absl::StrCat(name, " (job ", job, ")");
}

int ListWorkers(const chorus::AdminClient& client) {
  absl::StatusOr<std::vector<chorus::WorkerInfo>> workers =
      client.ListWorkers();
  if (!workers.ok()) return Fail(workers.status());
  std::cout << absl::StrFormat("%-4s %-24s %-16s %-22s %-20s %-9s %s\n", "ID",
                               "NAME", "HOST", "ADDRESS", "INCARNATION",
                               "LEASE_AGE", "DEVICES");
  for (const chorus::WorkerInfo& w : *workers) {
    std::cout << absl::StrFormat(
        "%-4d %-24s %-16s %-22s %-20d %-9s %s\n", w.id, WithJob(w.name, w.job),
        w.host, w.address, w.incarnation,
        absl::StrCat(absl::ToInt64Milliseconds(w.lease_age), "ms"), Devices(w));
  }
  std::cout << workers->size() << " worker" << (workers->size() == 1 ? "" : "s")
            << std::endl;
  return 0;
}

// A group whose ranks wait in a join: who joined and who is missing.
void PrintForming(const chorus::GroupInfo& g, bool stalls_only) {
  std::cout << "group " << WithJob(g.name, g.job) << ": forming, world "
            << g.world_size << ", " << g.members.size() << " joined; waiting "
            << absl::ToInt64Milliseconds(g.pending) << "ms for "
            << chorus::FormatRanks(g.missing_ranks) << " to join\n";
  if (stalls_only) return;
  for (const chorus::GroupMemberInfo& m : g.members) {
    std::cout << "  rank " << m.rank << ": worker " << m.worker_id << " \""
              << m.worker_name << "\" joined\n";
  }
}

int ListGroups(const chorus::AdminClient& client, bool stalls_only) {
  absl::StatusOr<std::vector<chorus::GroupInfo>> groups = client.ListGroups();
  if (!groups.ok()) return Fail(groups.status());
  int shown = 0;
  for (const chorus::GroupInfo& g : *groups) {
    if (g.forming) {
      ++shown;
      PrintForming(g, stalls_only);
      continue;
    }
    if (stalls_only && g.pending_sequence == 0) continue;
    ++shown;
    std::cout << "group " << WithJob(g.name, g.job) << ": world "
              << g.world_size << ", epoch " << g.epoch << ", " << g.completed
              << " collectives done";
    if (g.min_world_size > 0) {
      std::cout << "; elastic " << g.min_world_size << ".." << g.max_world_size
                << ", " << g.joiners_waiting << " newcomer"
                << (g.joiners_waiting == 1 ? "" : "s") << " waiting";
    }
    if (g.pending_sequence != 0) {
      std::cout << "; #" << g.pending_sequence << " waiting "
                << absl::ToInt64Milliseconds(g.pending) << "ms for "
                << chorus::FormatRanks(g.missing_ranks);
    }
    if (!g.aborted.ok()) std::cout << "; aborted: " << g.aborted.message();
    std::cout << "\n";
    if (stalls_only) continue;
    for (const chorus::GroupMemberInfo& m : g.members) {
      std::cout << "  rank " << m.rank << ": worker " << m.worker_id << " \""
                << m.worker_name << "\" at " << m.address << " "
                << chorus::CanonicalName(m.device) << "\n";
    }
  }
  std::cout << shown << (stalls_only ? " waiting group" : " group")
            << (shown == 1 ? "" : "s") << std::endl;
  return 0;
}

int PrintTrace(const chorus::AdminClient& client) {
  const std::string group = absl::GetFlag(FLAGS_group);
  if (group.empty())
    return Fail(absl::InvalidArgumentError("trace needs --group"));
  absl::StatusOr<std::vector<chorus::TraceEntry>> entries =
      client.Trace(group, absl::GetFlag(FLAGS_job));
  if (!entries.ok()) return Fail(entries.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << chorus::TraceJson(group, *entries);
    return 0;
  }
  std::cout << chorus::FormatTrace(*entries);
  const std::vector<std::string> findings =
      chorus::AnalyzeTrace(*entries, absl::GetFlag(FLAGS_recent), absl::Now());
  std::cout << (findings.empty() ? "analysis: nothing wrong found\n"
                                 : "analysis:\n");
  for (const std::string& finding : findings) {
    std::cout << "  " << finding << "\n";
  }
  std::cout << std::flush;
  return 0;
}

// Prints the coordinator's events as they come, until --count events were
// printed or forever (0 or less).
int Watch(const chorus::AdminClient& client) {
  const int64_t count = absl::GetFlag(FLAGS_count);
  const bool json = absl::GetFlag(FLAGS_json);
  const absl::TimeZone zone = absl::LocalTimeZone();
  chorus::WatchOptions options;
  // A stream that waits for events has no deadline of its own.
  options.timeout =
      absl::GetFlag(FLAGS_timeout).value_or(absl::InfiniteDuration());
  options.on_subscribed = [] {
    std::cerr << "chorusctl: watching the events of "
              << absl::GetFlag(FLAGS_coordinator) << std::endl;
  };
  int64_t printed = 0;
  absl::Status status = client.WatchEvents(
      [&](const chorus::Event& event) {
        std::cout << (json ? chorus::EventJson(event)
                           : chorus::FormatEvent(event, zone))
                  << std::endl;
        return count <= 0 || ++printed < count;
      },
      options);
  if (!status.ok()) return Fail(status);
  return 0;
}

// Derives the per-rank block count from the number of values given.
absl::StatusOr<uint64_t> BlockCount(const chorus::CollectiveSpec& spec,
                                    int world, int rank, size_t values) {
  if (absl::GetFlag(FLAGS_count) >= 0) return absl::GetFlag(FLAGS_count);
  switch (spec.kind) {
    case chorus::CollectiveKind::kReduceScatter:
    case chorus::CollectiveKind::kAllToAll:
    case chorus::CollectiveKind::kScatter:
      if (spec.kind == chorus::CollectiveKind::kScatter && rank != spec.root) {
        return absl::InvalidArgumentError("scatter off the root needs --count");
      }
      if (values % world != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            CollectiveKindName(spec.kind), " needs world x count values; got ",
            values, " for world ", world));
      }
      return values / world;
    case chorus::CollectiveKind::kBroadcast:
      if (rank != spec.root) {
        return absl::InvalidArgumentError(
            "broadcast off the root needs --count");
      }
      return values;
    default:
      return values;
  }
}

// The collective of `kind` on `values` (this rank's input) as --dtype, --op,
// --root and --count describe it. Returns INVALID_ARGUMENT for a flag that
// does not parse or a count the values cannot give.
absl::StatusOr<chorus::CollectiveSpec> SpecFromFlags(
    chorus::CollectiveKind kind, int world, int rank, size_t values) {
  chorus::CollectiveSpec spec;
  spec.kind = kind;
  spec.root = absl::GetFlag(FLAGS_root);
  if (kind == chorus::CollectiveKind::kBarrier) return spec;
  absl::StatusOr<chorus::DType> dtype =
      chorus::ParseDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) return dtype.status();
  spec.dtype = *dtype;
  if (chorus::KindReduces(kind)) {
    absl::StatusOr<chorus::ReduceOp> op =
        chorus::ParseReduceOp(absl::GetFlag(FLAGS_op));
    if (!op.ok()) return op.status();
    spec.op = *op;
  }
  absl::StatusOr<uint64_t> count = BlockCount(spec, world, rank, values);
  if (!count.ok()) return count.status();
  spec.count = *count;
  return spec;
}

// The most bytes --input or --fill makes: a worker's default
// --max_tensor_bytes.
constexpr uint64_t kMaxInputBytes = uint64_t{4} << 30;

// A collective as the flags describe it and this rank's input.
struct RankCall {
  chorus::CollectiveSpec spec;
  std::string input;
};

// The collective of `kind` and this rank's input, from `values` (the
// command line's), --input or --fill, one of them. Returns INVALID_ARGUMENT
// for more than one, a --fill without --count, or SpecFromFlags' reasons;
// ReadElementsFile's and FillElements' errors.
absl::StatusOr<RankCall> CallFromFlags(chorus::CollectiveKind kind, int world,
                                       int rank,
                                       const std::vector<std::string>& values) {
  const std::string file = absl::GetFlag(FLAGS_input);
  const std::string fill = absl::GetFlag(FLAGS_fill);
  if (!values.empty() + !file.empty() + !fill.empty() > 1) {
    return absl::InvalidArgumentError(
        "give this rank's input once: as VALUES, --input or --fill");
  }
  RankCall call;
  size_t given = values.size();
  if (!file.empty()) {
    absl::StatusOr<chorus::DType> dtype =
        chorus::ParseDType(absl::GetFlag(FLAGS_dtype));
    if (!dtype.ok()) return dtype.status();
    absl::StatusOr<std::string> read =
        chorus::ReadElementsFile(file, *dtype, kMaxInputBytes);
    if (!read.ok()) return read.status();
    call.input = *std::move(read);
    given = call.input.size() / chorus::DTypeSize(*dtype);
  } else if (!fill.empty() && absl::GetFlag(FLAGS_count) < 0) {
    return absl::InvalidArgumentError("--fill needs --count");
  }
  absl::StatusOr<chorus::CollectiveSpec> spec =
      SpecFromFlags(kind, world, rank, given);
  if (!spec.ok()) return spec.status();
  call.spec = *spec;
  if (!fill.empty()) {
    const size_t element = chorus::DTypeSize(spec->dtype);
    absl::StatusOr<std::string> filled = chorus::FillElements(
        spec->dtype, fill,
        element == 0 ? 0 : chorus::InputBytes(*spec, world, rank) / element,
        kMaxInputBytes);
    if (!filled.ok()) return filled.status();
    call.input = *std::move(filled);
  } else if (file.empty()) {
    absl::StatusOr<std::string> encoded =
        chorus::EncodeValues(spec->dtype, values);
    if (!encoded.ok()) return encoded.status();
    call.input = *std::move(encoded);
  }
  return call;
}

// Starts chorusctl's own worker for `rank` of `group` with its data on
// `device`, serving its peers on --listen and registered with
// --coordinator. Returns INVALID_ARGUMENT or FAILED_PRECONDITION for a
// --listen that is not allowed, or LocalWorker::Start's errors.
absl::StatusOr<std::unique_ptr<chorus::LocalWorker>> StartOwnWorker(
    const std::string& group, int rank, const chorus::Device& device) {
  chorus::RuntimeOptions options;
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  options.listen = absl::GetFlag(FLAGS_listen);
  if (options.listen.empty()) {
    options.listen = chorus::TlsEnabled() || chorus::InsecureFlag()
                         ? "0.0.0.0:0"
                         : "127.0.0.1:0";
  }
  absl::StatusOr<chorus::HostPort> listen =
      chorus::SplitHostPort(options.listen);
  if (!listen.ok()) return listen.status();
  absl::Status listen_allowed = chorus::CheckPlaintextListen(
      "--listen", listen->host, chorus::InsecureFlag());
  if (!listen_allowed.ok()) return listen_allowed;
  options.name = absl::StrCat("chorusctl-", getpid(), "-", group, "-", rank);
  if (chorus::TlsEnabled() &&
      chorus::OwnIdentity().role == chorus::Role::kWorker) {
    options.name = chorus::OwnIdentity().name;
  }
  options.devices = {device};
  if (device.kind != chorus::DeviceKind::kCpu) {
    options.devices.insert(options.devices.begin(),
                           chorus::JoinOptions::CpuDevice());
  }
  options.register_timeout = CallTimeout();
  chorus::LocalWorkerOptions worker_options;
  worker_options.runtime = std::move(options);
  return chorus::LocalWorker::Start(std::move(worker_options));
}

// Joins `group` as `rank` of `world` with its data on `device`: through
// the daemon --worker names, or else through a worker of chorusctl's own,
// started into `*own_worker` (which must outlive the communicator). Returns
// the communicator, or the errors of the join or of StartOwnWorker().
absl::StatusOr<std::unique_ptr<chorus::Communicator>> JoinFromFlags(
    const std::string& group, int world, int rank, const chorus::Device& device,
    std::unique_ptr<chorus::LocalWorker>* own_worker) {
  chorus::JoinOptions join;
  join.device = device;
  join.timeout = CallTimeout();
  if (std::string worker = absl::GetFlag(FLAGS_worker); !worker.empty()) {
    if (worker == "local") {
      worker = absl::StrCat("unix:", chorus::DefaultLocalSocketPath());
    }
    return chorus::Communicator::JoinThroughDaemon(worker, group, world, rank,
                                                   join);
  }
  absl::StatusOr<std::unique_ptr<chorus::LocalWorker>> started =
      StartOwnWorker(group, rank, device);
  if (!started.ok()) return started.status();
  *own_worker = *std::move(started);
  return chorus::Communicator::JoinEmbedded(own_worker->get(), group, world,
                                            rank, join);
}

// Joins as the flags say, runs the collective of `kind` on `values` and
// prints this rank's output. Returns the exit code.
int RunCollective(chorus::CollectiveKind kind,
                  const std::vector<std::string>& values) {
  const std::string group = absl::GetFlag(FLAGS_group);
  const int world = absl::GetFlag(FLAGS_world);
  const int rank = absl::GetFlag(FLAGS_rank);
  if (group.empty())
    return Fail(absl::InvalidArgumentError("--group is needed"));
  absl::StatusOr<RankCall> call = CallFromFlags(kind, world, rank, values);
  if (!call.ok()) return Fail(call.status());
  const chorus::CollectiveSpec& spec = call->spec;
  absl::StatusOr<chorus::Algorithm> algorithm =
      chorus::ParseAlgorithm(absl::GetFlag(FLAGS_algorithm));
  if (!algorithm.ok()) return Fail(algorithm.status());
  absl::StatusOr<chorus::Device> device =
      chorus::ParseDeviceSpec(absl::GetFlag(FLAGS_device));
  if (!device.ok()) return Fail(device.status());

  std::unique_ptr<chorus::LocalWorker> own_worker;
  absl::StatusOr<std::unique_ptr<chorus::Communicator>> communicator =
      JoinFromFlags(group, world, rank, *device, &own_worker);
  if (!communicator.ok()) return Fail(communicator.status());

  chorus::CallOptions options;
  options.algorithm = *algorithm;
  options.timeout = CallTimeout();
  std::string output;
  absl::StatusOr<chorus::CallResult> result =
      (*communicator)->Run(spec, call->input, &output, options);
  if (!result.ok()) return Fail(result.status());
  std::cerr << "chorusctl: " << chorus::DescribeSpec(spec) << " #"
            << result->sequence << " of group " << group << " epoch "
            << (*communicator)->epoch() << " ran "
            << chorus::AlgorithmName(result->algorithm) << std::endl;
  if (const std::string file = absl::GetFlag(FLAGS_output); !file.empty()) {
    absl::Status written = chorus::WriteElementsFile(file, output);
    if (!written.ok()) return Fail(written);
    std::cerr << "chorusctl: wrote " << output.size() << " bytes to " << file
              << std::endl;
    return 0;
  }
  std::cout << absl::StrJoin(chorus::DecodeValues(spec.dtype, output), " ")
            << std::endl;
  return 0;
}

// Runs `command` (a subcommand or a collective); returns the exit code.
int RunCommand(const std::string& command,
               const std::vector<std::string>& values,
               chorus::AdminClient& client) {
  if (command == "workers") return ListWorkers(client);
  if (command == "groups") return ListGroups(client, false);
  if (command == "stalls") return ListGroups(client, true);
  if (command == "trace") return PrintTrace(client);
  if (command == "watch") return Watch(client);
  absl::StatusOr<chorus::CollectiveKind> kind =
      chorus::ParseCollectiveKind(command);
  if (kind.ok()) return RunCollective(*kind, values);
  std::cerr << "chorusctl: unknown command \"" << command << "\"\n"
            << kUsage << std::endl;
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "chorusctl.cc") ||
           absl::EndsWith(file, "security_flags.cc");
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  // A write to a connection a peer closed fails with EPIPE rather than
  // ending chorusctl (its own worker's connections, gRPC's), as in the
  // daemons (common/daemon.cc).
  signal(SIGPIPE, SIG_IGN);
  // Only warnings and errors of the embedded worker reach the terminal.
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = google::GLOG_WARNING;
  google::InitGoogleLogging(argv[0]);
  if (args.size() < 2) {
    std::cerr << kUsage << std::endl;
    return 2;
  }
  if (absl::StatusOr<std::optional<chorus::Identity>> tls =
          chorus::ApplySecurityFlags();
      !tls.ok()) {
    std::cerr << "chorusctl: "
              << tls.status().ToString(
                     absl::StatusToStringMode::kWithNoExtraData)
              << std::endl;
    return 2;
  }
  const std::string command = args[1];
  std::vector<std::string> values(args.begin() + 2, args.end());
  std::unique_ptr<chorus::AdminClient> client = chorus::AdminClient::Connect(
      absl::GetFlag(FLAGS_coordinator), CallTimeout());
  const int code = RunCommand(command, values, *client);
  // The answer is out. Destroying the last gRPC channel shuts gRPC down,
  // and that can wait for the deadline timer of a call that already failed
  // (seen after a worker was killed: seconds after the status was printed),
  // so chorusctl leaves without tearing anything down; `client` holds a
  // channel until then, so the communicator's, destroyed earlier, is never
  // the last.
  std::cout.flush();
  std::cerr.flush();
  std::_Exit(code);
}
