// chorus-bench: times one collective over a sweep of sizes, in the shape of
// nccl-tests. The parent starts a chorus-coordinator (or uses --coordinator)
// and one process per rank (this binary again, in --rank_worker mode). Each
// rank embeds a WorkerRuntime, joins the group with Communicator::
// JoinEmbedded, runs warm-up and timed calls for every size, checks the
// results against locally computed values and reports its per-iteration
// times to the parent on its stdout; the parent prints one row per size.
//
// time = median over the timed iterations of the slowest rank's wall time
// for that iteration (iterations run back to back, without a barrier between
// them). See bench/README.md.

#include <fcntl.h>
#include <glog/logging.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "bench/bench_process.h"
#include "bench/bench_sweep.h"
#include "bench/bench_util.h"
#include "common/adaptive_spin.h"
#include "common/collective.h"
#include "common/dtype.h"
#include "common/metrics_flags.h"
#include "common/transport_security.h"

#ifndef CHORUS_BENCH_COORDINATOR_BIN
#define CHORUS_BENCH_COORDINATOR_BIN ""
#endif

ABSL_DECLARE_FLAG(bool, collect_metrics);  // metrics_flags.cc

ABSL_FLAG(std::string, collective, "all_reduce",
          "all_reduce, reduce, broadcast, all_gather, reduce_scatter, gather, "
          "scatter, all_to_all or barrier.");
ABSL_FLAG(int32_t, ranks, 4,
          "Number of ranks this chorus-bench runs (one process each).");
ABSL_FLAG(int32_t, world, 0,
          "Ranks in the group, on every host together; 0: --ranks. Larger "
          "than --ranks runs across hosts: start chorus-bench on each host "
          "with the same --coordinator, --group, --world and sweep flags, "
          "and its own --first_rank; each prints the rows of its own "
          "ranks.");
ABSL_FLAG(int32_t, first_rank, 0,
          "The first of the --ranks consecutive ranks this chorus-bench "
          "runs.");
ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "Where each rank's worker serves its peers; across hosts an "
          "address they reach, e.g. 0.0.0.0:0.");
ABSL_FLAG(std::string, min_bytes, "8", "Smallest size, e.g. 8, 1K, 1M.");
ABSL_FLAG(std::string, max_bytes, "64M", "Largest size, e.g. 64M.");
ABSL_FLAG(int32_t, step_factor, 2, "Each size is this many times the last.");
ABSL_FLAG(std::string, dtype, "f32",
          "f16, bf16, f32, f64, i8, u8, i32, i64, u32 or u64.");
ABSL_FLAG(std::string, op, "sum", "sum, prod, min, max or avg.");
ABSL_FLAG(int32_t, root, 0, "Root rank of reduce, broadcast, gather, scatter.");
ABSL_FLAG(std::string, algorithm, "auto",
          "auto (the coordinator chooses), inline, recursive_doubling or "
          "ring.");
ABSL_FLAG(int32_t, iters, 0,
          "Timed iterations per size; 0 adapts them to --time_per_size.");
ABSL_FLAG(int32_t, warmup, -1,
          "Warm-up calls per size; -1: one, plus up to four more that fit "
          "in a tenth of --time_per_size.");
ABSL_FLAG(absl::Duration, time_per_size, absl::Seconds(1),
          "With --iters=0: the timed iterations of one size aim at this.");
ABSL_FLAG(int32_t, min_iters, 3, "With --iters=0: at least this many.");
ABSL_FLAG(int32_t, max_iters, 1000, "With --iters=0: at most this many.");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(60),
          "Deadline of every call (join, collective, registration).");
ABSL_FLAG(bool, check, true,
          "Check the first warm-up and the last timed result of each size.");
ABSL_FLAG(std::string, coordinator, "",
          "Use the chorus-coordinator at this host:port instead of starting "
          "one.");
ABSL_FLAG(std::string, coordinator_bin, "",
          "chorus-coordinator to start; default: the one built next to "
          "chorus-bench.");
