#include "server/worker/call_port_client.h"

#include <errno.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/common/net.h"
#include "server/common/status_detail.h"
#include "server/common/tcp_socket.h"
#include "server/worker/coordinator_status.h"

namespace chorus {
namespace {

// Replies carry at most a rank's inline result.
constexpr uint64_t kMaxReplyBytes = uint64_t{kDefaultMaxMessageBytes} + 4096;
// How long a call port that could not be reached is not tried again.
constexpr absl::Duration kUnreachableBackoff = absl::Seconds(10);

}  // namespace

CallPortClient::CallPortClient(std::function<std::string()> address,
                               std::string coordinator)
    : address_(std::move(address)),
      coordinator_(std::move(coordinator)),
      cancel_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      frames_(kMaxReplyBytes) {}

CallPortClient::~CallPortClient() {
  Shutdown();
  absl::MutexLock lock(&mu_);
  if (fd_ >= 0) CloseSocket(fd_);
  for (int fd : retired_) CloseSocket(fd);
  if (cancel_fd_ >= 0) close(cancel_fd_);
}

void CallPortClient::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (!shut_down_) {
    shut_down_ = true;
    BreakLocked(generation_,
                absl::UnavailableError("this worker is shutting down"));
    const uint64_t one = 1;
    // Ends writes and connects waiting in poll().
    if (cancel_fd_ >= 0 && write(cancel_fd_, &one, sizeof(one)) < 0) {
      // The socket shutdown above ends them too, just later.
    }
  }
  mu_.Await(absl::Condition(
      +[](int* active) { return *active == 0; }, &active_calls_));
}

absl::Status CallPortClient::Connect(absl::Time deadline, int* fd,
                                     uint64_t* generation) {
  absl::MutexLock connecting(&connect_mu_);
  const std::string address = address_();
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) {
      return absl::UnavailableError("this worker is shutting down");
    }
    // A connection nobody was reading may have ended unnoticed (the
    // coordinator stopped or restarted, maybe on another port).
    // Late replies still queued are read (and dropped) first, so that a
    // close behind them is seen.
    if (fd_ >= 0 &&
        (address != connected_address_ || (!reader_ && !DrainLocked()))) {
      BreakLocked(generation_,
                  absl::UnavailableError("the coordinator's call port "
                                         "connection ended"));
    }
    if (fd_ >= 0) {
      *fd = fd_;
      *generation = generation_;
      return absl::OkStatus();
    }
  }
  if (address.empty()) {
    return absl::FailedPreconditionError("the coordinator has no call port");
  }
  {
    absl::MutexLock lock(&mu_);
    if (address == unreachable_address_ && absl::Now() < unreachable_until_) {
      return absl::FailedPreconditionError(
          absl::StrCat("the coordinator's call port at ", address,
                       " was unreachable moments ago"));
    }
  }
  absl::StatusOr<HostPort> target = SplitHostPort(address);
  if (!target.ok()) return target.status();
  // A coordinator that does not answer should not hold a caller (or
  // Shutdown(), which waits for callers) for a whole call's deadline.
  absl::StatusOr<int> connected =
      ConnectTcp(target->host, target->port,
                 std::min(deadline, absl::Now() + absl::Seconds(5)));
  if (!connected.ok()) {
    // Nothing was sent: the caller may take another way, and callers in
    // the next seconds skip the attempt.
    absl::MutexLock lock(&mu_);
    unreachable_address_ = address;
    unreachable_until_ = absl::Now() + kUnreachableBackoff;
    return absl::FailedPreconditionError(
        absl::StrCat("cannot reach the coordinator's call port at ", address,
                     ": ", connected.status().message()));
  }
  const absl::string_view hello = kCallHello;
  if (absl::Status sent = WriteAll(*connected, &hello, 1, deadline, cancel_fd_);
      !sent.ok()) {
    CloseSocket(*connected);
    return absl::UnavailableError(absl::StrCat(
        "cannot greet the coordinator's call port: ", sent.message()));
  }
  // No writer holds write_mu_ now, so retired sockets are unused unless a
  // reader is still in one.
  absl::MutexLock writing(&write_mu_);
  absl::MutexLock lock(&mu_);
  if (shut_down_) {
    CloseSocket(*connected);
    return absl::UnavailableError("this worker is shutting down");
  }
  if (!reader_) {
    for (int old : retired_) CloseSocket(old);
    retired_.clear();
  }
  fd_ = *connected;
  connected_address_ = address;
  ++generation_;
  frames_.Reset();
  *fd = fd_;
  *generation = generation_;
  return absl::OkStatus();
}

