#include "bench/bench_process.h"

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
#include <vector>

#include "absl/strings/str_cat.h"

namespace chorus::bench {
namespace {

absl::Status ErrnoError(absl::string_view what, int err) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(err)));
}

int ExitCodeOf(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return -1;
}

int OpenPidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  const long fd = syscall(SYS_pidfd_open, pid, 0);
  if (fd >= 0) {
    fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
    return static_cast<int>(fd);
  }
#endif
  return -1;
}

// Writes errno to `fd` and exits; for the child between fork and exec, where
// only async-signal-safe calls are allowed.
[[noreturn]] void ChildFail(int fd) {
  const int err = errno;
  ssize_t ignored = write(fd, &err, sizeof(err));
  (void)ignored;
  _exit(127);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Spawn(
    const SpawnOptions& options) {
  if (options.binary.empty() || options.log_path.empty()) {
    return absl::InvalidArgumentError("a child needs a binary and a log path");
  }
  // Everything the child needs is prepared before fork.
  std::vector<std::string> argv_storage;
  argv_storage.push_back(options.binary);
  argv_storage.insert(argv_storage.end(), options.args.begin(),
                      options.args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);

  const int log_fd = open(options.log_path.c_str(),
                          O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return ErrnoError("open " + options.log_path, errno);
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0) {
    const int err = errno;
    close(log_fd);
    return ErrnoError("open /dev/null", err);
  }
  int out_pipe[2] = {-1, -1};
  int exec_pipe[2] = {-1, -1};
  auto close_all = [&] {
    for (int fd : {log_fd, null_fd, out_pipe[0], out_pipe[1], exec_pipe[0],
                   exec_pipe[1]}) {
      if (fd >= 0) close(fd);
    }
  };
  if ((options.capture_stdout && pipe2(out_pipe, O_CLOEXEC) != 0) ||
      pipe2(exec_pipe, O_CLOEXEC) != 0) {
    const int err = errno;
    close_all();
    return ErrnoError("pipe", err);
  }

  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    close_all();
    return ErrnoError("fork", err);
  }
  if (pid == 0) {
    // Child: die with the parent; checked again in case it already died.
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) ChildFail(exec_pipe[1]);
    if (getppid() != parent) _exit(127);
    const int out_fd = options.capture_stdout ? out_pipe[1] : log_fd;
    if (dup2(null_fd, STDIN_FILENO) < 0 || dup2(out_fd, STDOUT_FILENO) < 0 ||
        dup2(log_fd, STDERR_FILENO) < 0) {
      ChildFail(exec_pipe[1]);
    }
    // Handlers the parent installed do not survive exec; its mask would.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(argv[0], argv.data());
    ChildFail(exec_pipe[1]);
  }

  // Parent: the exec pipe reads EOF when exec succeeded, errno otherwise.
  close(exec_pipe[1]);
  exec_pipe[1] = -1;
  int child_errno = 0;
  ssize_t got;
  do {
    got = read(exec_pipe[0], &child_errno, sizeof(child_errno));
  } while (got < 0 && errno == EINTR);
  if (got > 0) {
    int status = 0;
    waitpid(pid, &status, 0);
    close_all();
    return ErrnoError("exec " + options.binary, child_errno);
  }
  int read_fd = -1;
  if (options.capture_stdout) {
    read_fd = out_pipe[0];
    out_pipe[0] = -1;
    fcntl(read_fd, F_SETFL, fcntl(read_fd, F_GETFL) | O_NONBLOCK);
  }
  close_all();
  return std::unique_ptr<ChildProcess>(
      new ChildProcess(pid, OpenPidfd(pid), read_fd, options.log_path));
}

ChildProcess::~ChildProcess() {
  Stop(absl::ZeroDuration());
  CloseStdout();
  if (pidfd_ >= 0) close(pidfd_);
}

void ChildProcess::CloseStdout() {
  if (stdout_fd_ >= 0) close(stdout_fd_);
  stdout_fd_ = -1;
}