ABSL_FLAG(std::string, coordinator_args, "",
          "Extra flags for the started coordinator, space-separated, e.g. "
          "\"--inline_max_bytes=0 --chunk_bytes=4194304\".");
ABSL_FLAG(std::string, format, "table",
          "table (nccl-tests style) or csv (comma-separated rows with the "
          "time spread, for bench/compare; the # lines stay).");
ABSL_FLAG(bool, keep_logs, false,
          "Keep the coordinator's and ranks' logs (kept anyway on failure).");
// Internal: how the parent starts the ranks.
ABSL_FLAG(bool, call_port, true,
          "Ranks send collective calls to the coordinator's call port (plain "
          "TCP frames); false: one unary gRPC call each.");
ABSL_FLAG(bool, check_results, false,
          "Ranks hash their results and the coordinator compares them at "
          "each commit (the workers' --check_results).");
ABSL_FLAG(std::string, tls_certs, "",
          "Run with mutual TLS: a directory made by scripts/dev_certs.sh "
          "with certificates for the coordinator and workers bench-rank0 .. "
          "bench-rank<N-1> (--workers=bench-rank0,...). The call port and the "
          "data plane then run TLS too.");
ABSL_FLAG(std::string, device, "cpu",
          "Where each rank's buffers live: cpu (host memory); cuda (memory "
          "of GPU Cuda(rank mod the GPUs found), passed by pointer, reduced "
          "on the GPU); emulated_cuda (the same on a GPU emulated in host "
          "memory, to test the GPU path where there is none: its times are "
          "not a GPU's).");
ABSL_FLAG(absl::Duration, spin, chorus::kDefaultSpin,
          "How long the ranks' and the started coordinator's waits poll "
          "before they block (their --spin); 0 blocks at once.");
ABSL_FLAG(bool, rank_worker, false, "Internal: run as one rank.");
ABSL_FLAG(int32_t, rank, -1, "Internal: this rank.");
ABSL_FLAG(std::string, group, "",
          "The group to join; default: a new name. Needed across hosts "
          "(--world larger than --ranks), the same on every host.");

