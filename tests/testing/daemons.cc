#include "tests/testing/daemons.h"

#include <grpcpp/client_context.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/grpc_status.h"
#include "common/net.h"
#include "tests/testing/wait.h"

namespace chorus::test {
namespace {

// How often StartDaemon looks for the port file.
constexpr absl::Duration kPortFilePollPause = absl::Milliseconds(20);
// How much of each log a failed test prints.
constexpr size_t kLogTailBytes = 8000;

// ---------------------------------------------------------------------------
// Scratch directories: one per test, removed when the test passes.

struct ScratchState {
  absl::Mutex mu;
  // Full name of the test that owns `dir`; empty when no directory is open.
  std::string test ABSL_GUARDED_BY(mu);
  std::string dir ABSL_GUARDED_BY(mu);
  int next_file ABSL_GUARDED_BY(mu) = 1;
};

ScratchState& Scratch() {
  static ScratchState* state = new ScratchState();
  return *state;
}

std::string CurrentTestName() {
  const ::testing::TestInfo* info =
      ::testing::UnitTest::GetInstance()->current_test_info();
  if (info == nullptr) return "global";
  return absl::StrCat(info->test_suite_name(), ".", info->name());
}

std::string ForFileName(absl::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' &&
        c != '_') {
      c = '_';
    }
  }
  return out;
}

std::string CreateScratchDirLocked(ScratchState& state, const std::string& test)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mu) {
  std::string base = ::testing::TempDir();
  if (!base.empty() && base.back() != '/') base.push_back('/');
  std::string path =
      absl::StrCat(base, "chorus-", ForFileName(test), "-XXXXXX");
  if (mkdtemp(path.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp(" << path << ") failed: " << std::strerror(errno);
    path = base.empty() ? "." : base.substr(0, base.size() - 1);
  }
  state.test = test;
  state.dir = path;
  state.next_file = 1;
  return path;
}

void PrintLogTails(const std::string& dir) {
  std::error_code error;
  std::vector<std::filesystem::path> logs;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string ext = entry.path().extension().string();
    if (ext == ".log" || ext == ".out" || ext == ".err") {
      logs.push_back(entry.path());
    }
  }
  std::sort(logs.begin(), logs.end());
  std::fprintf(stdout, "Logs of this test are kept in %s\n", dir.c_str());
  for (const std::filesystem::path& log : logs) {
    absl::StatusOr<std::string> text = ReadFileToString(log.string());
    if (!text.ok()) continue;
    absl::string_view tail = *text;
    if (tail.size() > kLogTailBytes)
      tail.remove_prefix(tail.size() - kLogTailBytes);
    std::fprintf(stdout, "----- %s (%zu bytes%s) -----\n%.*s\n",
                 log.filename().c_str(), text->size(),
                 tail.size() < text->size() ? ", tail" : "",
                 static_cast<int>(tail.size()), tail.data());
  }
  std::fflush(stdout);
}

// Closes the scratch directory of each test as it ends: removed when the
// test passed or was skipped, kept and its logs printed when it failed.
class ScratchDirCloser : public ::testing::EmptyTestEventListener {
 public:
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const std::string test =
        absl::StrCat(info.test_suite_name(), ".", info.name());
    std::string dir;
    {
      ScratchState& state = Scratch();
      absl::MutexLock lock(&state.mu);
      if (state.dir.empty() || state.test != test) return;
      dir = std::move(state.dir);
      state.dir.clear();
      state.test.clear();
    }
    if (info.result()->Failed()) {
      PrintLogTails(dir);
    } else {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  }
};

// Registered before main runs; gtest owns the listener.
[[maybe_unused]] const bool kScratchDirCloserInstalled = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(
      new ScratchDirCloser());
  return true;
}();

// ---------------------------------------------------------------------------
// Daemons.

// "--name=value" -> "--name"; a flag without '=' is its own name.
absl::string_view FlagName(absl::string_view flag) {
  return flag.substr(0, flag.find('='));
}