absl::Status ChildProcess::Signal(int sig) {
  if (TryReap()) {
    return absl::FailedPreconditionError("the child has already exited");
  }
  if (kill(pid_, sig) != 0) return ErrnoError("kill", errno);
  return absl::OkStatus();
}

bool ChildProcess::TryReap() {
  if (exit_code_.has_value()) return true;
  int status = 0;
  pid_t got;
  do {
    got = waitpid(pid_, &status, WNOHANG);
  } while (got < 0 && errno == EINTR);
  if (got == pid_) {
    exit_code_ = ExitCodeOf(status);
    return true;
  }
  if (got < 0) {  // ECHILD: reaped elsewhere; treat as gone.
    exit_code_ = -1;
    return true;
  }
  return false;
}

absl::StatusOr<int> ChildProcess::WaitForExit(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!TryReap()) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("process ", pid_, " still runs"));
    }
    if (pidfd_ >= 0) {
      pollfd fd{pidfd_, POLLIN, 0};
      const int64_t ms = std::max<int64_t>(1, absl::ToInt64Milliseconds(left));
      poll(&fd, 1, static_cast<int>(std::min<int64_t>(ms, 1 << 30)));
    } else {
      absl::SleepFor(std::min(left, absl::Milliseconds(5)));
    }
  }
  return *exit_code_;
}

int ChildProcess::Stop(absl::Duration grace) {
  if (TryReap()) return *exit_code_;
  if (grace > absl::ZeroDuration()) {
    kill(pid_, SIGTERM);
    absl::StatusOr<int> code = WaitForExit(grace);
    if (code.ok()) return *code;
  }
  kill(pid_, SIGKILL);
  absl::StatusOr<int> code = WaitForExit(absl::Seconds(10));
  return code.ok() ? *code : -1;
}

std::string ChildProcess::LogTail(size_t max_bytes) const {
  std::ifstream in(log_path_, std::ios::binary);
  if (!in) return "";
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();
  if (text.size() > max_bytes)
    text = "..." + text.substr(text.size() - max_bytes);
  return text;
}

namespace {

int g_signal_pipe[2] = {-1, -1};
volatile sig_atomic_t g_signal = 0;

void OnSignal(int sig) {
  g_signal = sig;
  const char byte = 1;
  ssize_t ignored = write(g_signal_pipe[1], &byte, 1);
  (void)ignored;
}

}  // namespace

absl::StatusOr<int> InstallSignalPipe() {
  if (pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::InternalError("cannot create the signal pipe");
  }
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return g_signal_pipe[0];
}

int SignalCaught() { return g_signal; }

std::string SelfExecutable() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "";
  return std::string(path, static_cast<size_t>(n));
}

namespace {

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace

std::string FindCoordinatorBinary(const std::string& flag,
                                  const std::string& built) {
  if (!flag.empty()) return flag;
  const std::string self_dir = Dirname(SelfExecutable());
  const std::vector<std::string> candidates = {
      built, self_dir + "/chorus-coordinator",
      self_dir + "/../server/coordinator/chorus-coordinator"};
  for (const std::string& c : candidates) {
    if (!c.empty() && access(c.c_str(), X_OK) == 0) return c;
  }
  return built.empty() ? "chorus-coordinator" : built;
}

absl::StatusOr<int> WaitForPortFile(ChildProcess& coordinator,
                                    const std::string& path,
                                    absl::Duration timeout,
                                    const std::function<bool()>& interrupted) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (interrupted && interrupted()) {
      return absl::CancelledError("interrupted");
    }
    std::ifstream in(path);
    int port = 0;
    if (in >> port && port > 0) return port;
    if (coordinator.WaitForExit(absl::Milliseconds(20)).ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "chorus-coordinator exited at start:\n", coordinator.LogTail()));
    }
  }
  return absl::DeadlineExceededError(
      absl::StrCat("chorus-coordinator wrote no port file within ",
                   absl::FormatDuration(timeout)));
}

}  // namespace chorus::bench