namespace chorus::bench {
namespace {

absl::StatusOr<Config> ConfigFromFlags() {
  Config c;
  absl::StatusOr<CollectiveKind> kind =
      ParseCollectiveKind(absl::GetFlag(FLAGS_collective));
  if (!kind.ok()) return kind.status();
  c.kind = *kind;
  absl::StatusOr<DType> dtype = ParseDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) return dtype.status();
  c.dtype = *dtype;
  if (KindReduces(c.kind)) {
    absl::StatusOr<ReduceOp> op = ParseReduceOp(absl::GetFlag(FLAGS_op));
    if (!op.ok()) return op.status();
    c.op = *op;
  } else {
    c.op = ReduceOp::kUnspecified;
  }
  absl::StatusOr<Algorithm> algorithm =
      ParseAlgorithm(absl::GetFlag(FLAGS_algorithm));
  if (!algorithm.ok()) return algorithm.status();
  c.algorithm = *algorithm;
  c.local_ranks = absl::GetFlag(FLAGS_ranks);
  c.world = absl::GetFlag(FLAGS_world);
  if (c.world == 0) c.world = c.local_ranks;
  c.first_rank = absl::GetFlag(FLAGS_first_rank);
  if (c.world < 1 || c.world > 256) {
    return absl::InvalidArgumentError(
        "--world (or --ranks) must be between 1 and 256");
  }
  if (c.local_ranks < 1 || c.first_rank < 0 ||
      c.first_rank + c.local_ranks > c.world) {
    return absl::InvalidArgumentError(
        absl::StrCat("--first_rank=", c.first_rank, " --ranks=", c.local_ranks,
                     " does not fit a group of --world=", c.world, " ranks"));
  }
  if (c.local_ranks < c.world && !absl::GetFlag(FLAGS_rank_worker) &&
      (absl::GetFlag(FLAGS_coordinator).empty() ||
       absl::GetFlag(FLAGS_group).empty())) {
    return absl::InvalidArgumentError(
        "with ranks on several hosts (--world larger than --ranks), every "
        "host's chorus-bench needs the same --coordinator and --group");
  }
  c.root = KindHasRoot(c.kind) ? absl::GetFlag(FLAGS_root) : 0;
  if (c.root < 0 || c.root >= c.world) {
    return absl::InvalidArgumentError("--root must be a rank below --world");
  }
  absl::StatusOr<uint64_t> min_bytes =
      ParseByteSize(absl::GetFlag(FLAGS_min_bytes));
  if (!min_bytes.ok()) return min_bytes.status();
  absl::StatusOr<uint64_t> max_bytes =
      ParseByteSize(absl::GetFlag(FLAGS_max_bytes));
  if (!max_bytes.ok()) return max_bytes.status();
  const int factor = absl::GetFlag(FLAGS_step_factor);
  absl::StatusOr<std::vector<SweepPoint>> sweep =
      MakeSweep(c.kind, c.dtype, c.world, *min_bytes, *max_bytes,
                static_cast<uint64_t>(std::max(factor, 0)));
  if (!sweep.ok()) return sweep.status();
  c.sweep = *std::move(sweep);
  c.iters = absl::GetFlag(FLAGS_iters);
  c.warmup = absl::GetFlag(FLAGS_warmup);
  c.time_per_size = absl::GetFlag(FLAGS_time_per_size);
  c.min_iters = absl::GetFlag(FLAGS_min_iters);
  c.max_iters = absl::GetFlag(FLAGS_max_iters);
  c.timeout = absl::GetFlag(FLAGS_timeout);
  c.check = absl::GetFlag(FLAGS_check);
  absl::Status valid = CheckIterations(c);
  if (!valid.ok()) return valid;
  return c;
}

// ---- Rank processes -------------------------------------------------------

RankSetup RankSetupFromFlags(int rank, const std::string& coordinator,
                             const std::string& group) {
  RankSetup setup;
  setup.rank = rank;
  setup.coordinator = coordinator;
  setup.group = group;
  setup.listen = absl::GetFlag(FLAGS_listen);
  setup.tls_certs = absl::GetFlag(FLAGS_tls_certs);
  setup.device = absl::GetFlag(FLAGS_device);
  setup.call_port = absl::GetFlag(FLAGS_call_port);
  setup.check_results = absl::GetFlag(FLAGS_check_results);
  setup.spin = absl::GetFlag(FLAGS_spin);
  return setup;
}

int RankMain(const Config& c, const char* argv0) {
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv0);
  return RunRankProcess(c, RankSetupFromFlags(absl::GetFlag(FLAGS_rank),
                                              absl::GetFlag(FLAGS_coordinator),
                                              absl::GetFlag(FLAGS_group)));
}

// ---- The parent -----------------------------------------------------------

std::string CoordinatorBinary() {
  return FindCoordinatorBinary(absl::GetFlag(FLAGS_coordinator_bin),
                               CHORUS_BENCH_COORDINATOR_BIN);
}

