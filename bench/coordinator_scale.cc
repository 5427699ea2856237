// chorus-coordinator-scale: how fast one chorus-coordinator serves a large
// group. It starts a coordinator (or uses --coordinator), registers
// simulated workers, has --ranks ranks join one group (the rendezvous) and
// then run --barriers barriers, each rank issuing its next barrier as soon
// as its last one returned. The ranks are simulated in this process over a
// few gRPC connections with the asynchronous callback API, from gRPC's
// callback threads (no thread per rank); every call has a deadline. The
// barriers go as frames on the coordinator's call port, one connection per
// --connections with a thread each that writes every request and reads
// every reply, as workers send their collectives (--transport=unary: one
// Collective RPC each).
//
// It prints the time of the rendezvous, of the barriers and of both, the
// median time per barrier, and the CPU time the coordinator and this process
// spent in each phase. Any failed call ends it with a non-zero exit and the
// status.
//
// The ranks ask for members on request, as workers do: above the
// coordinator's --member_list_max (256) their JoinGroup replies carry the
// world size and no members. With --members_on_request=false every reply
// lists all members. A real rank decodes only its own; here all ranks share
// one process, so by default one reply is decoded and the others are
// checked to be the same bytes (--decode_every_join decodes all of them,
// which costs this process ranks * ranks members when they are listed).

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_process.h"
#include "bench/bench_util.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "common/call_frame.h"
#include "common/grpc_status.h"
#include "common/net.h"
#include "common/tcp_socket.h"

ABSL_FLAG(int32_t, ranks, 1024, "Ranks in the group.");
ABSL_FLAG(int32_t, workers, 0,
          "Simulated workers the ranks are spread over (rank r on worker "
          "r % workers); 0: one worker per rank.");
ABSL_FLAG(int32_t, barriers, 100, "Barriers every rank runs after joining.");
ABSL_FLAG(int32_t, connections, 16,
          "gRPC connections to the coordinator the ranks are spread over.");
ABSL_FLAG(std::string, transport, "callport",
          "How the barriers reach the coordinator: \"callport\" (each "
          "connection carries its ranks' calls as frames on the call port, "
          "as workers do) or \"unary\" (one Collective RPC per call).");
ABSL_FLAG(bool, members_on_request, true,
          "Join as workers do, asking for members on request: replies of "
          "groups above the coordinator's --member_list_max list none; "
          "false: every reply lists every member.");
ABSL_FLAG(bool, decode_every_join, false,
          "Decode every rank's JoinGroup reply; by default one is decoded and "
          "the others are compared with it byte for byte.");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(30),
          "Deadline of every call.");
ABSL_FLAG(std::string, coordinator, "",
          "Use the chorus-coordinator at this host:port instead of starting "
          "one (its lease must outlast the run: simulated workers send no "
          "heartbeats).");
ABSL_FLAG(std::string, coordinator_bin, "",
          "chorus-coordinator to start; default: the one built next to this "
          "program.");
ABSL_FLAG(std::string, coordinator_args, "",
          "Extra flags for the started coordinator, space-separated.");

namespace chorus::bench {
namespace {

using SteadyClock = std::chrono::steady_clock;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             SteadyClock::now().time_since_epoch())
      .count();
}

double Ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }

// User plus system CPU time of process `pid` in nanoseconds; -1 when it
// cannot be read (a coordinator that is not our child, or no /proc).
int64_t ProcessCpuNs(pid_t pid) {
  if (pid <= 0) return -1;
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  // Fields after the command name, which is in parentheses and may hold
  // spaces: state is field 3, utime 14 and stime 15.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::vector<std::string> fields =
      absl::StrSplit(stat.substr(close + 2), ' ', absl::SkipEmpty());
  if (fields.size() < 13) return -1;
  const long ticks = sysconf(_SC_CLK_TCK);
  const int64_t cpu_ticks = std::stoll(fields[11]) + std::stoll(fields[12]);
  return cpu_ticks * (1000000000 / std::max<long>(ticks, 1));
}

// CPU time of this process (every thread) in nanoseconds.
int64_t SelfCpuNs() {
  struct rusage usage = {};
  getrusage(RUSAGE_SELF, &usage);
  auto ns = [](const timeval& t) {
    return static_cast<int64_t>(t.tv_sec) * 1000000000 +
           static_cast<int64_t>(t.tv_usec) * 1000;
  };
  return ns(usage.ru_utime) + ns(usage.ru_stime);
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& slice : slices) {
    out.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return out;
}

