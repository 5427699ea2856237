// The Unix domain socket a worker serves its local API on: where it is by
// default, making sure no other live worker uses it, and keeping it private
// to the user that runs the worker (the socket's permissions are what guard
// the local API, which runs collectives as any rank).
//
// Pure functions over the file system; thread-safe.
#ifndef CHORUS_SERVER_WORKER_LOCAL_SOCKET_H_
#define CHORUS_SERVER_WORKER_LOCAL_SOCKET_H_

#include <string>

#include "absl/status/status.h"

namespace chorus {

// Returns $XDG_RUNTIME_DIR/chorus/worker.sock, or /tmp/chorus-UID/worker.sock
// when XDG_RUNTIME_DIR is unset: where a worker serves its local API and
// where clients look for it when given no address.
std::string DefaultLocalSocketPath();

// Readies `path` for a new socket: creates its directory (mode 0700) when
// missing and removes a socket left by a worker that is gone. Returns
// FAILED_PRECONDITION when a live process answers on it or `path` is not a
// socket, INVALID_ARGUMENT for a path too long for a socket address, and
// UNAVAILABLE when the directory cannot be made.
absl::Status PrepareLocalSocket(const std::string& path);

// Makes the socket at `path` accessible to its owner only (mode 0600).
// Returns UNAVAILABLE when it cannot.
absl::Status RestrictLocalSocket(const std::string& path);

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_LOCAL_SOCKET_H_
