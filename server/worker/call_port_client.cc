#include "server/worker/call_port_client.h"

#include <errno.h>
#include <glog/logging.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/net.h"
#include "common/status_detail.h"
#include "common/tcp_socket.h"
#include "common/tls_session.h"
#include "server/worker/call_port_dial.h"
#include "server/worker/coordinator_status.h"

namespace chorus {
namespace {

// Replies carry at most a rank's inline result.
constexpr uint64_t kMaxReplyBytes = uint64_t{kDefaultMaxMessageBytes} + 4096;
// How long a call port that could not be reached is not tried again.
constexpr absl::Duration kUnreachableBackoff = absl::Seconds(10);
// How far ahead the completion thread reads while no call waits.
constexpr absl::Duration kIdleReadHorizon = absl::Seconds(10);

// "the commit of collective #<sequence> of group <group>", for statuses.
std::string CommitName(const v1::CommitRequest& request) {
  return absl::StrCat("the commit of collective #", request.sequence(),
                      " of group ", request.group());
}

}  // namespace

CallPortClient::CallPortClient(std::function<std::string()> address,
                               std::string coordinator, absl::Duration spin)
    : address_(std::move(address)),
      coordinator_(std::move(coordinator)),
      spin_(spin),
      cancel_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      frames_(kMaxReplyBytes),
      async_wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

CallPortClient::~CallPortClient() {
  Shutdown();
  absl::MutexLock lock(&mu_);
  if (fd_ >= 0) CloseSocket(fd_);
  for (int fd : retired_) CloseSocket(fd);
  if (cancel_fd_ >= 0) close(cancel_fd_);
  if (async_wake_fd_ >= 0) close(async_wake_fd_);
}

void CallPortClient::Shutdown() {
  std::thread completion;
  {
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
    // The completion thread runs the callbacks of the calls ended above.
    mu_.Await(absl::Condition(
        +[](int* active) { return *active == 0; }, &active_calls_));
    async_stop_ = true;
    async_changed_.Signal();
    completion = std::move(async_thread_);
  }
  if (completion.joinable()) completion.join();
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
  absl::StatusOr<CallPortConnection> dialed =
      DialCallPort(address, deadline, cancel_fd_);
  if (absl::IsFailedPrecondition(dialed.status())) {
    return Unreachable(address, std::string(dialed.status().message()));
  }
  if (!dialed.ok()) return dialed.status();
  return UseConnection(address, *std::move(dialed), fd, generation);
}

absl::Status CallPortClient::UseConnection(const std::string& address,
                                           CallPortConnection connection,
                                           int* fd, uint64_t* generation) {
  // No writer holds write_mu_ now, so retired sockets are unused unless a
  // reader is still in one.
  absl::MutexLock writing(&write_mu_);
  absl::MutexLock lock(&mu_);
  if (shut_down_) {
    CloseSocket(connection.fd);
    return absl::UnavailableError("this worker is shutting down");
  }
  if (!reader_) {
    for (int old : retired_) CloseSocket(old);
    retired_.clear();
  }
  fd_ = connection.fd;
  tls_ = std::move(connection.tls);
  connected_address_ = address;
  ++generation_;
  frames_.Reset();
  LOG(INFO) << "connected to the coordinator's call port at " << address
            << (tls_ != nullptr ? " with mutual TLS" : "");
  *fd = fd_;
  *generation = generation_;
  return absl::OkStatus();
}

absl::Status CallPortClient::Unreachable(const std::string& address,
                                         std::string why) {
  // Nothing was sent: the caller may take another way, and callers in the
  // next seconds skip the attempt.
  absl::MutexLock lock(&mu_);
  unreachable_address_ = address;
  unreachable_until_ = absl::Now() + kUnreachableBackoff;
  return absl::FailedPreconditionError(std::move(why));
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

bool CallPortClient::Connected() {
  absl::MutexLock lock(&mu_);
  return fd_ >= 0 && !shut_down_;
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
  return RoundTrip(std::move(framed), deadline, CommitName(request)).status();
}

absl::StatusOr<uint64_t> CallPortClient::Send(v1::CallPortRequest framed,
                                              absl::Time deadline,
                                              Waiter* waiter) {
  int fd = -1;
  uint64_t generation = 0;
  if (absl::Status connected = Connect(deadline, &fd, &generation);
      !connected.ok()) {
    return absl::UnavailableError(connected.message());
  }
  {
    absl::MutexLock lock(&mu_);
    // The connection may have broken since Connect() returned; a waiter
    // registered now would be missed by that break.
    if (shut_down_ || generation_ != generation) {
      return absl::UnavailableError(
          "the connection to the coordinator's call port broke");
    }
    framed.set_call_id(next_call_id_++);
    waiter->call_id = framed.call_id();
    waiters_[waiter->call_id] = waiter;
    const uint64_t one = 1;
    if (waiter->on_done != nullptr) {
      async_deadlines_.emplace(deadline, waiter->call_id);
      read_ahead_ = true;
      // The completion thread waits for calls, or reads until too late
      // for this one.
      async_changed_.Signal();
      if (async_read_until_ != absl::InfiniteFuture() &&
          deadline < async_read_until_ &&
          write(async_wake_fd_, &one, sizeof(one)) < 0) {
        // Only a full counter fails, and then the thread is woken already.
      }
    } else {
      read_ahead_ = false;
      // The completion thread reads ahead for no call: it stops, and this
      // caller reads its own reply rather than be handed it.
      if (async_read_until_ != absl::InfiniteFuture() &&
          async_deadlines_.empty() &&
          write(async_wake_fd_, &one, sizeof(one)) < 0) {
        // Only a full counter fails, and then the thread is woken already.
      }
    }
    // From here an asynchronous `waiter` may end (and go) at any time.
  }
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
    std::shared_ptr<TlsSession> tls;
    {
      absl::MutexLock lock(&mu_);
      current = generation_ == generation && !shut_down_;
      tls = tls_;
    }
    if (!current) {
      sent = absl::UnavailableError("the connection was replaced");
    } else if (tls != nullptr) {
      // Sealed under write_mu_, so records go out in the order made.
      std::string sealed;
      sent = tls->Seal(frame, &sealed);
      frame = std::move(sealed);
    }
    const absl::string_view bytes = frame;
    if (sent.ok()) sent = WriteAll(fd, &bytes, 1, deadline, cancel_fd_);
  }
  if (!sent.ok()) {
    // Part of a frame may be on the wire: the connection is unusable. Its
    // break ends the waiter.
    absl::MutexLock lock(&mu_);
    BreakLocked(generation,
                absl::UnavailableError(absl::StrCat(
                    "writing to the coordinator's call port failed: ",
                    sent.message())));
  }
  return generation;
}

absl::StatusOr<v1::CallPortReply> CallPortClient::RoundTrip(
    v1::CallPortRequest framed, absl::Time deadline, const std::string& what) {
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

  Waiter waiter;
  waiter.start = absl::Now();
  waiter.deadline = deadline;
  waiter.what = what;
  absl::StatusOr<uint64_t> generation =
      Send(std::move(framed), deadline, &waiter);
  if (!generation.ok()) return generation.status();

  absl::MutexLock lock(&mu_);
  while (!waiter.done) {
    if (absl::Now() >= deadline) {
      waiters_.erase(waiter.call_id);
      return SilentLocked(waiter);
    }
    if (generation_ != *generation || shut_down_) {
      waiter.done = true;
      waiter.result = absl::UnavailableError(
          "the connection to the coordinator's call port broke");
    } else if (!reader_ && fd_ >= 0) {
      reader_ = true;
      ReadAsReader(fd_, generation_, deadline);
    } else {
      changed_.WaitWithDeadline(&mu_, deadline);
    }
  }
  waiters_.erase(waiter.call_id);
  return std::move(waiter.result);
}

void CallPortClient::CallAsync(v1::CollectiveRequest request,
                               absl::Time deadline, CallDone done) {
  std::string what = absl::StrCat("collective #", request.sequence(),
                                  " of group ", request.group());
  v1::CallPortRequest framed;
  *framed.mutable_call() = std::move(request);
  SendAsync(std::move(framed), deadline, std::move(what),
            [done = std::move(done)](absl::StatusOr<v1::CallPortReply> reply) {
              if (!reply.ok()) {
                done(reply.status());
              } else {
                done(std::move(*reply->mutable_response()));
              }
            });
}

void CallPortClient::CommitAsync(const v1::CommitRequest& request,
                                 absl::Time deadline, CommitDone done) {
  v1::CallPortRequest framed;
  *framed.mutable_commit() = request;
  SendAsync(std::move(framed), deadline, CommitName(request),
            [done = std::move(done)](absl::StatusOr<v1::CallPortReply> reply) {
              done(reply.status());
            });
}

void CallPortClient::SendAsync(
    v1::CallPortRequest framed, absl::Time deadline, std::string what,
    std::function<void(absl::StatusOr<v1::CallPortReply>)> on_done) {
  auto waiter = std::make_unique<Waiter>();
  waiter->start = absl::Now();
  waiter->deadline = deadline;
  waiter->what = std::move(what);
  waiter->on_done = std::move(on_done);
  bool refused;
  {
    absl::MutexLock lock(&mu_);
    refused = shut_down_;
    if (!refused) {
      ++active_calls_;
      if (!async_thread_.joinable()) {
        async_thread_ = std::thread([this] { ServeAsync(); });
      }
    }
  }
  if (refused) {
    waiter->on_done(absl::UnavailableError("this worker is shutting down"));
    return;
  }
  absl::StatusOr<uint64_t> sent =
      Send(std::move(framed), deadline, waiter.get());
  if (sent.ok()) {
    // Registered: the completion thread owns (and ends) it now.
    waiter.release();
    return;
  }
  waiter->on_done(sent.status());
  absl::MutexLock lock(&mu_);
  --active_calls_;
}

void CallPortClient::ServeAsync() {
  pthread_setname_np(pthread_self(), "chorus-callport");
  absl::MutexLock lock(&mu_);
  while (true) {
    const absl::Time now = absl::Now();
    while (!async_deadlines_.empty() &&
           async_deadlines_.begin()->first <= now) {
      Waiter* late = waiters_.at(async_deadlines_.begin()->second);
      FinishLocked(late, SilentLocked(*late));
    }
    if (!async_done_.empty()) {
      std::vector<Waiter*> ended;
      ended.swap(async_done_);
      mu_.Unlock();
      for (Waiter* waiter : ended) {
        waiter->on_done(std::move(waiter->result));
        delete waiter;
      }
      mu_.Lock();
      active_calls_ -= static_cast<int>(ended.size());
      continue;
    }
    if (async_stop_) return;
    if (!reader_ && fd_ >= 0 && (read_ahead_ || !async_deadlines_.empty())) {
      // After an asynchronous call, reads even with no call waiting, until
      // a horizon: the next call's reply then wakes this thread once,
      // rather than once to start reading and once more for the reply. A
      // call due sooner, or a blocking call, cuts the read short.
      reader_ = true;
      async_read_until_ = async_deadlines_.empty()
                              ? absl::Now() + kIdleReadHorizon
                              : async_deadlines_.begin()->first;
      ReadAsReader(fd_, generation_, async_read_until_, async_wake_fd_);
      async_read_until_ = absl::InfiniteFuture();
    } else if (async_deadlines_.empty()) {
      async_changed_.Wait(&mu_);
    } else {
      async_changed_.WaitWithDeadline(&mu_, async_deadlines_.begin()->first);
    }
  }
}

void CallPortClient::FinishLocked(Waiter* waiter,
                                  absl::StatusOr<v1::CallPortReply> result) {
  waiter->done = true;
  waiter->result = std::move(result);
  if (waiter->on_done != nullptr) {
    async_deadlines_.erase({waiter->deadline, waiter->call_id});
    waiters_.erase(waiter->call_id);
    async_done_.push_back(waiter);
    async_changed_.Signal();
  }
}

absl::Status CallPortClient::SilentLocked(const Waiter& waiter) {
  return CoordinatorSilentError(
      coordinator_.empty()
          ? connected_address_
          : absl::StrCat(coordinator_, " (call port ", connected_address_, ")"),
      waiter.what, absl::Now() - waiter.start);
}

void CallPortClient::ReadAsReader(int fd, uint64_t generation,
                                  absl::Time deadline, int wake_fd) {
  char buffer[16 << 10];
  mu_.Unlock();
  // A reply comes after its call was sent: the reader waits before reading,
  // polling a while first (the reply often comes within microseconds).
  const int other_fd = wake_fd >= 0 ? wake_fd : cancel_fd_;
  spin_.Spin([&] { return ReadableNow(fd, other_fd); });
  absl::StatusOr<size_t> got =
      ReadSomeWhenReady(fd, buffer, sizeof(buffer), deadline, other_fd);
  const bool woken = wake_fd >= 0 && absl::IsCancelled(got.status());
  if (woken) {
    uint64_t count = 0;
    if (read(wake_fd, &count, sizeof(count)) < 0) {
      // Another wake-up read it first.
    }
  }
  mu_.Lock();
  reader_ = false;
  if (generation != generation_) {
    // The connection was replaced meanwhile; what was read belongs to it.
  } else if (woken) {
    // A call due sooner than the read's deadline came (or the client is
    // shutting down, which breaks the connection itself).
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
  if (!async_deadlines_.empty()) async_changed_.Signal();
}

void CallPortClient::HandleBytesLocked(uint64_t generation,
                                       absl::string_view bytes) {
  std::string plain;
  if (tls_ != nullptr) {
    // What TLS wants written (rare once the handshake is over) goes with
    // the next call.
    if (absl::Status opened = tls_->Open(bytes, &plain, nullptr);
        !opened.ok()) {
      BreakLocked(generation,
                  absl::UnavailableError(absl::StrCat(
                      "the coordinator's call port connection failed: ",
                      opened.message())));
      return;
    }
    bytes = plain;
  }
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
    if (it == waiters_.end() || it->second->done) continue;  // caller gave up
    if (verdict.ok()) {
      FinishLocked(it->second, std::move(reply));
    } else {
      FinishLocked(it->second, verdict);
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
  tls_ = nullptr;
  ++generation_;
  std::vector<Waiter*> waiting;
  for (auto& [call_id, waiter] : waiters_) {
    if (!waiter->done) waiting.push_back(waiter);
  }
  for (Waiter* waiter : waiting) FinishLocked(waiter, status);
  changed_.SignalAll();
}

}  // namespace chorus