std::string CoordinatorBinary() {
  return FindCoordinatorBinary(absl::GetFlag(FLAGS_coordinator_bin),
                               CHORUS_BENCH_COORDINATOR_BIN);
}

// A started coordinator in a temporary folder, stopped and cleaned up on
// destruction (its log is kept when the run failed).
class StartedCoordinator {
 public:
  static absl::StatusOr<std::unique_ptr<StartedCoordinator>> Start() {
    char dir_template[] = "/tmp/chorus-coordinator-scale.XXXXXX";
    if (mkdtemp(dir_template) == nullptr) {
      return absl::InternalError("cannot create a temporary folder");
    }
    std::unique_ptr<StartedCoordinator> started(
        new StartedCoordinator(dir_template));
    const std::string port_file = started->dir_ + "/coordinator.port";
    SpawnOptions spawn;
    spawn.binary = CoordinatorBinary();
    // Simulated workers send no heartbeats: the lease outlasts the run.
    spawn.args = {"--listen=127.0.0.1:0", "--port_file=" + port_file,
                  "--lease_timeout=1h"};
    for (absl::string_view arg : absl::StrSplit(
             absl::GetFlag(FLAGS_coordinator_args), ' ', absl::SkipEmpty())) {
      spawn.args.emplace_back(arg);
    }
    spawn.log_path = started->dir_ + "/coordinator.log";
    absl::StatusOr<std::unique_ptr<ChildProcess>> child =
        ChildProcess::Spawn(spawn);
    if (!child.ok()) return child.status();
    started->child_ = *std::move(child);
    absl::StatusOr<int> port = WaitForPortFile(*started->child_, port_file,
                                               absl::Seconds(30), nullptr);
    if (!port.ok()) return port.status();
    started->address_ = absl::StrCat("127.0.0.1:", *port);
    started->binary_ = spawn.binary;
    return started;
  }

  ~StartedCoordinator() {
    if (child_ != nullptr) child_->Stop(absl::Seconds(5));
    if (keep_) {
      std::fprintf(stderr, "# coordinator log kept in %s\n", dir_.c_str());
      return;
    }
    std::remove((dir_ + "/coordinator.port").c_str());
    std::remove((dir_ + "/coordinator.log").c_str());
    rmdir(dir_.c_str());
  }

  const std::string& address() const { return address_; }
  const std::string& binary() const { return binary_; }
  pid_t pid() const { return child_ == nullptr ? -1 : child_->pid(); }
  void KeepLog() { keep_ = true; }

 private:
  explicit StartedCoordinator(std::string dir) : dir_(std::move(dir)) {}

  const std::string dir_;
  std::unique_ptr<ChildProcess> child_;
  std::string address_;
  std::string binary_;
  bool keep_ = false;
};

// Counts outstanding calls and keeps the first failure; Wait() returns once
// every call counted by Add() has ended.
class CallTracker {
 public:
  void Add(int n) {
    absl::MutexLock lock(&mu_);
    outstanding_ += n;
  }
  void Done(const grpc::Status& status, absl::string_view what) {
    absl::MutexLock lock(&mu_);
    if (!status.ok() && first_error_.ok()) {
      first_error_ = FromGrpcStatus(status);
      first_error_ =
          absl::Status(first_error_.code(),
                       absl::StrCat(what, ": ", status.error_message()));
    }
    --outstanding_;
  }
  absl::Status Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* outstanding) { return *outstanding == 0; }, &outstanding_));
    return first_error_;
  }
  bool failed() {
    absl::MutexLock lock(&mu_);
    return !first_error_.ok();
  }

 private:
  absl::Mutex mu_;
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
};

// Channels to the coordinator, each its own TCP connection (a local
// subchannel pool and a distinct argument keep gRPC from sharing one).
std::vector<std::shared_ptr<grpc::Channel>> Connect(const std::string& address,
                                                    int connections) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < connections; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("chorus.scale_connection", i);
    args.SetMaxReceiveMessageSize(kDefaultMaxMessageBytes);
    channels.push_back(grpc::CreateCustomChannel(
        address, grpc::InsecureChannelCredentials(), args));
  }
  return channels;
}

std::unique_ptr<grpc::ClientContext> ContextWithDeadline(
    absl::Duration timeout) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(DeadlineAfter(timeout));
  return context;
}

