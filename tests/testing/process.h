// Subprocess: a child process started by a test (a Chorus daemon, the CLI),
// with its stdout and stderr written to log files the test can read back.
//
// Lifecycle: Start() forks and execs the binary and returns once exec has
// succeeded (or returns the reason it failed). The child gets SIGKILL if the
// thread that started it dies, so a crashed or killed test leaks no daemons.
// WaitForExit() reaps the child and records its exit status; the destructor
// kills (SIGKILL) and reaps a child that is still running.
//
// Thread safety: thread-compatible. Use one Subprocess from one thread at a
// time (tests drive their processes from the test's main thread); different
// Subprocess objects are independent.
#ifndef CHORUS_TESTS_TESTING_PROCESS_H_
#define CHORUS_TESTS_TESTING_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace chorus::test {

// The value WaitForExit() reports for a child that was ended by signal `sig`
// (the shell's convention: SIGKILL gives 137).
constexpr int ExitCodeForSignal(int sig) { return 128 + sig; }

struct SubprocessOptions {
  // Path of the executable.
  std::string binary;
  // Arguments after argv[0] (argv[0] is `binary`).
  std::vector<std::string> args;
  // File that receives the child's stdout; created or appended to.
  std::string stdout_path;
  // File that receives the child's stderr; empty sends stderr to the same
  // file as stdout, interleaved in the order the child wrote it.
  std::string stderr_path;
};

class Subprocess {
 public:
  // Starts `options.binary` with stdin from /dev/null and stdout/stderr sent
  // to the given files. Returns INVALID_ARGUMENT when binary or stdout_path
  // is empty, NOT_FOUND/PERMISSION_DENIED/INTERNAL (with errno's text) when a
  // log file cannot be opened, fork fails or exec fails.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(
      const SubprocessOptions& options);

  // Kills (SIGKILL) and reaps the child if it has not been reaped yet.
  ~Subprocess();

  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }

  // Sends `sig` to the child. Returns FAILED_PRECONDITION when the child has
  // already been reaped (its pid may belong to another process by now), or
  // INTERNAL when kill(2) fails.
  absl::Status Signal(int sig);

  // Signal(SIGKILL).
  absl::Status Kill();

  // Waits up to `timeout` for the child to exit and returns its exit code,
  // or ExitCodeForSignal(sig) when a signal ended it. Once the child has
  // exited, every later call returns the same value at once. Returns
  // DEADLINE_EXCEEDED when the child is still running at the deadline (a
  // zero timeout just polls), INTERNAL when waiting fails. Waits on a pidfd
  // where the kernel has them, else polls every few milliseconds.
  absl::StatusOr<int> WaitForExit(absl::Duration timeout);

  // Returns true while the child has not exited (reaps it if it has).
  bool IsRunning();

  // Returns everything the child wrote to its stdout file so far (with
  // stderr interleaved unless it went to its own file), or "" when the file
  // cannot be read.
  std::string ReadLog() const;
  // Returns the contents of the separate stderr file; "" when stderr shares
  // the stdout file.
  std::string ReadStderr() const;

  const std::string& binary() const { return binary_; }
  const std::string& log_path() const { return stdout_path_; }
  // The separate stderr file; "" when stderr shares the stdout file.
  const std::string& stderr_path() const { return stderr_path_; }

 private:
  Subprocess(pid_t pid, int pidfd, std::string binary, std::string stdout_path,
             std::string stderr_path);

  // Reaps the child if it has exited; returns true when it is reaped.
  absl::StatusOr<bool> TryReap();

  const pid_t pid_;
  // Becomes readable when the child exits; -1 when pidfds are unavailable.
  int pidfd_;
  const std::string binary_;
  const std::string stdout_path_;
  const std::string stderr_path_;
  // Set once the child has been reaped.
  std::optional<int> exit_code_;
};

// Returns the whole contents of `path`, or NOT_FOUND/INTERNAL with errno's
// text when it cannot be read.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace chorus::test

#endif  // CHORUS_TESTS_TESTING_PROCESS_H_
