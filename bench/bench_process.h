// ChildProcess: a process chorus-bench starts — the coordinator or one rank —
// with stderr (and stdout, unless captured) appended to a log file, stdout
// optionally on a pipe the parent reads, and SIGKILL delivered to it if the
// parent dies, so a crashed or killed benchmark leaks no processes.
//
// Lifecycle: Spawn() forks and execs and returns once exec succeeded (or why
// it failed). Stop() or the destructor ends a child that is still running
// and reaps it.
// Thread safety: thread-compatible; chorus-bench drives its children from
// its main thread.
#ifndef CHORUS_BENCH_BENCH_PROCESS_H_
#define CHORUS_BENCH_BENCH_PROCESS_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace chorus::bench {

struct SpawnOptions {
  // Executable path; argv[0] is set to it.
  std::string binary;
  std::vector<std::string> args;
  // Receives the child's stderr, and its stdout unless capture_stdout.
  std::string log_path;
  // Sends the child's stdout to a pipe read through stdout_fd().
  bool capture_stdout = false;
};

class ChildProcess {
 public:
  // Starts the child with stdin from /dev/null. Returns INVALID_ARGUMENT for
  // an empty binary or log path, or INTERNAL (with errno's text) when the log
  // cannot be opened, a pipe or fork fails, or exec fails.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Spawn(
      const SpawnOptions& options);

  // Stop(absl::ZeroDuration()) when the child is still running.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }

  // The read end of the captured stdout (non-blocking); -1 when not
  // captured or closed. Owned by this object.
  int stdout_fd() const { return stdout_fd_; }
  void CloseStdout();

  // Sends `sig` unless the child has been reaped. Returns
  // FAILED_PRECONDITION when it has, INTERNAL when kill(2) fails.
  absl::Status Signal(int sig);

  // Waits up to `timeout` for the child to exit without spinning (poll on a
  // pidfd; a few-millisecond sleep loop where the kernel has none). Returns
  // the exit code, or 128+signal when a signal ended it; DEADLINE_EXCEEDED
  // when it still runs at the deadline.
  absl::StatusOr<int> WaitForExit(absl::Duration timeout);

  // Sends SIGTERM, waits up to `grace`, then SIGKILL (at once for a zero
  // grace), and reaps. Returns the exit code as WaitForExit does.
  int Stop(absl::Duration grace);

  // The last `max_bytes` of the log, for error messages.
  std::string LogTail(size_t max_bytes = 2000) const;

 private:
  ChildProcess(pid_t pid, int pidfd, int stdout_fd, std::string log_path)
      : pid_(pid),
        pidfd_(pidfd),
        stdout_fd_(stdout_fd),
        log_path_(std::move(log_path)) {}

  // Reaps the child if it has exited; true once reaped.
  bool TryReap();

  const pid_t pid_;
  int pidfd_;  // -1 when unavailable
  int stdout_fd_;
  const std::string log_path_;
  std::optional<int> exit_code_;
};

// Has SIGINT, SIGTERM and SIGHUP write a byte to a pipe, so that a poll
// loop sees them, and ignores SIGPIPE. Returns the pipe's read end, or
// INTERNAL when it cannot be made. Call once per process.
absl::StatusOr<int> InstallSignalPipe();

// The termination signal caught so far (InstallSignalPipe), or 0.
int SignalCaught();

// The path of the running executable (/proc/self/exe resolved), or "" when it
// cannot be read.
std::string SelfExecutable();

// The chorus-coordinator to start: `flag` when not empty, else `built` (the
// path the build recorded) when it is executable, else chorus-coordinator
// beside this executable or in the build tree above it, else `built`.
std::string FindCoordinatorBinary(const std::string& flag,
                                  const std::string& built);

// Waits for the port file at `path` that `coordinator` writes once it
// listens, looking each time the child has not exited within 20 ms. Returns
// the port; FAILED_PRECONDITION (with the log's tail) when the coordinator
// exited first; CANCELLED when `interrupted` (may be null) says so;
// DEADLINE_EXCEEDED after `timeout`.
absl::StatusOr<int> WaitForPortFile(ChildProcess& coordinator,
                                    const std::string& path,
                                    absl::Duration timeout,
                                    const std::function<bool()>& interrupted);

}  // namespace chorus::bench

#endif  // CHORUS_BENCH_BENCH_PROCESS_H_