// One simulated rank's calls in flight. Barrier k uses slot k % 2, so the
// context of the call whose callback is running stays alive while the
// callback starts the next call.
struct RankCalls {
  int rank = 0;
  v1::Coordinator::Stub* stub = nullptr;
  std::unique_ptr<grpc::ClientContext> context[2];
  v1::CollectiveRequest request[2];
  v1::CollectiveResponse response[2];
};

struct RunFigures {
  int64_t register_ns = 0;
  int64_t join_ns = 0;
  int64_t barriers_ns = 0;
  std::vector<int64_t> per_barrier_ns;
  int64_t join_cpu_ns = -1;
  int64_t barriers_cpu_ns = -1;
  int64_t join_self_cpu_ns = 0;
  int64_t barriers_self_cpu_ns = 0;
};

class ScaleRun {
 public:
  ScaleRun(const std::string& address, pid_t coordinator_pid)
      : ranks_(absl::GetFlag(FLAGS_ranks)),
        workers_(absl::GetFlag(FLAGS_workers) > 0 ? absl::GetFlag(FLAGS_workers)
                                                  : absl::GetFlag(FLAGS_ranks)),
        barriers_(absl::GetFlag(FLAGS_barriers)),
        timeout_(absl::GetFlag(FLAGS_timeout)),
        coordinator_pid_(coordinator_pid),
        decode_every_join_(absl::GetFlag(FLAGS_decode_every_join)),
        members_on_request_(absl::GetFlag(FLAGS_members_on_request)),
        use_call_port_(absl::GetFlag(FLAGS_transport) == "callport"),
        barrier_done_(barriers_),
        barrier_end_ns_(barriers_) {
    if (absl::StatusOr<HostPort> target = SplitHostPort(address); target.ok()) {
      host_ = target->host;
    }
    for (const std::shared_ptr<grpc::Channel>& channel :
         Connect(address, std::max(1, absl::GetFlag(FLAGS_connections)))) {
      stubs_.push_back(v1::Coordinator::NewStub(channel));
      join_stubs_.push_back(
          std::make_unique<grpc::TemplatedGenericStub<v1::JoinGroupRequest,
                                                      grpc::ByteBuffer>>(
              channel));
    }
  }

  absl::StatusOr<RunFigures> Run() {
    RunFigures figures;
    int64_t start = NowNs();
    if (absl::Status s = RegisterWorkers(); !s.ok()) return s;
    figures.register_ns = NowNs() - start;

    const int64_t cpu_before_join = ProcessCpuNs(coordinator_pid_);
    const int64_t self_before_join = SelfCpuNs();
    start = NowNs();
    if (absl::Status s = JoinAll(); !s.ok()) return s;
    figures.join_ns = NowNs() - start;
    const int64_t cpu_after_join = ProcessCpuNs(coordinator_pid_);
    const int64_t self_after_join = SelfCpuNs();

    start = NowNs();
    if (absl::Status s = RunBarriers(); !s.ok()) return s;
    figures.barriers_ns = NowNs() - start;
    const int64_t cpu_after_barriers = ProcessCpuNs(coordinator_pid_);
    figures.join_self_cpu_ns = self_after_join - self_before_join;
    figures.barriers_self_cpu_ns = SelfCpuNs() - self_after_join;

    int64_t previous = start;
    for (const std::atomic<int64_t>& end : barrier_end_ns_) {
      figures.per_barrier_ns.push_back(end.load() - previous);
      previous = end.load();
    }
    if (cpu_before_join >= 0 && cpu_after_barriers >= 0) {
      figures.join_cpu_ns = cpu_after_join - cpu_before_join;
      figures.barriers_cpu_ns = cpu_after_barriers - cpu_after_join;
    }
    return figures;
  }

  int ranks() const { return ranks_; }
  int workers() const { return workers_; }
  int connections() const { return static_cast<int>(stubs_.size()); }

 private:
  v1::Coordinator::Stub* StubFor(int index) {
    return stubs_[index % stubs_.size()].get();
  }
  // JoinGroup with the reply kept as bytes (see the file comment).
  grpc::TemplatedGenericStub<v1::JoinGroupRequest, grpc::ByteBuffer>&
  JoinStubFor(int index) {
    return *join_stubs_[index % join_stubs_.size()];
  }

