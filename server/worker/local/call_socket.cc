#include "server/worker/local/call_socket.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "chorus/v1/worker.pb.h"
#include "common/tcp_socket.h"
#include "server/worker/local/call_frames.h"

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

// OK when only this user (or root) can put files in `dir`: it is ours or
// root's, and others cannot write it unless it is sticky (as /tmp is: there
// no one else can replace our socket). FAILED_PRECONDITION saying what to
// fix otherwise.
absl::Status CheckSocketDirectory(const std::string& dir) {
  struct stat info;
  if (stat(dir.c_str(), &info) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot inspect directory ", dir, ": ", strerror(errno)));
  }
  const bool others_write = (info.st_mode & (S_IWGRP | S_IWOTH)) != 0 &&
                            (info.st_mode & S_ISVTX) == 0;
  if ((info.st_uid != geteuid() && info.st_uid != 0) || others_write) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the local socket's directory %s belongs to uid %d with mode %04o: "
        "another user could replace the socket and receive your ranks' "
        "calls. Remove it (a worker makes it again, mode 0700), or give "
        "--local_socket a path in a directory only you can write",
        dir, info.st_uid, info.st_mode & 07777));
  }
  return absl::OkStatus();
}

std::string ErrorPayload(const absl::Status& status) {
  return LocalCallReplyFor(0, status).SerializeAsString();
}

// Handles one frame of a connection. Returns false to close it.
bool HandleFrame(LocalCalls* calls, std::string payload,
                 FrameServer::Replier reply) {
  v1::LocalCallFrame frame;
  if (!frame.ParseFromString(payload) || frame.call_id() == 0) {
    reply.Send(ErrorPayload(absl::InvalidArgumentError(
        "a call socket frame that is not a LocalCallFrame with a nonzero "
        "call_id")));
    return false;
  }
  RunLocalCallFrame(calls, std::move(frame),
                    [reply](v1::LocalCallReply& answer) {
                      reply.Send(answer.SerializeAsString());
                    });
  return true;
}

}  // namespace

absl::Status PrepareLocalSocket(const std::string& path) {
  sockaddr_un address{};
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("local socket path '", path, "' must be 1 to ",
                     sizeof(address.sun_path) - 1, " bytes long"));
  }
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? std::string(".")
                          : slash == 0               ? std::string("/")
                                                     : path.substr(0, slash);
  absl::Status made = MakeDirectories(dir);
  if (made.ok()) made = CheckSocketDirectory(dir);
  if (!made.ok()) return made;
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
        ": a worker already running on this host, or on another host or "
        "container that shares this file system; give this worker a "
        "--local_socket of its own, and its clients that path "
        "(chorusctl --worker=unix:PATH, CHORUS_WORKER=unix:PATH)"));
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

absl::StatusOr<std::unique_ptr<LocalCallSocket>> LocalCallSocket::Start(
    const std::string& path, LocalCalls* calls, uint64_t max_frame_bytes,
    absl::Duration spin) {
  absl::Status prepared = PrepareLocalSocket(path);
  if (!prepared.ok()) return prepared;
  absl::StatusOr<Listener> listener = ListenUnix(path);
  if (!listener.ok()) return listener.status();
  FrameServer::Options options;
  options.name = "call socket";
  options.spin = spin;
  options.hello = std::string(kLocalCallHello);
  options.max_frame_bytes = max_frame_bytes;
  options.error_payload = ErrorPayload;
  absl::StatusOr<std::unique_ptr<FrameServer>> frames = FrameServer::Start(
      listener->fd, std::move(options),
      [calls](std::string payload, FrameServer::Replier reply,
              const Identity* /*peer: a Unix socket has none*/) {
        return HandleFrame(calls, std::move(payload), std::move(reply));
      });
  if (!frames.ok()) {
    unlink(path.c_str());
    return frames.status();
  }
  return std::unique_ptr<LocalCallSocket>(
      new LocalCallSocket(path, *std::move(frames)));
}

LocalCallSocket::~LocalCallSocket() { Shutdown(); }

void LocalCallSocket::Shutdown() {
  if (shut_down_.exchange(true)) return;
  frames_->Shutdown();
  unlink(path_.c_str());
}

}  // namespace chorus
