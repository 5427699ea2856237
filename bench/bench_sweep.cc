#include "bench/bench_sweep.h"

#include <glog/logging.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "bench/bench_data.h"
#include "common/dtype.h"
#include "common/half.h"
#include "common/metrics_flags.h"
#include "common/transport_security.h"
#include "server/worker/local/local_worker.h"

namespace chorus::bench {

CollectiveSpec SpecFor(const Config& c, uint64_t count) {
  CollectiveSpec spec;
  spec.kind = c.kind;
  spec.dtype = c.dtype;
  spec.count = count;
  spec.op = c.op;
  spec.root = c.root;
  return spec;
}

absl::Status CheckIterations(const Config& c) {
  if (c.iters < 0 || c.warmup < -1 || c.min_iters < 1 ||
      c.max_iters < c.min_iters) {
    return absl::InvalidArgumentError(
        "want --iters >= 0, --warmup >= -1 and 1 <= --min_iters <= "
        "--max_iters");
  }
  if (c.iters == 0 && c.warmup == 0) {
    return absl::InvalidArgumentError(
        "--iters=0 sizes the iterations from the warm-up; give --warmup >= 1 "
        "or a fixed --iters");
  }
  if (c.timeout <= absl::ZeroDuration() ||
      c.time_per_size <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--timeout and --time_per_size must be positive");
  }
  return absl::OkStatus();
}

absl::Status ReportLine(const std::string& line) {
  const std::string text = line + "\n";
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n =
        write(STDOUT_FILENO, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InternalError(
          absl::StrCat("cannot report to the parent: ", std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

namespace {

using SteadyClock = std::chrono::steady_clock;

// The largest of every rank's `value`, through an inline all-reduce (so the
// ranks derive the same iteration counts from their own measurements).
absl::StatusOr<int64_t> AgreeMax(Communicator& comm, int64_t value,
                                 absl::Duration timeout) {
  CallOptions options;
  options.algorithm = Algorithm::kInline;
  options.timeout = timeout;
  std::vector<int64_t> out;
  absl::Status status = comm.AllReduce(std::vector<int64_t>{value}, &out,
                                       ReduceOp::kMax, options);
  if (!status.ok()) return status;
  if (out.size() != 1) return absl::InternalError("agreement lost its value");
  return out[0];
}

// One timed call.
struct Timed {
  int64_t ns = 0;
  Algorithm plan = Algorithm::kUnspecified;
};

// One point of the sweep on one rank: its call, timed, and its check.
template <typename T>
class Point {
 public:
  Point(Communicator& comm, BenchDevice& device, const Config& c,
        const CollectiveSpec& spec, absl::string_view input,
        std::string* output)
      : comm_(comm),
        device_(device),
        c_(c),
        spec_(spec),
        input_(input),
        output_(output) {
    options_.algorithm = c.algorithm;
    options_.timeout = c.timeout;
  }

  // Runs the call once; its error names the size.
  absl::StatusOr<Timed> RunOnce() {
    const SteadyClock::time_point start = SteadyClock::now();
    absl::StatusOr<CallResult> result =
        device_.Run(comm_, spec_, input_, output_, options_);
    const SteadyClock::time_point end = SteadyClock::now();
    if (!result.ok()) {
      return absl::Status(
          result.status().code(),
          absl::StrCat(DescribeSpec(spec_), ": ", result.status().message()));
    }
    return Timed{
        std::chrono::duration_cast<std::chrono::nanoseconds>(end - start)
            .count(),
        result->algorithm};
  }

  // The wrong elements of the last call's output (0 without --check).
  absl::StatusOr<uint64_t> CountWrongOutput() {
    if (!c_.check) return 0;
    const int world = comm_.world_size();
    const int rank = comm_.rank();
    absl::Status read =
        device_.ReadOutput(OutputBytes(spec_, world, rank), output_);
    if (!read.ok()) return read;
    return CountWrong<T>(spec_, world, rank, *output_);
  }

 private:
  Communicator& comm_;
  BenchDevice& device_;
  const Config& c_;
  const CollectiveSpec spec_;
  const absl::string_view input_;
  std::string* const output_;
  CallOptions options_;
};

// The warm-up calls of `point` (their wrong elements added to `report`).
// Returns the time of one call every rank agreed on (ns), 0 without
// warm-up.
template <typename T>
absl::StatusOr<int64_t> WarmUp(Point<T>& point, Communicator& comm,
                               const Config& c, RankReport* report) {
  if (c.warmup == 0) return 0;
  // The first call also estimates the time of one call.
  absl::StatusOr<Timed> first = point.RunOnce();
  if (!first.ok()) return first.status();
  absl::StatusOr<uint64_t> wrong = point.CountWrongOutput();
  if (!wrong.ok()) return wrong.status();
  report->wrong += *wrong;
  absl::StatusOr<int64_t> agreed = AgreeMax(comm, first->ns, c.timeout);
  if (!agreed.ok()) return agreed.status();
  int64_t estimate_ns = std::max<int64_t>(1, *agreed);
  const int extra =
      c.warmup > 0 ? c.warmup - 1
                   : static_cast<int>(std::min<int64_t>(
                         4, absl::ToInt64Nanoseconds(c.time_per_size / 10) /
                                estimate_ns));
  if (extra <= 0) return estimate_ns;
  int64_t total = 0;
  for (int i = 0; i < extra; ++i) {
    absl::StatusOr<Timed> t = point.RunOnce();
    if (!t.ok()) return t.status();
    total += t->ns;
  }
  agreed = AgreeMax(comm, total / extra, c.timeout);
  if (!agreed.ok()) return agreed.status();
  return std::max<int64_t>(1, *agreed);
}

// Warms `point` up, then runs its timed calls into `report`.
template <typename T>
absl::Status Measure(Point<T>& point, Communicator& comm, const Config& c,
                     RankReport* report) {
  absl::StatusOr<int64_t> estimate_ns = WarmUp(point, comm, c, report);
  if (!estimate_ns.ok()) return estimate_ns.status();
  // Every rank computes the same count from the agreed estimate.
  const int iters = c.iters > 0
                        ? c.iters
                        : static_cast<int>(std::clamp<int64_t>(
                              absl::ToInt64Nanoseconds(c.time_per_size) /
                                  std::max<int64_t>(1, *estimate_ns),
                              c.min_iters, c.max_iters));
  CallOptions barrier_options;
  barrier_options.timeout = c.timeout;
  absl::Status synced = comm.Barrier(barrier_options);
  if (!synced.ok()) return synced;
  Algorithm plan = Algorithm::kUnspecified;
  report->times_ns.reserve(iters);
  for (int i = 0; i < iters; ++i) {
    absl::StatusOr<Timed> t = point.RunOnce();
    if (!t.ok()) return t.status();
    report->times_ns.push_back(t->ns);
    plan = t->plan;
  }
  absl::StatusOr<uint64_t> wrong = point.CountWrongOutput();
  if (!wrong.ok()) return wrong.status();
  report->wrong += *wrong;
  report->plan = std::string(AlgorithmName(plan));
  return absl::OkStatus();
}

// Runs every point of the sweep with element type T and reports each.
template <typename T>
absl::Status RunSweep(Communicator& comm, BenchDevice& device,
                      const Config& c) {
  const int rank = comm.rank();
  const int world = comm.world_size();
  uint64_t max_input = 0;
  uint64_t max_output = 0;
  for (const SweepPoint& p : c.sweep) {
    const CollectiveSpec spec = SpecFor(c, p.count);
    max_input = std::max(max_input, InputBytes(spec, world, rank));
    max_output = std::max(max_output, OutputBytes(spec, world, rank));
  }
  // Inputs never change: fill the largest once and pass prefixes.
  std::vector<T> input(max_input / sizeof(T));
  FillInput(c.kind, c.op, rank, input);
  if (absl::Status loaded = device.Load(
          absl::string_view(reinterpret_cast<const char*>(input.data()),
                            max_input),
          max_output);
      !loaded.ok()) {
    return loaded;
  }
  std::string output;
  for (size_t k = 0; k < c.sweep.size(); ++k) {
    const CollectiveSpec spec = SpecFor(c, c.sweep[k].count);
    Point<T> point(
        comm, device, c, spec,
        absl::string_view(reinterpret_cast<const char*>(input.data()),
                          InputBytes(spec, world, rank)),
        &output);
    RankReport report;
    report.point = static_cast<int>(k);
    report.bytes = c.sweep[k].bytes;
    report.count = c.sweep[k].count;
    if (absl::Status measured = Measure(point, comm, c, &report);
        !measured.ok()) {
      return measured;
    }
    if (absl::Status sent = ReportLine(FormatReport(report)); !sent.ok()) {
      return sent;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunSweepForDType(Communicator& comm, BenchDevice& device,
                              const Config& c) {
  switch (c.dtype) {
    case DType::kF16:
      return RunSweep<Float16>(comm, device, c);
    case DType::kBF16:
      return RunSweep<BFloat16>(comm, device, c);
    case DType::kF32:
      return RunSweep<float>(comm, device, c);
    case DType::kF64:
      return RunSweep<double>(comm, device, c);
    case DType::kI8:
      return RunSweep<int8_t>(comm, device, c);
    case DType::kU8:
      return RunSweep<uint8_t>(comm, device, c);
    case DType::kI32:
      return RunSweep<int32_t>(comm, device, c);
    case DType::kI64:
      return RunSweep<int64_t>(comm, device, c);
    case DType::kU32:
      return RunSweep<uint32_t>(comm, device, c);
    case DType::kU64:
      return RunSweep<uint64_t>(comm, device, c);
    default:
      return absl::InvalidArgumentError("unsupported dtype");
  }
}
absl::Status RunRank(const Config& c, const RankSetup& setup) {
  const int rank = setup.rank;
  RuntimeOptions options;
  options.coordinator = setup.coordinator;
  options.listen = setup.listen;
  options.name = absl::StrCat(setup.group, "-rank", rank);
  if (!setup.tls_certs.empty()) {
    absl::StatusOr<Identity> identity = EnableTls(TlsFilesInDir(
        absl::StrCat(setup.tls_certs, "/worker-bench-rank", rank)));
    if (!identity.ok()) return identity.status();
    options.name = identity->name;
  }
  absl::StatusOr<std::unique_ptr<BenchDevice>> device =
      BenchDevice::Create(setup.device, rank);
  if (!device.ok()) return device.status();
  options.devices = {JoinOptions::CpuDevice()};
  if ((*device)->device().kind != DeviceKind::kCpu) {
    options.devices.push_back((*device)->device());
  }
  options.device_runtime = (*device)->worker_runtime();
  options.register_timeout = c.timeout;
  options.call_port = setup.call_port;
  options.check_results = setup.check_results;
  options.spin = setup.spin;
  ApplyCollectMetricsFlag();
  LocalWorkerOptions worker_options;
  worker_options.runtime = std::move(options);
  absl::StatusOr<std::unique_ptr<LocalWorker>> worker =
      LocalWorker::Start(std::move(worker_options));
  if (!worker.ok()) return worker.status();
  absl::Status status;
  {
    JoinOptions join;
    join.timeout = c.timeout;
    join.device = (*device)->device();
    absl::StatusOr<std::unique_ptr<Communicator>> comm =
        Communicator::JoinEmbedded(worker->get(), setup.group, c.world, rank,
                                   join);
    if (!comm.ok()) return comm.status();
    status = RunSweepForDType(**comm, **device, c);
  }
  (*worker)->Shutdown();
  return status;
}

int RunRankProcess(const Config& c, const RankSetup& setup) {
  const int rank = setup.rank;
  absl::Status status =
      rank < 0 || rank >= c.world || setup.coordinator.empty() ||
              setup.group.empty()
          ? absl::InvalidArgumentError(
                "--rank_worker needs --rank, --coordinator and --group")
          : RunRank(c, setup);
  if (!status.ok()) {
    std::string message =
        status.ToString(absl::StatusToStringMode::kWithNoExtraData);
    LOG(ERROR) << "rank " << rank << ": " << message;
    std::replace(message.begin(), message.end(), '\n', ' ');
    (void)ReportLine("error " + message);
    return 1;
  }
  return ReportLine("done").ok() ? 0 : 1;
}

}  // namespace chorus::bench