  absl::Status RegisterWorkers() {
    worker_ids_.assign(workers_, 0);
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts(workers_);
    std::vector<v1::RegisterWorkerRequest> requests(workers_);
    std::vector<v1::RegisterWorkerResponse> responses(workers_);
    const uint64_t incarnation = static_cast<uint64_t>(NowNs());
    tracker_.Add(workers_);
    for (int w = 0; w < workers_; ++w) {
      v1::RegisterWorkerRequest& request = requests[w];
      request.set_name(absl::StrCat("scale-worker-", w));
      request.set_host(absl::StrCat("scale-host-", w / 8));
      // Never dialled: barriers run at the coordinator.
      request.set_address(absl::StrCat("127.0.0.1:", 20000 + w));
      request.set_incarnation(incarnation);
      request.add_devices()->set_kind(v1::DEVICE_KIND_CPU);
      contexts[w] = ContextWithDeadline(timeout_);
      StubFor(w)->async()->RegisterWorker(
          contexts[w].get(), &requests[w], &responses[w],
          [this, w, &responses](grpc::Status status) {
            worker_ids_[w] = responses[w].worker_id();
            if (w == 0) call_port_ = static_cast<int>(responses[0].call_port());
            tracker_.Done(status, absl::StrCat("register worker ", w));
          });
    }
    return tracker_.Wait();
  }

  absl::Status JoinAll() {
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts(ranks_);
    std::vector<v1::JoinGroupRequest> requests(ranks_);
    std::vector<grpc::ByteBuffer> replies(ranks_);
    tracker_.Add(ranks_);
    for (int r = 0; r < ranks_; ++r) {
      v1::JoinGroupRequest& request = requests[r];
      request.set_group("scale");
      request.set_world_size(ranks_);
      request.set_rank(r);
      request.set_worker_id(worker_ids_[r % workers_]);
      request.mutable_device()->set_kind(v1::DEVICE_KIND_CPU);
      request.set_request_id(absl::StrCat("scale-join-", r));
      request.set_members_on_request(members_on_request_);
      contexts[r] = ContextWithDeadline(timeout_);
      JoinStubFor(r).UnaryCall(
          contexts[r].get(), "/chorus.v1.Coordinator/JoinGroup",
          grpc::StubOptions(), &requests[r], &replies[r],
          [this, r](grpc::Status status) {
            tracker_.Done(status, absl::StrCat("join of rank ", r));
          });
    }
    if (absl::Status s = tracker_.Wait(); !s.ok()) return s;
    const std::string first = Flatten(replies[0]);
    for (int r = 0; r < ranks_; ++r) {
      if (r > 0 && !decode_every_join_) {
        if (Flatten(replies[r]) != first) {
          return absl::InternalError(
              absl::StrCat("rank ", r, " got another group than rank 0"));
        }
        continue;
      }
      v1::JoinGroupResponse response;
      if (!response.ParseFromString(r == 0 ? first : Flatten(replies[r])) ||
          response.world_size() != ranks_ ||
          (response.members_size() != ranks_ &&
           (response.members_size() != 0 || !members_on_request_)) ||
          (r > 0 && response.epoch() != epoch_)) {
        return absl::InternalError(
            absl::StrCat("rank ", r, " got a malformed or partial group"));
      }
      epoch_ = response.epoch();
    }
    return absl::OkStatus();
  }

  absl::Status RunBarriers() {
    if (barriers_ == 0) return absl::OkStatus();
    calls_.resize(ranks_);
    tracker_.Add(ranks_);
    for (int r = 0; r < ranks_; ++r) {
      calls_[r].rank = r;
      calls_[r].stub = StubFor(r);
      for (v1::CollectiveRequest& request : calls_[r].request) {
        request.set_group("scale");
        request.set_epoch(epoch_);
        request.set_rank(r);
        request.mutable_spec()->set_kind(v1::COLLECTIVE_KIND_BARRIER);
      }
    }
    if (use_call_port_) return RunBarriersOnCallPort();
    for (RankCalls& calls : calls_) StartBarrier(calls, 1);
    return tracker_.Wait();
  }

