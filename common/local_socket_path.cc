#include "common/local_socket_path.h"

#include <unistd.h>

#include <cstdlib>

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

}  // namespace chorus
