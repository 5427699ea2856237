#include "common/local_socket_path.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace chorus {

std::string DefaultLocalSocketPath() {
  const char* runtime_dir = std::getenv("XDG_RUNTIME_DIR");
  if (runtime_dir != nullptr && runtime_dir[0] != '\0') {
    return absl::StrCat(runtime_dir, "/chorus/worker.sock");
  }
  return absl::StrCat("/tmp/chorus-", getuid(), "/worker.sock");
}

std::string CallSocketPath(const std::string& local_socket) {
  return absl::StrCat(local_socket, ".calls");
}

absl::Status CheckSocketPeer(const std::string& target) {
  std::string path;
  if (absl::StartsWith(target, "unix://")) {
    path = target.substr(7);
  } else if (absl::StartsWith(target, "unix:")) {
    path = target.substr(5);
  } else {
    return absl::OkStatus();
  }
  sockaddr_un address{};
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::OkStatus();  // the channel says what is wrong
  }
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::OkStatus();
  ucred peer{};
  socklen_t length = sizeof(peer);
  const bool known =
      connect(fd, reinterpret_cast<const sockaddr*>(&address),
              sizeof(address)) == 0 &&
      getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) == 0;
  close(fd);
  if (!known || peer.uid == geteuid() || peer.uid == 0) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "the socket ", path, " is served by uid ", peer.uid,
      ", not by this user (uid ", geteuid(),
      ") or root: another user's process may be posing as your worker; "
      "start your own worker with a --local_socket in a directory only you "
      "can write"));
}

}  // namespace chorus
