#include "common/daemon.h"

#include <glog/logging.h>
#include <signal.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace chorus {
namespace {

sigset_t TerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

}  // namespace

void InitDaemon(int argc, char** argv, absl::string_view usage) {
  absl::SetProgramUsageMessage(usage);
  // --help lists the flags defined in the daemons' *_main.cc files and the
  // transport security and metrics flags they share.
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [](absl::string_view file) {
    // The daemon's own flags, and the shared ones of *_flags.cc
    // (security, metrics, the coordinator's election).
    return absl::EndsWith(file, "_main.cc") ||
           absl::EndsWith(file, "_flags.cc");
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
  absl::ParseCommandLine(argc, argv);
#ifdef NDEBUG
  // An Abseil built without NDEBUG (Debian's is) checks every lock for a
  // deadlock cycle in one process-wide graph: a cost on every call's path.
  // Release daemons leave lock-order checking to the test builds (TSan).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  sigset_t set = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // A peer that closes while a daemon writes to it (a scraper that goes away
  // mid-response over TLS, where the write is OpenSSL's) must cost that
  // connection, not the daemon.
  signal(SIGPIPE, SIG_IGN);
  // Every connection costs a descriptor, and the usual soft limit (1,024)
  // runs out long before memory does under many clients (or a flood of
  // unauthenticated ones, which the ports cap and drop).
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 &&
      files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
}

int WaitForTerminationSignal() {
  sigset_t set = TerminationSignals();
  int signal = 0;
  while (sigwait(&set, &signal) != 0) {
  }
  return signal;
}

absl::Status WritePortFile(const std::string& path, int port) {
  std::string tmp = absl::StrCat(path, ".tmp");
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << port << "\n";
    out.close();
    if (!out) {
      return absl::InternalError(absl::StrCat("cannot write ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path,
                                            ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace chorus