  // --transport=callport: each connection's thread sends barrier 1 of its
  // ranks, then for every reply the rank's next barrier, until all are done.
  absl::Status RunBarriersOnCallPort() {
    const int connections = std::min<int>(ranks_, stubs_.size());
    std::vector<absl::Status> results(connections);
    std::vector<std::thread> threads;
    for (int c = 0; c < connections; ++c) {
      threads.emplace_back([this, c, connections, &results] {
        results[c] = CallPortConnection(c, connections);
      });
    }
    for (std::thread& t : threads) t.join();
    tracker_.Done(grpc::Status::OK, "");
    for (const absl::Status& s : results) {
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status CallPortConnection(int c, int connections) {
    const absl::Time deadline = absl::Now() + timeout_;
    absl::StatusOr<int> fd = ConnectTcp(host_, call_port_, deadline);
    if (!fd.ok()) return fd.status();
    struct Closer {
      int fd;
      ~Closer() { CloseSocket(fd); }
    } closer{*fd};
    std::string out(kCallHello);
    auto request = [&](int r, int sequence) {
      v1::CallPortRequest framed;
      framed.set_call_id(static_cast<uint64_t>(r) + 1);
      framed.set_timeout_us(absl::ToInt64Microseconds(timeout_));
      *framed.mutable_call() = calls_[r].request[0];
      framed.mutable_call()->set_sequence(sequence);
      AppendCallFrame(framed.SerializeAsString(), &out);
    };
    int outstanding = 0;
    for (int r = c; r < ranks_; r += connections) {
      request(r, 1);
      outstanding += barriers_;
    }
    std::vector<int> sequence(ranks_, 1);
    CallFrameParser frames(kDefaultMaxMessageBytes);
    char buffer[64 << 10];
    std::string payload;
    while (outstanding > 0) {
      if (!out.empty()) {
        const absl::string_view bytes = out;
        if (absl::Status s = WriteAll(*fd, &bytes, 1, deadline, -1); !s.ok()) {
          return s;
        }
        out.clear();
      }
      absl::StatusOr<size_t> got =
          ReadSome(*fd, buffer, sizeof(buffer), deadline, -1);
      if (!got.ok()) return got.status();
      frames.Append(absl::string_view(buffer, *got));
      while (true) {
        absl::StatusOr<bool> next = frames.Next(&payload);
        if (!next.ok()) return next.status();
        if (!*next) break;
        v1::CallPortReply reply;
        if (!reply.ParseFromString(payload) || reply.call_id() == 0 ||
            reply.call_id() > static_cast<uint64_t>(ranks_)) {
          return absl::InternalError("a malformed call port reply");
        }
        if (reply.code() != 0) {
          return absl::Status(static_cast<absl::StatusCode>(reply.code()),
                              reply.message());
        }
        const int r = static_cast<int>(reply.call_id() - 1);
        const int done = sequence[r]++;
        if (barrier_done_[done - 1].fetch_add(1) + 1 == ranks_) {
          barrier_end_ns_[done - 1].store(NowNs());
        }
        --outstanding;
        if (done < barriers_) request(r, done + 1);
      }
    }
    return absl::OkStatus();
  }

  // Starts barrier `sequence` (from 1) of one rank; its callback starts the
  // next, or ends the rank after the last or on a failure.
  void StartBarrier(RankCalls& calls, int sequence) {
    const int slot = sequence % 2;
    calls.context[slot] = ContextWithDeadline(timeout_);
    calls.request[slot].set_sequence(sequence);
    calls.response[slot].Clear();
    calls.stub->async()->Collective(
        calls.context[slot].get(), &calls.request[slot], &calls.response[slot],
        [this, &calls, sequence](grpc::Status status) {
          BarrierDone(calls, sequence, status);
        });
  }

  // Records barrier `sequence` of one rank and starts its next one.
  void BarrierDone(RankCalls& calls, int sequence, const grpc::Status& status) {
    if (status.ok()) {
      if (barrier_done_[sequence - 1].fetch_add(1) + 1 == ranks_) {
        barrier_end_ns_[sequence - 1].store(NowNs());
      }
      if (sequence < barriers_ && !tracker_.failed()) {
        StartBarrier(calls, sequence + 1);
        return;
      }
    }
    tracker_.Done(status,
                  absl::StrCat("barrier #", sequence, " of rank ", calls.rank));
  }

  const int ranks_;
  const int workers_;
  const int barriers_;
  const absl::Duration timeout_;
  const pid_t coordinator_pid_;
  const bool decode_every_join_;
  const bool members_on_request_;
  const bool use_call_port_;
  // The coordinator's host and call port (from registration).
  std::string host_;
  int call_port_ = 0;
  std::vector<std::unique_ptr<v1::Coordinator::Stub>> stubs_;
  std::vector<std::unique_ptr<
      grpc::TemplatedGenericStub<v1::JoinGroupRequest, grpc::ByteBuffer>>>
      join_stubs_;
  CallTracker tracker_;
  std::vector<uint64_t> worker_ids_;
  uint64_t epoch_ = 0;
  std::vector<RankCalls> calls_;
  std::vector<std::atomic<int>> barrier_done_;
  std::vector<std::atomic<int64_t>> barrier_end_ns_;
};

std::string CpuFigure(int64_t cpu_ns) {
  return cpu_ns < 0 ? std::string("n/a")
                    : absl::StrFormat("%.1f ms", Ms(cpu_ns));
}

int Main() {
  const int ranks = absl::GetFlag(FLAGS_ranks);
  const std::string transport = absl::GetFlag(FLAGS_transport);
  if (transport != "callport" && transport != "unary") {
    std::fprintf(stderr, "want --transport=callport or unary\n");
    return 2;
  }
  if (ranks < 1 || absl::GetFlag(FLAGS_barriers) < 0 ||
      absl::GetFlag(FLAGS_workers) < 0 ||
      absl::GetFlag(FLAGS_timeout) <= absl::ZeroDuration()) {
    std::fprintf(stderr,
                 "want --ranks >= 1, --barriers >= 0, --workers >= 0 and a "
                 "positive --timeout\n");
    return 2;
  }
  std::unique_ptr<StartedCoordinator> started;
  std::string address = absl::GetFlag(FLAGS_coordinator);
  if (address.empty()) {
    absl::StatusOr<std::unique_ptr<StartedCoordinator>> coordinator =
        StartedCoordinator::Start();
    if (!coordinator.ok()) {
      std::fprintf(stderr, "cannot start the coordinator: %s\n",
                   coordinator.status()
                       .ToString(absl::StatusToStringMode::kWithNoExtraData)
                       .c_str());
      return 1;
    }
    started = *std::move(coordinator);
    address = started->address();
  }
  ScaleRun run(address, started == nullptr ? -1 : started->pid());
  std::printf(
      "# coordinator %s%s\n", address.c_str(),
      started == nullptr
          ? ""
          : absl::StrCat(" (started: ", started->binary(), ")").c_str());
  std::printf(
      "# %d ranks on %d workers over %d connections, %d barriers (%s)\n",
      run.ranks(), run.workers(), run.connections(),
      absl::GetFlag(FLAGS_barriers), absl::GetFlag(FLAGS_transport).c_str());
  absl::StatusOr<RunFigures> figures = run.Run();
  if (!figures.ok()) {
    std::fprintf(stderr, "failed: %s\n",
                 figures.status()
                     .ToString(absl::StatusToStringMode::kWithNoExtraData)
                     .c_str());
    if (started != nullptr) started->KeepLog();
    return 1;
  }
  const int64_t total = figures->join_ns + figures->barriers_ns;
  std::vector<int64_t> per_barrier = figures->per_barrier_ns;
  std::printf("registration of %d workers: %9.1f ms\n", run.workers(),
              Ms(figures->register_ns));
  std::printf(
      "rendezvous:                 %9.1f ms  (CPU: coordinator %s, ranks "
      "%.1f ms)\n",
      Ms(figures->join_ns), CpuFigure(figures->join_cpu_ns).c_str(),
      Ms(figures->join_self_cpu_ns));
  std::printf(
      "%d barriers:               %9.1f ms  (CPU: coordinator %s, ranks "
      "%.1f ms)\n",
      absl::GetFlag(FLAGS_barriers), Ms(figures->barriers_ns),
      CpuFigure(figures->barriers_cpu_ns).c_str(),
      Ms(figures->barriers_self_cpu_ns));
  std::printf("rendezvous + barriers:      %9.1f ms\n", Ms(total));
  if (!per_barrier.empty()) {
    std::printf("per barrier: median %.3f ms, min %.3f ms, max %.3f ms\n",
                Median(per_barrier) / 1e6,
                Ms(*std::min_element(per_barrier.begin(), per_barrier.end())),
                Ms(*std::max_element(per_barrier.begin(), per_barrier.end())));
  }
  return 0;
}

}  // namespace
}  // namespace chorus::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "chorus-coordinator-scale: times a rendezvous and barriers of one large "
      "group at one chorus-coordinator, with simulated ranks.\n"
      "Usage: chorus-coordinator-scale [--ranks=1024] [--barriers=100] "
      "[--workers=N] [--connections=16] [--transport=callport|unary] "
      "[--coordinator=ADDR]");
  absl::ParseCommandLine(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  return chorus::bench::Main();
}
