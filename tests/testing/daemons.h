// Helpers for integration tests that run the real Chorus binaries on
// 127.0.0.1: start chorus-coordinator and chorus-worker on port 0 and read
// back the bound port, run chorusctl and other commands to completion, and
// talk to a coordinator through its gRPC stub with deadlines.
//
// Lifecycle: every file a helper creates (port files, process logs) lives in
// the running test's scratch directory, created on first use. When the test
// ends, the directory is removed if the test passed; if it failed, it is kept
// and the tail of every log in it is printed, so a failure shows what the
// daemons said. Processes are owned by the returned objects and killed when
// those are destroyed.
//
// Thread safety: call from the test's main thread. The gRPC helpers are
// thread-safe.
#ifndef CHORUS_TESTS_TESTING_DAEMONS_H_
#define CHORUS_TESTS_TESTING_DAEMONS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "tests/testing/process.h"

namespace chorus::test {

// How long StartCoordinator/StartWorker wait for the port file. Generous:
// a loaded two-core machine may take seconds to start a daemon.
inline constexpr absl::Duration kStartTimeout = absl::Seconds(20);
// Deadline of each gRPC call the helpers make.
inline constexpr absl::Duration kRpcTimeout = absl::Seconds(10);

// Paths of the binaries under test: set by the build, or in
// $CHORUS_TEST_BIN_DIR when that is set (binaries packed for another machine).
std::string CoordinatorBinary();
std::string WorkerBinary();
std::string ChorusctlBinary();

// Returns the running test's scratch directory (no trailing slash), creating
// it on first use; outside a test, a directory for the whole program.
std::string ScratchDir();

// Returns a path in ScratchDir() that no earlier call returned:
// "<dir>/<stem>-<n><suffix>". Does not create the file.
std::string NewScratchPath(absl::string_view stem, absl::string_view suffix);

// A daemon started by StartCoordinator or StartWorker.
struct Daemon {
  std::unique_ptr<Subprocess> process;
  // The port the daemon bound, read from its port file.
  int port = 0;
  // "127.0.0.1:<port>".
  std::string address;
};

// Starts chorus-coordinator with --listen=127.0.0.1:0 and a --port_file in
// the scratch directory, then `extra_flags` (a flag given there, e.g.
// --listen=127.0.0.1:PORT, replaces the default of the same name). Returns
// once the port file exists. Returns DEADLINE_EXCEEDED when it does not
// appear within kStartTimeout, FAILED_PRECONDITION (quoting the log) when the
// process exits first, or Subprocess::Start's errors.
absl::StatusOr<Daemon> StartCoordinator(
    const std::vector<std::string>& extra_flags = {});

// Starts chorus-worker registering with `coordinator` ("host:port"), with
// --listen=127.0.0.1:0, no local socket (--local_socket=) and a --port_file,
// then `extra_flags` (same rule as above). The worker writes its port file
// only once registered, so on return the worker is in the coordinator's
// registry. Errors as StartCoordinator.
absl::StatusOr<Daemon> StartWorker(
    const std::string& coordinator,
    const std::vector<std::string>& extra_flags = {});

// StartWorker with the worker run under `wrapper`: the command line is
// wrapper..., chorus-worker, its flags (e.g. {"unshare", "--pid", "--fork",
// "--mount-proc", "--kill-child"} for a worker in its own pid namespace).
// wrapper[0] is looked up on the PATH. Errors as StartWorker.
absl::StatusOr<Daemon> StartWrappedWorker(
    const std::vector<std::string>& wrapper, const std::string& coordinator,
    const std::vector<std::string>& extra_flags = {});

// Starts `command` (command[0] is the executable, looked up on the PATH
// when it has no '/'; the rest its arguments), a daemon that writes its
// bound port to `port_file`, and returns once that file exists: for daemons
// whose whole command line the test chooses (e.g. in another network
// namespace). The returned address is "127.0.0.1:<port>"; a caller that
// knows a better one replaces it. `stem` names the log file. Errors as
// StartCoordinator.
absl::StatusOr<Daemon> StartDaemonCommand(
    const std::vector<std::string>& command, const std::string& port_file,
    absl::string_view stem);

// Starts chorus-worker like StartWorker but does not wait for anything: for
// workers expected to exit on their own. Returns Subprocess::Start's errors.
absl::StatusOr<std::unique_ptr<Subprocess>> SpawnWorker(
    const std::string& coordinator,
    const std::vector<std::string>& extra_flags = {});

// What a command that ran to completion printed, and how it ended.
struct CommandResult {
  // Exit code, or ExitCodeForSignal(sig).
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `binary` with `args` until it exits. Returns DEADLINE_EXCEEDED (after
// killing it) when it runs longer than `timeout`, or Subprocess::Start's
// errors.
absl::StatusOr<CommandResult> RunCommand(
    const std::string& binary, const std::vector<std::string>& args,
    absl::Duration timeout = absl::Seconds(60));

// RunCommand(ChorusctlBinary(), args, timeout).
absl::StatusOr<CommandResult> RunChorusctl(
    const std::vector<std::string>& args,
    absl::Duration timeout = absl::Seconds(60));

// Returns a stub for the coordinator at `address` ("host:port"), on a
// channel from chorus::MakeChannel.
std::unique_ptr<v1::Coordinator::Stub> NewCoordinatorStub(
    const std::string& address);

// Calls ListWorkers with a deadline of `timeout`. Returns the workers, or the
// call's status (UNAVAILABLE, DEADLINE_EXCEEDED, ...).
absl::StatusOr<std::vector<v1::WorkerInfo>> ListWorkers(
    v1::Coordinator::Stub& stub, absl::Duration timeout = kRpcTimeout);

// Returns the names of `workers`, sorted.
std::vector<std::string> WorkerNames(
    const std::vector<v1::WorkerInfo>& workers);

// Calls ListWorkers and returns the sorted names; an empty list when the
// call fails (for use in WaitUntil predicates, where a failed call means
// "not yet").
std::vector<std::string> ListedNamesOrEmpty(v1::Coordinator::Stub& stub);

// The oldest collective of `group` still waiting for ranks (ListGroups'
// pending_sequence); 0 for none, or when the coordinator does not answer
// (for WaitUntil predicates).
uint64_t PendingSequence(v1::Coordinator::Stub& stub, const std::string& group);

// Calls RegisterWorker with a deadline of `timeout`. Returns the response,
// or the call's status with the coordinator's code and message.
absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
    v1::Coordinator::Stub& stub, const v1::RegisterWorkerRequest& request,
    absl::Duration timeout = kRpcTimeout);

// grpc.health.v1.HealthCheckResponse.ServingStatus values.
inline constexpr int kHealthUnknown = 0;
inline constexpr int kHealthServing = 1;
inline constexpr int kHealthNotServing = 2;

// Calls grpc.health.v1.Health/Check for `service` ("" is the whole server)
// on the server at `address`. Debian's grpc++ ships no client stub for the
// health service, so the call goes through grpc::GenericStub with the two
// messages encoded by hand (the request has one string field, the response
// one enum field). Returns the serving status, the call's status (NOT_FOUND
// for an unknown service), or INTERNAL for a response it cannot decode.
absl::StatusOr<int> HealthCheck(const std::string& address,
                                const std::string& service = "",
                                absl::Duration timeout = kRpcTimeout);

}  // namespace chorus::test

#endif  // CHORUS_TESTS_TESTING_DAEMONS_H_