absl::Status CallPortClient::Ready(absl::Time deadline) {
  {
    // Cheap when connected: the call itself checks the connection.
    absl::MutexLock lock(&mu_);
    if (shut_down_) {
      return absl::UnavailableError("this worker is shutting down");
    }
    if (fd_ >= 0) return absl::OkStatus();
  }
  int fd = -1;
  uint64_t generation = 0;
  return Connect(deadline, &fd, &generation);
}

absl::StatusOr<v1::CollectiveResponse> CallPortClient::Call(
    v1::CollectiveRequest request, absl::Time deadline) {
  const std::string what = absl::StrCat("collective #", request.sequence(),
                                        " of group ", request.group());
  v1::CallPortRequest framed;
  *framed.mutable_call() = std::move(request);
  absl::StatusOr<v1::CallPortReply> reply =
      RoundTrip(std::move(framed), deadline, what);
  if (!reply.ok()) return reply.status();
  return std::move(*reply->mutable_response());
}

absl::StatusOr<v1::ReportFailureResponse> CallPortClient::ReportFailure(
    const v1::ReportFailureRequest& request, absl::Time deadline) {
  v1::CallPortRequest framed;
  *framed.mutable_failure() = request;
  absl::StatusOr<v1::CallPortReply> reply = RoundTrip(
      std::move(framed), deadline,
      absl::StrCat("the failure report of collective #", request.sequence(),
                   " of group ", request.group()));
  if (!reply.ok()) return reply.status();
  v1::ReportFailureResponse response;
  if (reply->has_abort()) *response.mutable_abort() = reply->abort();
  return response;
}

absl::Status CallPortClient::Commit(const v1::CommitRequest& request,
                                    absl::Time deadline) {
  v1::CallPortRequest framed;
  *framed.mutable_commit() = request;
  return RoundTrip(
             std::move(framed), deadline,
             absl::StrCat("the commit of collective #", request.sequence(),
                          " of group ", request.group()))
      .status();
}

absl::StatusOr<v1::CallPortReply> CallPortClient::RoundTrip(
    v1::CallPortRequest framed, absl::Time deadline, const std::string& what) {
  const absl::Time start = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) {
      return absl::UnavailableError("this worker is shutting down");
    }
    ++active_calls_;
  }
  struct Leave {
    CallPortClient* client;
    ~Leave() {
      absl::MutexLock lock(&client->mu_);
      --client->active_calls_;
    }
  } leave{this};

  int fd = -1;
  uint64_t generation = 0;
  if (absl::Status connected = Connect(deadline, &fd, &generation);
      !connected.ok()) {
    return absl::UnavailableError(connected.message());
  }
  Waiter waiter;
  {
    absl::MutexLock lock(&mu_);
    // The connection may have broken since Connect() returned; a waiter
    // registered now would be missed by that break.
    if (shut_down_ || generation_ != generation) {
      return absl::UnavailableError(
          "the connection to the coordinator's call port broke");
    }
    framed.set_call_id(next_call_id_++);
    waiters_[framed.call_id()] = &waiter;
  }
  const uint64_t call_id = framed.call_id();
  framed.set_timeout_us(
      std::max<int64_t>(1, absl::ToInt64Microseconds(deadline - absl::Now())));
  std::string frame;
  AppendCallFrame(framed.SerializeAsString(), &frame);
  absl::Status sent;
  {
    // Retired sockets are closed only under write_mu_, so `fd` stays this
    // connection's socket while the write runs, if it still is now.
    absl::MutexLock writing(&write_mu_);
    bool current;
    {
      absl::MutexLock lock(&mu_);
      current = generation_ == generation && !shut_down_;
    }
    const absl::string_view bytes = frame;
    sent = current ? WriteAll(fd, &bytes, 1, deadline, cancel_fd_)
                   : absl::UnavailableError("the connection was replaced");
  }

  absl::MutexLock lock(&mu_);
  if (!sent.ok()) {
    // Part of a frame may be on the wire: the connection is unusable.
    BreakLocked(generation,
                absl::UnavailableError(absl::StrCat(
                    "writing to the coordinator's call port failed: ",
                    sent.message())));
  }
  while (!waiter.done) {
    if (absl::Now() >= deadline) {
      waiters_.erase(call_id);
      return CoordinatorSilentError(
          coordinator_.empty() ? connected_address_
                               : absl::StrCat(coordinator_, " (call port ",
                                              connected_address_, ")"),
          what, absl::Now() - start);
    }
    if (generation_ != generation || shut_down_) {
      waiter.done = true;
      waiter.result = absl::UnavailableError(
          "the connection to the coordinator's call port broke");
    } else if (!reader_ && fd_ == fd) {
      reader_ = true;
      ReadAsReader(fd, generation, deadline);
    } else {
      changed_.WaitWithDeadline(&mu_, deadline);
    }
  }
  waiters_.erase(call_id);
  return std::move(waiter.result);
}

