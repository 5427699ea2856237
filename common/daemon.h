// Process plumbing shared by the Chorus daemons: flag parsing with a usage
// message, logging to stderr, waiting for SIGTERM/SIGINT, and port files.
//
// InitDaemon must run first in main, before any thread starts, so that the
// termination signals are blocked in every thread and only
// WaitForTerminationSignal receives them.
#ifndef CHORUS_COMMON_DAEMON_H_
#define CHORUS_COMMON_DAEMON_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace chorus {

// Parses Abseil flags (exits with the usage on --help or a bad flag), sends
// glog output to stderr, blocks SIGTERM and SIGINT in the calling thread
// and every thread it starts later, ignores SIGPIPE (a write to a peer
// that closed fails with EPIPE instead of ending the daemon), and raises the
// soft limit on open files to the hard limit.
void InitDaemon(int argc, char** argv, absl::string_view usage);

// Blocks the calling thread until SIGTERM or SIGINT arrives; returns the
// signal number.
int WaitForTerminationSignal();

// Writes "<port>\n" to `path` atomically (a reader sees the whole file or
// none). Returns an error status when the file cannot be written.
absl::Status WritePortFile(const std::string& path, int port);

}  // namespace chorus

#endif  // CHORUS_COMMON_DAEMON_H_