// Returns `defaults` minus those named in `extra`, followed by `extra`.
std::vector<std::string> MergeFlags(const std::vector<std::string>& defaults,
                                    const std::vector<std::string>& extra) {
  std::vector<std::string> merged;
  for (const std::string& flag : defaults) {
    const bool overridden = std::any_of(
        extra.begin(), extra.end(),
        [&](const std::string& e) { return FlagName(e) == FlagName(flag); });
    if (!overridden) merged.push_back(flag);
  }
  merged.insert(merged.end(), extra.begin(), extra.end());
  return merged;
}

// The value of --name in `flags`, or "" when absent.
std::string FlagValue(const std::vector<std::string>& flags,
                      absl::string_view name) {
  std::string value;
  for (const std::string& flag : flags) {
    if (FlagName(flag) == name && flag.size() > name.size()) {
      value = flag.substr(name.size() + 1);
    }
  }
  return value;
}

absl::StatusOr<int> ReadPortFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return text.status();
  int port = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &port) ||
      port <= 0 || port > 65535) {
    return absl::InternalError(
        absl::StrCat("port file ", path, " holds \"", *text, "\""));
  }
  return port;
}

// Starts `binary` with `args` (which must name `port_file`), then waits for
// the port file.
absl::StatusOr<Daemon> StartDaemon(const std::string& binary,
                                   absl::string_view stem,
                                   const std::vector<std::string>& args,
                                   const std::string& port_file) {
  SubprocessOptions options;
  options.binary = binary;
  options.args = args;
  options.stdout_path = NewScratchPath(stem, ".log");
  absl::StatusOr<std::unique_ptr<Subprocess>> process =
      Subprocess::Start(options);
  if (!process.ok()) return process.status();

  Daemon daemon;
  daemon.process = *std::move(process);
  bool exited = false;
  WaitUntil(
      [&] {
        absl::StatusOr<int> port = ReadPortFile(port_file);
        if (port.ok()) {
          daemon.port = *port;
          return true;
        }
        exited = !daemon.process->IsRunning();
        return exited;
      },
      kStartTimeout, kPortFilePollPause);
  if (daemon.port > 0) {
    daemon.address = absl::StrCat("127.0.0.1:", daemon.port);
    return daemon;
  }
  if (exited) {
    absl::StatusOr<int> code =
        daemon.process->WaitForExit(absl::ZeroDuration());
    return absl::FailedPreconditionError(
        absl::StrCat(binary, " exited with ", code.ok() ? *code : -1,
                     " before writing its port file; its log:\n",
                     daemon.process->ReadLog()));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(binary, " wrote no port file within ",
                   absl::FormatDuration(kStartTimeout), "; its log:\n",
                   daemon.process->ReadLog()));
}

std::string WorkerStem(const std::vector<std::string>& flags) {
  const std::string name = FlagValue(flags, "--name");
  return name.empty() ? "worker" : absl::StrCat("worker-", ForFileName(name));
}

