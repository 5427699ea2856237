#include "tests/testing/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace chorus::test {
namespace {

// Pause between waitpid polls where no pidfd is available.
constexpr absl::Duration kPollPause = absl::Milliseconds(5);

absl::Status ErrnoError(int error, absl::string_view what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(error));
  switch (error) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InternalError(message);
  }
}

int OpenForAppend(const std::string& path) {
  return open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

// Returns a pidfd for `pid`, or -1 where the kernel has none (before 5.3, or
// a sandbox that filters the call); callers then poll.
int OpenPidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  return -1;
#endif
}

int DecodeWaitStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return ExitCodeForSignal(WTERMSIG(status));
  return -1;
}

// Runs in the child between fork and exec: only async-signal-safe calls.
// Never returns.
[[noreturn]] void ExecChild(pid_t parent, const char* binary, char* const* argv,
                            int stdin_fd, int stdout_fd, int stderr_fd,
                            int error_pipe) {
  // Die with the thread that started us, so no daemon outlives its test.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // the parent is already gone

  // Undo what the test process may have changed: blocked signals and
  // ignored dispositions survive exec.
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  struct sigaction default_action;
  std::memset(&default_action, 0, sizeof(default_action));
  default_action.sa_handler = SIG_DFL;
  for (int sig : {SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGCHLD}) {
    sigaction(sig, &default_action, nullptr);
  }

  if (dup2(stdin_fd, STDIN_FILENO) < 0 || dup2(stdout_fd, STDOUT_FILENO) < 0 ||
      dup2(stderr_fd, STDERR_FILENO) < 0) {
    const int error = errno;
    (void)!write(error_pipe, &error, sizeof(error));
    _exit(127);
  }
  execv(binary, argv);
  const int error = errno;
  (void)!write(error_pipe, &error, sizeof(error));
  _exit(127);
}

}  // namespace

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoError(errno, absl::StrCat("cannot open ", path));
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(
    const SubprocessOptions& options) {
  if (options.binary.empty()) {
    return absl::InvalidArgumentError("Subprocess: no binary given");
  }
  if (options.stdout_path.empty()) {
    return absl::InvalidArgumentError("Subprocess: no stdout_path given");
  }

  // Everything the child needs is prepared here: after fork it may not
  // allocate.
  std::vector<std::string> storage;
  storage.reserve(options.args.size() + 1);
  storage.push_back(options.binary);
  storage.insert(storage.end(), options.args.begin(), options.args.end());
  std::vector<char*> argv;
  for (std::string& arg : storage) argv.push_back(arg.data());
  argv.push_back(nullptr);

  // The fds are opened close-on-exec; dup2 in the child clears the flag on
  // the copies that become 0, 1 and 2.
  struct Fds {
    int stdin_fd = -1, stdout_fd = -1, stderr_fd = -1;
    int pipe[2] = {-1, -1};
    ~Fds() {
      for (int fd : {stdin_fd, stdout_fd, stderr_fd, pipe[0], pipe[1]}) {
        if (fd >= 0) close(fd);
      }
    }
  } fds;
  fds.stdin_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (fds.stdin_fd < 0) return ErrnoError(errno, "cannot open /dev/null");
  fds.stdout_fd = OpenForAppend(options.stdout_path);
  if (fds.stdout_fd < 0) {
    return ErrnoError(errno, absl::StrCat("cannot open ", options.stdout_path));
  }
  if (!options.stderr_path.empty()) {
    fds.stderr_fd = OpenForAppend(options.stderr_path);
    if (fds.stderr_fd < 0) {
      return ErrnoError(errno,
                        absl::StrCat("cannot open ", options.stderr_path));
    }
  }
  // Exec failures travel back through this pipe; a successful exec closes
  // it, and the parent reads end-of-file.
  if (pipe2(fds.pipe, O_CLOEXEC) != 0) {
    return ErrnoError(errno, "pipe2");
  }

  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return ErrnoError(errno, "fork");
  if (pid == 0) {
    ExecChild(parent, storage[0].c_str(), argv.data(), fds.stdin_fd,
              fds.stdout_fd, fds.stderr_fd >= 0 ? fds.stderr_fd : fds.stdout_fd,
              fds.pipe[1]);
  }

  close(fds.pipe[1]);
  fds.pipe[1] = -1;
  int exec_error = 0;
  ssize_t n;
  do {
    n = read(fds.pipe[0], &exec_error, sizeof(exec_error));
  } while (n < 0 && errno == EINTR);
  if (n > 0) {
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return ErrnoError(exec_error, absl::StrCat("cannot exec ", options.binary));
  }
  return std::unique_ptr<Subprocess>(
      new Subprocess(pid, OpenPidfd(pid), options.binary, options.stdout_path,
                     options.stderr_path));
}

Subprocess::Subprocess(pid_t pid, int pidfd, std::string binary,
                       std::string stdout_path, std::string stderr_path)
    : pid_(pid),
      pidfd_(pidfd),
      binary_(std::move(binary)),
      stdout_path_(std::move(stdout_path)),
      stderr_path_(std::move(stderr_path)) {}

Subprocess::~Subprocess() {
  if (!exit_code_.has_value()) {
    kill(pid_, SIGKILL);
    int status;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
  if (pidfd_ >= 0) close(pidfd_);
}

absl::Status Subprocess::Signal(int sig) {
  if (exit_code_.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("process ", pid_, " (", binary_, ") already exited with ",
                     *exit_code_));
  }
  if (kill(pid_, sig) != 0) {
    return ErrnoError(errno, absl::StrCat("kill(", pid_, ", ", sig, ")"));
  }
  return absl::OkStatus();
}

absl::Status Subprocess::Kill() { return Signal(SIGKILL); }

absl::StatusOr<bool> Subprocess::TryReap() {
  if (exit_code_.has_value()) return true;
  int status = 0;
  pid_t reaped;
  do {
    reaped = waitpid(pid_, &status, WNOHANG);
  } while (reaped < 0 && errno == EINTR);
  if (reaped < 0) {
    return ErrnoError(errno, absl::StrCat("waitpid(", pid_, ")"));
  }
  if (reaped == 0) return false;
  exit_code_ = DecodeWaitStatus(status);
  return true;
}

absl::StatusOr<int> Subprocess::WaitForExit(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    absl::StatusOr<bool> reaped = TryReap();
    if (!reaped.ok()) return reaped.status();
    if (*reaped) return *exit_code_;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "process ", pid_, " (", binary_, ") still running after ",
          absl::FormatDuration(timeout)));
    }
    if (pidfd_ >= 0) {
      // Readable once the child has exited. Round up so a sub-millisecond
      // remainder does not turn into a busy loop.
      pollfd fd = {pidfd_, POLLIN, 0};
      const int64_t ms =
          absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)));
      poll(&fd, 1, static_cast<int>(std::min<int64_t>(ms, 1000)));
    } else {
      absl::SleepFor(std::min(left, kPollPause));
    }
  }
}

bool Subprocess::IsRunning() {
  absl::StatusOr<bool> reaped = TryReap();
  return reaped.ok() && !*reaped;
}

std::string Subprocess::ReadLog() const {
  absl::StatusOr<std::string> log = ReadFileToString(stdout_path_);
  return log.ok() ? *std::move(log) : "";
}

std::string Subprocess::ReadStderr() const {
  if (stderr_path_.empty()) return "";
  absl::StatusOr<std::string> log = ReadFileToString(stderr_path_);
  return log.ok() ? *std::move(log) : "";
}

}  // namespace chorus::test
