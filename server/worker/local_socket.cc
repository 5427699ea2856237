#include "server/worker/local_socket.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace chorus {
namespace {

// Makes `dir` and its missing parents, each with mode 0700.
absl::Status MakeDirectories(const std::string& dir) {
  if (dir.empty()) return absl::OkStatus();
  struct stat info;
  if (stat(dir.c_str(), &info) == 0) {
    if (S_ISDIR(info.st_mode)) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat(dir, " is not a directory"));
  }
  const size_t slash = dir.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    absl::Status parent = MakeDirectories(dir.substr(0, slash));
    if (!parent.ok()) return parent;
  }
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::UnavailableError(
        absl::StrCat("cannot make directory ", dir, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

std::string DefaultLocalSocketPath() {
  const char* runtime_dir = std::getenv("XDG_RUNTIME_DIR");
  if (runtime_dir != nullptr && runtime_dir[0] != '\0') {
    return absl::StrCat(runtime_dir, "/chorus/worker.sock");
  }
  return absl::StrCat("/tmp/chorus-", getuid(), "/worker.sock");
}

absl::Status PrepareLocalSocket(const std::string& path) {
  sockaddr_un address{};
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("local socket path '", path, "' must be 1 to ",
                     sizeof(address.sun_path) - 1, " bytes long"));
  }
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos) {
    absl::Status made = MakeDirectories(path.substr(0, slash));
    if (!made.ok()) return made;
  }
  struct stat info;
  if (lstat(path.c_str(), &info) != 0) return absl::OkStatus();
  if (!S_ISSOCK(info.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " exists and is not a socket"));
  }
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError("cannot make a Unix socket");
  const bool live = connect(fd, reinterpret_cast<const sockaddr*>(&address),
                            sizeof(address)) == 0;
  close(fd);
  if (live) {
    return absl::FailedPreconditionError(absl::StrCat(
        "another process serves the local socket ", path,
        " (is a worker already running?); give this worker another "
        "--local_socket"));
  }
  unlink(path.c_str());
  return absl::OkStatus();
}

absl::Status RestrictLocalSocket(const std::string& path) {
  if (chmod(path.c_str(), 0600) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot restrict local socket ",
                                               path, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace chorus