// Reads a protobuf varint at `*pos`; false when the input ends first.
bool ReadVarint(absl::string_view bytes, size_t* pos, uint64_t* value) {
  *value = 0;
  for (int shift = 0; shift < 64 && *pos < bytes.size(); shift += 7) {
    const uint8_t byte = static_cast<uint8_t>(bytes[(*pos)++]);
    *value |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

// The daemons of this build tree, or those in $CHORUS_TEST_BIN_DIR when set
// (binaries packed elsewhere, as `bench/gpu_check.sh --prebuilt` runs them).
std::string TestBinary(absl::string_view name, const char* built) {
  const char* dir = getenv("CHORUS_TEST_BIN_DIR");
  if (dir == nullptr || *dir == '\0') return built;
  return absl::StrCat(dir, "/", name);
}

}  // namespace

std::string CoordinatorBinary() {
  return TestBinary("chorus-coordinator", CHORUS_COORDINATOR_BIN);
}
std::string WorkerBinary() {
  return TestBinary("chorus-worker", CHORUS_WORKER_BIN);
}
std::string ChorusctlBinary() { return TestBinary("chorusctl", CHORUSCTL_BIN); }

std::string ScratchDir() {
  ScratchState& state = Scratch();
  const std::string test = CurrentTestName();
  absl::MutexLock lock(&state.mu);
  if (!state.dir.empty() && state.test == test) return state.dir;
  return CreateScratchDirLocked(state, test);
}

std::string NewScratchPath(absl::string_view stem, absl::string_view suffix) {
  const std::string dir = ScratchDir();
  ScratchState& state = Scratch();
  absl::MutexLock lock(&state.mu);
  return absl::StrCat(dir, "/", stem, "-", state.next_file++, suffix);
}

absl::StatusOr<Daemon> StartCoordinator(
    const std::vector<std::string>& extra_flags) {
  const std::string port_file = NewScratchPath("coordinator", ".port");
  const std::vector<std::string> args = MergeFlags(
      {"--listen=127.0.0.1:0", absl::StrCat("--port_file=", port_file)},
      extra_flags);
  return StartDaemon(CoordinatorBinary(), "coordinator", args,
                     FlagValue(args, "--port_file"));
}

absl::StatusOr<Daemon> StartWorker(
    const std::string& coordinator,
    const std::vector<std::string>& extra_flags) {
  return StartWrappedWorker({}, coordinator, extra_flags);
}

absl::StatusOr<Daemon> StartWrappedWorker(
    const std::vector<std::string>& wrapper, const std::string& coordinator,
    const std::vector<std::string>& extra_flags) {
  const std::string stem = WorkerStem(extra_flags);
  const std::string port_file = NewScratchPath(stem, ".port");
  const std::vector<std::string> flags = MergeFlags(
      {absl::StrCat("--coordinator=", coordinator), "--listen=127.0.0.1:0",
       "--local_socket=", absl::StrCat("--port_file=", port_file)},
      extra_flags);
  if (wrapper.empty()) {
    return StartDaemon(WorkerBinary(), stem, flags,
                       FlagValue(flags, "--port_file"));
  }
  std::vector<std::string> command = wrapper;
  command.push_back(WorkerBinary());
  command.insert(command.end(), flags.begin(), flags.end());
  return StartDaemonCommand(command, FlagValue(flags, "--port_file"), stem);
}

absl::StatusOr<Daemon> StartDaemonCommand(
    const std::vector<std::string>& command, const std::string& port_file,
    absl::string_view stem) {
  if (command.empty()) return absl::InvalidArgumentError("empty command");
  std::string binary = command[0];
  if (binary.find('/') == std::string::npos) {
    for (absl::string_view dir :
         absl::StrSplit(getenv("PATH") ? getenv("PATH") : "", ':')) {
      const std::string candidate = absl::StrCat(dir, "/", binary);
      if (access(candidate.c_str(), X_OK) == 0) {
        binary = candidate;
        break;
      }
    }
  }
  const std::vector<std::string> args(command.begin() + 1, command.end());
  return StartDaemon(binary, stem, args, port_file);
}

absl::StatusOr<std::unique_ptr<Subprocess>> SpawnWorker(
    const std::string& coordinator,
    const std::vector<std::string>& extra_flags) {
  const std::string stem = WorkerStem(extra_flags);
  SubprocessOptions options;
  options.binary = WorkerBinary();
  options.args =
      MergeFlags({absl::StrCat("--coordinator=", coordinator),
                  "--listen=127.0.0.1:0", "--local_socket=",
                  absl::StrCat("--port_file=", NewScratchPath(stem, ".port"))},
                 extra_flags);
  options.stdout_path = NewScratchPath(stem, ".log");
  return Subprocess::Start(options);
}

absl::StatusOr<CommandResult> RunCommand(const std::string& binary,
                                         const std::vector<std::string>& args,
                                         absl::Duration timeout) {
  const std::string stem =
      ForFileName(std::filesystem::path(binary).filename().string());
  SubprocessOptions options;
  options.binary = binary;
  options.args = args;
  options.stdout_path = NewScratchPath(stem, ".out");
  options.stderr_path = NewScratchPath(stem, ".err");
  absl::StatusOr<std::unique_ptr<Subprocess>> process =
      Subprocess::Start(options);
  if (!process.ok()) return process.status();
  absl::StatusOr<int> code = (*process)->WaitForExit(timeout);
  if (!code.ok()) return code.status();  // the destructor kills it
  CommandResult result;
  result.exit_code = *code;
  result.out = (*process)->ReadLog();
  result.err = (*process)->ReadStderr();
  return result;
}

absl::StatusOr<CommandResult> RunChorusctl(const std::vector<std::string>& args,
                                           absl::Duration timeout) {
  return RunCommand(ChorusctlBinary(), args, timeout);
}

std::unique_ptr<v1::Coordinator::Stub> NewCoordinatorStub(
    const std::string& address) {
  return v1::Coordinator::NewStub(MakeChannel(address, Role::kCoordinator));
}

absl::StatusOr<std::vector<v1::WorkerInfo>> ListWorkers(
    v1::Coordinator::Stub& stub, absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(timeout));
  v1::ListWorkersResponse response;
  absl::Status status = FromGrpcStatus(
      stub.ListWorkers(&context, v1::ListWorkersRequest(), &response));
  if (!status.ok()) return status;
  return std::vector<v1::WorkerInfo>(response.workers().begin(),
                                     response.workers().end());
}

