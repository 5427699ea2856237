// Where a worker's Unix sockets are: the local API's socket and the call
// socket beside it. The worker serves them (server/worker/local/
// call_socket.h); clients look for them there when given no address.
//
// Thread safety: the functions are thread-safe.
#ifndef CHORUS_COMMON_LOCAL_SOCKET_PATH_H_
#define CHORUS_COMMON_LOCAL_SOCKET_PATH_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace chorus {

// Returns $XDG_RUNTIME_DIR/chorus/worker.sock, or /tmp/chorus-UID/worker.sock
// when XDG_RUNTIME_DIR is unset: where a worker serves its local API and
// where clients look for it when given no address.
std::string DefaultLocalSocketPath();

// What every call socket connection starts with.
inline constexpr absl::string_view kLocalCallHello = "CHORUS-LOCAL/1\n";

// Where a worker whose local socket is `local_socket` serves its call
// socket: beside it, with ".calls" appended.
std::string CallSocketPath(const std::string& local_socket);

// For a "unix:PATH" (or "unix://PATH") gRPC target: OK when the process
// serving the socket runs as this user or as root (SO_PEERCRED), or when
// nothing answers there (the call reports that). PERMISSION_DENIED naming
// the other uid otherwise: it could be posing as the worker. OK for any
// other target.
absl::Status CheckSocketPeer(const std::string& target);

}  // namespace chorus

#endif  // CHORUS_COMMON_LOCAL_SOCKET_PATH_H_