// The flags a rank process gets besides its rank: everything that shapes
// the run, so every rank computes the same sweep.
std::vector<std::string> RankArgs(int rank, const std::string& coordinator,
                                  const std::string& group) {
  return {
      "--rank_worker",
      absl::StrCat("--rank=", rank),
      absl::StrCat("--coordinator=", coordinator),
      absl::StrCat("--group=", group),
      absl::StrCat("--collective=", absl::GetFlag(FLAGS_collective)),
      absl::StrCat("--ranks=", absl::GetFlag(FLAGS_ranks)),
      absl::StrCat("--world=", absl::GetFlag(FLAGS_world)),
      absl::StrCat("--first_rank=", absl::GetFlag(FLAGS_first_rank)),
      absl::StrCat("--listen=", absl::GetFlag(FLAGS_listen)),
      absl::StrCat("--min_bytes=", absl::GetFlag(FLAGS_min_bytes)),
      absl::StrCat("--max_bytes=", absl::GetFlag(FLAGS_max_bytes)),
      absl::StrCat("--step_factor=", absl::GetFlag(FLAGS_step_factor)),
      absl::StrCat("--dtype=", absl::GetFlag(FLAGS_dtype)),
      absl::StrCat("--op=", absl::GetFlag(FLAGS_op)),
      absl::StrCat("--root=", absl::GetFlag(FLAGS_root)),
      absl::StrCat("--algorithm=", absl::GetFlag(FLAGS_algorithm)),
      absl::StrCat("--device=", absl::GetFlag(FLAGS_device)),
      absl::StrCat("--tls_certs=", absl::GetFlag(FLAGS_tls_certs)),
      absl::StrCat("--call_port=",
                   absl::GetFlag(FLAGS_call_port) ? "true" : "false"),
      absl::StrCat("--check_results=",
                   absl::GetFlag(FLAGS_check_results) ? "true" : "false"),
      absl::StrCat("--spin=", absl::FormatDuration(absl::GetFlag(FLAGS_spin))),
      absl::StrCat("--collect_metrics=",
                   absl::GetFlag(FLAGS_collect_metrics) ? "true" : "false"),
      absl::StrCat("--iters=", absl::GetFlag(FLAGS_iters)),
      absl::StrCat("--warmup=", absl::GetFlag(FLAGS_warmup)),
      absl::StrCat("--time_per_size=",
                   absl::FormatDuration(absl::GetFlag(FLAGS_time_per_size))),
      absl::StrCat("--min_iters=", absl::GetFlag(FLAGS_min_iters)),
      absl::StrCat("--max_iters=", absl::GetFlag(FLAGS_max_iters)),
      absl::StrCat("--timeout=",
                   absl::FormatDuration(absl::GetFlag(FLAGS_timeout))),
      absl::StrCat("--check=", absl::GetFlag(FLAGS_check) ? "true" : "false"),
  };
}

// One rank process as the parent sees it.
struct RankChild {
  std::unique_ptr<ChildProcess> process;
  std::string pending;  // bytes read but not yet a whole line
  bool done = false;    // sent "done"
  bool eof = false;
};

class Parent {
 public:
  explicit Parent(const Config& c) : c_(c), reports_(c.sweep.size()) {}

  // Runs the benchmark; returns the exit code.
  int Run() {
    absl::Status status = RunInner();
    if (!status.ok()) {
      std::fprintf(
          stderr, "chorus-bench: %s\n",
          status.ToString(absl::StatusToStringMode::kWithNoExtraData).c_str());
    }
    Cleanup(status.ok());
    return status.ok() && !wrong_ ? 0 : 1;
  }