void CallPortClient::ReadAsReader(int fd, uint64_t generation,
                                  absl::Time deadline) {
  char buffer[16 << 10];
  mu_.Unlock();
  absl::StatusOr<size_t> got =
      ReadSome(fd, buffer, sizeof(buffer), deadline, cancel_fd_);
  mu_.Lock();
  reader_ = false;
  if (generation != generation_) {
    // The connection was replaced meanwhile; what was read belongs to it.
  } else if (got.ok()) {
    HandleBytesLocked(generation, absl::string_view(buffer, *got));
  } else if (!absl::IsDeadlineExceeded(got.status())) {
    BreakLocked(generation,
                absl::UnavailableError(absl::StrCat(
                    "the connection to the coordinator's call port broke: ",
                    got.status().message())));
  }
  // Replies handed out, or the reader role is free for another caller.
  changed_.SignalAll();
}

void CallPortClient::HandleBytesLocked(uint64_t generation,
                                       absl::string_view bytes) {
  frames_.Append(bytes);
  std::string payload;
  while (generation == generation_) {
    absl::StatusOr<bool> next = frames_.Next(&payload);
    if (!next.ok()) {
      BreakLocked(generation, absl::UnavailableError(next.status().message()));
      return;
    }
    if (!*next) return;
    v1::CallPortReply reply;
    if (!reply.ParseFromString(payload)) {
      BreakLocked(generation,
                  absl::UnavailableError(
                      "the coordinator's call port sent a malformed reply"));
      return;
    }
    const absl::Status verdict =
        StatusWithDetail(static_cast<absl::StatusCode>(reply.code()),
                         reply.message(), reply.detail());
    if (reply.call_id() == 0) {
      // About the connection, not a call.
      BreakLocked(
          generation,
          absl::UnavailableError(absl::StrCat(
              "the coordinator's call port refused this worker: ",
              verdict.ToString(absl::StatusToStringMode::kWithNoExtraData))));
      return;
    }
    auto it = waiters_.find(reply.call_id());
    if (it == waiters_.end()) continue;  // its caller gave up
    it->second->done = true;
    if (verdict.ok()) {
      it->second->result = std::move(reply);
    } else {
      it->second->result = verdict;
    }
  }
}

bool CallPortClient::DrainLocked() {
  char buffer[16 << 10];
  while (fd_ >= 0) {
    const ssize_t n = recv(fd_, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n > 0) {
      HandleBytesLocked(generation_,
                        absl::string_view(buffer, static_cast<size_t>(n)));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    return false;  // closed by the peer, or failed
  }
  return false;
}

void CallPortClient::BreakLocked(uint64_t generation,
                                 const absl::Status& status) {
  if (generation != generation_ || fd_ < 0) return;
  ShutdownSocket(fd_);
  retired_.push_back(fd_);
  fd_ = -1;
  ++generation_;
  for (auto& [call_id, waiter] : waiters_) {
    if (waiter->done) continue;
    waiter->done = true;
    waiter->result = status;
  }
  changed_.SignalAll();
}

}  // namespace chorus