std::vector<std::string> WorkerNames(
    const std::vector<v1::WorkerInfo>& workers) {
  std::vector<std::string> names;
  for (const v1::WorkerInfo& worker : workers) names.push_back(worker.name());
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> ListedNamesOrEmpty(v1::Coordinator::Stub& stub) {
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = ListWorkers(stub);
  if (!workers.ok()) return {};
  return WorkerNames(*workers);
}

uint64_t PendingSequence(v1::Coordinator::Stub& stub,
                         const std::string& group) {
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(kRpcTimeout));
  v1::ListGroupsResponse response;
  if (!stub.ListGroups(&context, v1::ListGroupsRequest(), &response).ok()) {
    return 0;
  }
  for (const v1::GroupInfo& info : response.groups()) {
    if (info.name() == group) return info.pending_sequence();
  }
  return 0;
}

absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
    v1::Coordinator::Stub& stub, const v1::RegisterWorkerRequest& request,
    absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(timeout));
  v1::RegisterWorkerResponse response;
  absl::Status status =
      FromGrpcStatus(stub.RegisterWorker(&context, request, &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<int> HealthCheck(const std::string& address,
                                const std::string& service,
                                absl::Duration timeout) {
  // HealthCheckRequest { string service = 1; }
  std::string request_bytes;
  if (!service.empty()) {
    request_bytes.push_back(0x0a);  // field 1, length-delimited
    AppendVarint(service.size(), &request_bytes);
    request_bytes.append(service);
  }
  grpc::Slice request_slice(request_bytes);
  grpc::ByteBuffer request(&request_slice, 1);
  grpc::ByteBuffer response;

  grpc::GenericStub stub(MakeChannel(address, Role::kCoordinator));
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(timeout));
  absl::Notification done;
  grpc::Status call_status;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(),
                 &request, &response, [&](grpc::Status status) {
                   call_status = std::move(status);
                   done.Notify();
                 });
  done.WaitForNotification();
  absl::Status status = FromGrpcStatus(call_status);
  if (!status.ok()) return status;

  // HealthCheckResponse { ServingStatus status = 1; }
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) {
    return absl::InternalError("cannot read the health check response");
  }
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  int serving = kHealthUnknown;  // proto3 omits the default value
  size_t pos = 0;
  while (pos < bytes.size()) {
    uint64_t key = 0;
    uint64_t value = 0;
    if (!ReadVarint(bytes, &pos, &key) || !ReadVarint(bytes, &pos, &value)) {
      return absl::InternalError("truncated health check response");
    }
    switch (key & 7) {
      case 0:  // varint
        if ((key >> 3) == 1) serving = static_cast<int>(value);
        break;
      case 2:  // length-delimited: skip the payload
        if (value > bytes.size() - pos) {
          return absl::InternalError("truncated health check response");
        }
        pos += value;
        break;
      default:
        return absl::InternalError(absl::StrCat(
            "unexpected wire type ", key & 7, " in health check response"));
    }
  }
  return serving;
}

}  // namespace chorus::test