 private:
  absl::Status RunInner() {
    absl::StatusOr<int> signals = InstallSignalPipe();
    if (!signals.ok()) return signals.status();
    signal_fd_ = *signals;
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "chorus-bench.XXXXXX")
            .string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      return absl::InternalError(
          absl::StrCat("mkdtemp: ", std::strerror(errno)));
    }
    dir_ = tmpl;

    std::string address = absl::GetFlag(FLAGS_coordinator);
    if (address.empty()) {
      absl::StatusOr<std::string> started = StartCoordinator();
      if (!started.ok()) return started.status();
      address = *started;
    }
    std::string group = absl::GetFlag(FLAGS_group);
    if (group.empty()) {
      group = absl::StrCat("chorus-bench-", getpid(), "-",
                           absl::ToUnixMicros(absl::Now()) % 1000000000);
    }
    PrintPreamble(address);

    const std::string self = SelfExecutable();
    if (self.empty()) return absl::InternalError("cannot find my own binary");
    for (int r = c_.first_rank; r < c_.first_rank + c_.local_ranks; ++r) {
      SpawnOptions spawn;
      spawn.binary = self;
      spawn.args = RankArgs(r, address, group);
      spawn.log_path = absl::StrCat(dir_, "/rank-", r, ".log");
      spawn.capture_stdout = true;
      absl::StatusOr<std::unique_ptr<ChildProcess>> child =
          ChildProcess::Spawn(spawn);
      if (!child.ok()) return child.status();
      ranks_.push_back(RankChild{*std::move(child), "", false, false});
    }
    std::fputs(csv_ ? CsvHeader().c_str() : TableHeader().c_str(), stdout);
    std::fflush(stdout);
    absl::Status collected = Collect();
    if (!collected.ok()) return collected;
    PrintSummary();
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> StartCoordinator() {
    const std::string port_file = dir_ + "/coordinator.port";
    SpawnOptions spawn;
    spawn.binary = CoordinatorBinary();
    spawn.args = {"--listen=127.0.0.1:0", "--port_file=" + port_file,
                  absl::StrCat("--spin=", absl::FormatDuration(
                                              absl::GetFlag(FLAGS_spin)))};
    if (const std::string certs = absl::GetFlag(FLAGS_tls_certs);
        !certs.empty()) {
      spawn.args.push_back(absl::StrCat("--tls_dir=", certs, "/coordinator"));
    }
    for (absl::string_view arg : absl::StrSplit(
             absl::GetFlag(FLAGS_coordinator_args), ' ', absl::SkipEmpty())) {
      spawn.args.emplace_back(arg);
    }
    spawn.log_path = dir_ + "/coordinator.log";
    absl::StatusOr<std::unique_ptr<ChildProcess>> child =
        ChildProcess::Spawn(spawn);
    if (!child.ok()) {
      return absl::Status(
          child.status().code(),
          absl::StrCat(child.status().message(), " (set --coordinator_bin)"));
    }
    coordinator_ = *std::move(child);
    absl::StatusOr<int> port =
        WaitForPortFile(*coordinator_, port_file, absl::Seconds(30),
                        [] { return SignalCaught() != 0; });
    if (!port.ok()) return port.status();
    coordinator_description_ =
        absl::StrCat(spawn.binary, " ", absl::StrJoin(spawn.args, " "));
    return absl::StrCat("127.0.0.1:", *port);
  }

  void PrintPreamble(const std::string& address) {
    const std::string op =
        KindReduces(c_.kind) ? std::string(ReduceOpName(c_.op)) : "none";
    const std::string root =
        KindHasRoot(c_.kind) ? absl::StrCat(", root ", c_.root) : "";
    const std::string coordinator =
        coordinator_ != nullptr
            ? absl::StrCat(" (started: ", coordinator_description_, ")")
            : " (given)";
    const std::string iters =
        c_.iters > 0
            ? absl::StrCat(c_.iters)
            : absl::StrCat("adaptive (", absl::FormatDuration(c_.time_per_size),
                           " per size, ", c_.min_iters, "..", c_.max_iters,
                           ")");
    const std::string warmup =
        c_.warmup >= 0 ? absl::StrCat(c_.warmup) : "auto (1..5)";
    const bool split = c_.local_ranks < c_.world;
    const std::string ranks =
        split ? absl::StrCat(c_.world, " ranks, ranks ", c_.first_rank, "..",
                             c_.first_rank + c_.local_ranks - 1, " here")
              : absl::StrCat(c_.world, " ranks");
    std::printf(
        "# chorus-bench: %s, %s (one process each, embedded "
        "WorkerRuntime), dtype %s, op %s%s, algorithm %s\n",
        std::string(CollectiveKindName(c_.kind)).c_str(), ranks.c_str(),
        std::string(DTypeName(c_.dtype)).c_str(), op.c_str(), root.c_str(),
        std::string(AlgorithmName(c_.algorithm)).c_str());
    std::printf("# coordinator %s%s\n", address.c_str(), coordinator.c_str());
    std::printf(
        "# iterations: %s, warm-up: %s\n"
        "# time = median over iterations of the slowest %s time; "
        "algbw = size/time; busbw = algbw x %.3f\n#\n",
        iters.c_str(), warmup.c_str(), split ? "local rank's" : "rank's",
        BusBandwidthFactor(c_.kind, c_.world));
    std::fflush(stdout);
  }

  // Reads the ranks' reports until every rank said "done" and exited.
  absl::Status Collect() {
    // Every call has a deadline, so a rank reports or fails within a few of
    // them; this only catches a rank that stopped without either.
    const absl::Duration stall_limit = 3 * c_.timeout + absl::Seconds(60);
    absl::Time last_progress = absl::Now();
    while (true) {
      std::vector<pollfd> fds;
      std::vector<int> owner;
      for (size_t r = 0; r < ranks_.size(); ++r) {
        if (!ranks_[r].eof) {
          fds.push_back({ranks_[r].process->stdout_fd(), POLLIN, 0});
          owner.push_back(static_cast<int>(r));
        }
      }
      if (fds.empty()) break;
      fds.push_back({signal_fd_, POLLIN, 0});
      const absl::Duration left = last_progress + stall_limit - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError(absl::StrCat(
            "no rank reported for ", absl::FormatDuration(stall_limit)));
      }
      const int ready = poll(fds.data(), fds.size(),
                             static_cast<int>(std::min<int64_t>(
                                 absl::ToInt64Milliseconds(left) + 1, 60'000)));
      if (ready < 0 && errno != EINTR) {
        return absl::InternalError(
            absl::StrCat("poll: ", std::strerror(errno)));
      }
      if (const int caught = SignalCaught(); caught != 0) {
        return absl::CancelledError(
            absl::StrCat("interrupted by signal ", caught));
      }
      for (size_t i = 0; i < owner.size(); ++i) {
        if (fds[i].revents == 0) continue;
        last_progress = absl::Now();
        absl::Status read = ReadRank(owner[i]);
        if (!read.ok()) return read;
      }
    }
    return absl::OkStatus();
  }

  // Reads what rank `r` wrote; handles whole lines and its exit.
  absl::Status ReadRank(int r) {
    RankChild& rank = ranks_[r];
    char buffer[1 << 16];
    while (true) {
      const ssize_t n = read(rank.process->stdout_fd(), buffer, sizeof(buffer));
      if (n > 0) {
        rank.pending.append(buffer, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      rank.eof = true;  // n == 0, or an error we treat as the end
      break;
    }
    size_t newline;
    while ((newline = rank.pending.find('\n')) != std::string::npos) {
      const std::string line = rank.pending.substr(0, newline);
      rank.pending.erase(0, newline + 1);
      absl::Status handled = HandleLine(r, line);
      if (!handled.ok()) return handled;
    }
    if (!rank.eof) return absl::OkStatus();
    rank.process->CloseStdout();
    absl::StatusOr<int> code = rank.process->WaitForExit(absl::Seconds(30));
    if (!code.ok()) {
      return absl::InternalError(
          absl::StrCat("rank ", c_.first_rank + r,
                       " closed its report pipe but does not exit"));
    }
    if (*code != 0 || !rank.done) {
      return absl::InternalError(
          absl::StrCat("rank ", c_.first_rank + r, " exited with code ", *code,
                       rank.done ? "" : " before finishing",
                       "; its log ends:\n", rank.process->LogTail()));
    }
    return absl::OkStatus();
  }

  absl::Status HandleLine(int r, absl::string_view line) {
    if (line == "done") {
      ranks_[r].done = true;
      return absl::OkStatus();
    }
    if (absl::ConsumePrefix(&line, "error ")) {
      return absl::AbortedError(
          absl::StrCat("rank ", c_.first_rank + r, " failed: ", line));
    }
    absl::StatusOr<RankReport> report = ParseReport(line);
    if (!report.ok()) return report.status();
    if (report->point < 0 ||
        report->point >= static_cast<int>(reports_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", c_.first_rank + r,
                                                     " reported unknown point ",
                                                     report->point));
    }
    reports_[report->point].push_back(*std::move(report));
    // Rows print in order, each once every rank reported it.
    while (next_row_ < reports_.size() &&
           static_cast<int>(reports_[next_row_].size()) == c_.local_ranks) {
      absl::StatusOr<Row> row =
          CombineReports(reports_[next_row_], c_.kind, c_.world);
      if (!row.ok()) return row.status();
      const std::string op =
          KindReduces(c_.kind) ? std::string(ReduceOpName(c_.op)) : "none";
      std::fputs(csv_ ? FormatCsvRow(*row).c_str()
                      : FormatRow(*row, DTypeName(c_.dtype), op).c_str(),
                 stdout);
      std::fflush(stdout);
      rows_.push_back(*row);
      reports_[next_row_].clear();
      ++next_row_;
    }
    return absl::OkStatus();
  }

  void PrintSummary() {
    double busbw = 0;
    uint64_t wrong = 0;
    for (const Row& row : rows_) {
      busbw += row.busbw_gbps;
      wrong += row.wrong;
    }
    std::printf("# wrong elements in total: %llu%s\n",
                static_cast<unsigned long long>(wrong),
                c_.check ? "" : " (checks off)");
    std::printf("# average bus bandwidth: %.3f GB/s\n",
                rows_.empty() ? 0.0 : busbw / rows_.size());
    std::fflush(stdout);
    if (wrong > 0) {
      std::fprintf(stderr, "chorus-bench: %llu wrong elements\n",
                   static_cast<unsigned long long>(wrong));
      wrong_ = true;
    }
  }

  // Kills what still runs, stops the coordinator, removes the logs unless
  // they are wanted.
  void Cleanup(bool ok) {
    for (RankChild& rank : ranks_) rank.process->Stop(absl::ZeroDuration());
    if (coordinator_ != nullptr) coordinator_->Stop(absl::Seconds(5));
    if (dir_.empty()) return;
    if (ok && !wrong_ && !absl::GetFlag(FLAGS_keep_logs)) {
      std::error_code ignored;
      std::filesystem::remove_all(dir_, ignored);
    } else {
      std::fprintf(stderr, "chorus-bench: logs kept in %s\n", dir_.c_str());
    }
  }

  const Config& c_;
  const bool csv_ = absl::GetFlag(FLAGS_format) == "csv";
  std::string dir_;
  // Read end of the pipe termination signals write to (InstallSignalPipe).
  int signal_fd_ = -1;
  std::unique_ptr<ChildProcess> coordinator_;
  std::string coordinator_description_;
  std::vector<RankChild> ranks_;
  std::vector<std::vector<RankReport>> reports_;  // per point, until printed
  size_t next_row_ = 0;
  std::vector<Row> rows_;
  bool wrong_ = false;
};

}  // namespace
}  // namespace chorus::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "chorus-bench: times a Chorus collective over a sweep of sizes, one "
      "process per rank, and prints one row per size.\n"
      "Usage: chorus-bench --collective=all_reduce --ranks=4 --min_bytes=8 "
      "--max_bytes=64M --dtype=f32 --op=sum [--algorithm=auto|inline|"
      "recursive_doubling|ring] [--iters=N --warmup=N] [--coordinator=ADDR]\n"
      "--collect_metrics=false: the ranks count no metrics (to measure what "
      "counting costs; bench/metrics_cost.sh).");
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "chorus_bench.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);

  absl::StatusOr<chorus::bench::Config> config =
      chorus::bench::ConfigFromFlags();
  if (!config.ok()) {
    std::fprintf(stderr, "chorus-bench: %s\n",
                 config.status()
                     .ToString(absl::StatusToStringMode::kWithNoExtraData)
                     .c_str());
    return 2;
  }
  const std::string format = absl::GetFlag(FLAGS_format);
  if (format != "table" && format != "csv") {
    std::fprintf(stderr, "chorus-bench: --format must be table or csv\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_rank_worker)) {
    return chorus::bench::RankMain(*config, argv[0]);
  }
  chorus::bench::Parent parent(*config);
  return parent.Run();
}
