#include "server/worker/collective_stream_client.h"

#include <grpcpp/client_context.h>
#include <grpcpp/support/client_callback.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/common/grpc_status.h"

namespace chorus {
namespace {

// A call goes on a fresh stream when it could end less than this before
// the current stream's own deadline.
constexpr absl::Duration kStreamMargin = absl::Minutes(1);

}  // namespace

struct CollectiveStreamClient::StreamActions {
  const v1::CollectiveStreamRequest* write = nullptr;
  bool writes_done = false;
  bool any() const { return write != nullptr || writes_done; }
};

// One Coordinator.CollectiveStream. Its state is guarded by the client's
// mutex. A hold keeps gRPC from ending the stream while a thread outside
// its reactions may still write on it; it is released once the stream broke
// or, retired, was half-closed, and no such thread is left.
class CollectiveStreamClient::Stream final
    : public grpc::ClientBidiReactor<v1::CollectiveStreamRequest,
                                     v1::CollectiveStreamReply> {
 public:
  Stream(CollectiveStreamClient* client, absl::Time deadline)
      : client_(client), deadline_(deadline) {
    context_.set_deadline(absl::ToChronoTime(deadline));
  }

  // Starts the call, then writes what was queued meanwhile.
  void Begin(v1::Coordinator::Stub* stub) {
    stub->async()->CollectiveStream(&context_, this);
    AddHold();
    StartRead(&reply_);
    StartCall();
    StreamActions actions;
    {
      absl::MutexLock lock(&client_->mu_);
      started_ = true;
      actions = client_->NextActionsLocked(this);
    }
    client_->PerformExternal(this, actions);
  }

  absl::Time deadline() const { return deadline_; }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The coordinator finished the stream, or it broke: OnDone follows
      // once the hold is gone.
      bool release = false;
      {
        absl::MutexLock lock(&client_->mu_);
        BreakLocked();
        release = ReleaseHoldLocked();
      }
      if (release) RemoveHold();
      return;
    }
    v1::CollectiveStreamReply reply = std::move(reply_);
    reply_.Clear();
    Callback done;
    {
      absl::MutexLock lock(&client_->mu_);
      done = client_->TakeCallLocked(reply.call_id(), this);
    }
    StartRead(&reply_);
    // A reply to a call that already ended (its deadline passed) is dropped.
    if (!done) return;
    if (reply.code() == 0) {
      done(std::move(*reply.mutable_response()));
    } else {
      done(absl::Status(static_cast<absl::StatusCode>(reply.code()),
                        reply.message()));
    }
  }

  void OnWriteDone(bool ok) override {
    StreamActions actions;
    bool release = false;
    {
      absl::MutexLock lock(&client_->mu_);
      queue_.pop_front();
      writing_ = false;
      if (!ok) BreakLocked();
      actions = client_->NextActionsLocked(this, /*external=*/false);
      release = ReleaseHoldLocked();
    }
    Perform(actions);
    if (release) RemoveHold();
  }

  void OnWritesDoneDone(bool ok) override {
    bool release = false;
    {
      absl::MutexLock lock(&client_->mu_);
      writing_ = false;
      if (!ok) BreakLocked();
      release = ReleaseHoldLocked();
    }
    if (release) RemoveHold();
  }

  void OnDone(const grpc::Status& status) override {
    // A unary call that lost its connection fails with UNAVAILABLE; calls
    // on a stream that ended fail the same way.
    absl::Status verdict = FromGrpcStatus(status);
    if (!absl::IsUnavailable(verdict)) {
      verdict = absl::UnavailableError(absl::StrCat(
          "the collective stream to the coordinator ended",
          verdict.ok() ? "" : absl::StrCat(": ", verdict.ToString())));
    }
    std::vector<Callback> failed;
    bool destroy = false;
    {
      absl::MutexLock lock(&client_->mu_);
      BreakLocked();
      for (auto it = client_->calls_.begin(); it != client_->calls_.end();) {
        if (it->second.stream == this) {
          client_->deadlines_.erase({it->second.deadline, it->first});
          failed.push_back(std::move(it->second.done));
          client_->calls_.erase(it++);
        } else {
          ++it;
        }
      }
      client_->streams_.erase(this);
      done_ = true;
      destroy = pins_ == 0;
    }
    if (destroy) delete this;
    for (Callback& done : failed) done(verdict);
  }

  // For the client's methods, which hold their own mu_ (the same lock):
  // tells the thread-safety analysis, and checks, that it is held.
  void AssertClientLockHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK(client_->mu_) {
    client_->mu_.AssertHeld();
  }

  // Stops new calls from going on this stream.
  void CloseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(client_->mu_) {
    closing_ = true;
    if (client_->current_ == this) client_->current_ = nullptr;
  }
  void BreakLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(client_->mu_) {
    broken_ = true;
    CloseLocked();
  }

  // Whether the hold may go now; marks it gone.
  bool ReleaseHoldLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(client_->mu_) {
    if (hold_released_ || !started_ || external_ > 0) return false;
    if (!broken_ && !(closing_ && writes_done_ && !writing_)) return false;
    hold_released_ = true;
    return true;
  }

  void Perform(const StreamActions& actions) {
    if (actions.write != nullptr) StartWrite(actions.write);
    if (actions.writes_done) StartWritesDone();
  }

  CollectiveStreamClient* const client_;
  const absl::Time deadline_;
  grpc::ClientContext context_;
  v1::CollectiveStreamReply reply_;

  // Requests not yet written; the front one is being written while
  // `writing_` (which also covers the half-close).
  std::deque<v1::CollectiveStreamRequest> queue_ ABSL_GUARDED_BY(client_->mu_);
  bool started_ ABSL_GUARDED_BY(client_->mu_) = false;
  bool writing_ ABSL_GUARDED_BY(client_->mu_) = false;
  bool closing_ ABSL_GUARDED_BY(client_->mu_) = false;
  bool broken_ ABSL_GUARDED_BY(client_->mu_) = false;
  bool writes_done_ ABSL_GUARDED_BY(client_->mu_) = false;
  bool hold_released_ ABSL_GUARDED_BY(client_->mu_) = false;
  // Threads outside the reactions about to write or half-close.
  int external_ ABSL_GUARDED_BY(client_->mu_) = 0;
  // Shutdown() keeps the object alive while it cancels the stream.
  int pins_ ABSL_GUARDED_BY(client_->mu_) = 0;
  bool done_ ABSL_GUARDED_BY(client_->mu_) = false;
};

CollectiveStreamClient::CollectiveStreamClient(v1::Coordinator::Stub* stub,
                                               absl::Duration stream_lifetime)
    : stub_(stub),
      stream_lifetime_(stream_lifetime),
      expiry_loop_([this] { return ExpireCalls(); }) {
  expiry_loop_.Start();
}

CollectiveStreamClient::~CollectiveStreamClient() { Shutdown(); }

void CollectiveStreamClient::Start(v1::CollectiveRequest request,
                                   absl::Time deadline, Callback done) {
  const absl::Time now = absl::Now();
  if (deadline <= now) {
    done(absl::DeadlineExceededError(
        "the collective call's deadline passed before it was sent"));
    return;
  }
  v1::CollectiveStreamRequest message;
  message.mutable_call()->Swap(&request);
  message.set_timeout_us(
      std::max<int64_t>(1, absl::ToInt64Microseconds(deadline - now)));
  Stream* opened = nullptr;
  Stream* retired = nullptr;
  Stream* stream = nullptr;
  StreamActions retired_actions;
  StreamActions actions;
  bool poke = false;
  {
    absl::MutexLock lock(&mu_);
    if (!shut_down_) {
      if (current_ != nullptr &&
          deadline > current_->deadline() - kStreamMargin) {
        retired = current_;
        retired->AssertClientLockHeld();
        retired->CloseLocked();
        retired_actions = NextActionsLocked(retired);
      }
      if (current_ == nullptr) {
        opened = new Stream(
            this, std::max(now + stream_lifetime_, deadline + kStreamMargin));
        streams_.insert(opened);
        current_ = opened;
      }
      stream = current_;
      stream->AssertClientLockHeld();
      const uint64_t call_id = ++next_call_id_;
      message.set_call_id(call_id);
      calls_.emplace(call_id, PendingCall{std::move(done), deadline, stream});
      deadlines_.emplace(deadline, call_id);
      stream->queue_.push_back(std::move(message));
      actions = NextActionsLocked(stream);
      if (deadline < next_expiry_) {
        next_expiry_ = deadline;
        poke = true;
      }
    }
  }
  if (stream == nullptr) {
    done(absl::UnavailableError("this worker is shutting down"));
    return;
  }
  if (retired != nullptr) PerformExternal(retired, retired_actions);
  if (opened != nullptr) {
    opened->Begin(stub_);
  } else {
    PerformExternal(stream, actions);
  }
  if (poke) expiry_loop_.Poke();
}

absl::StatusOr<v1::CollectiveResponse> CollectiveStreamClient::Call(
    v1::CollectiveRequest request, absl::Time deadline) {
  struct Result {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::StatusOr<v1::CollectiveResponse> value ABSL_GUARDED_BY(mu);
  };
  auto result = std::make_shared<Result>();
  Start(std::move(request), deadline,
        [result](absl::StatusOr<v1::CollectiveResponse> value) {
          absl::MutexLock lock(&result->mu);
          result->value = std::move(value);
          result->done = true;
        });
  absl::MutexLock lock(&result->mu);
  // The deadline thread ends the call by its deadline.
  result->mu.Await(absl::Condition(&result->done));
  return std::move(result->value);
}

void CollectiveStreamClient::Shutdown() {
  std::vector<Callback> failed;
  std::vector<Stream*> streams;
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
    for (auto& [id, call] : calls_) failed.push_back(std::move(call.done));
    calls_.clear();
    deadlines_.clear();
    for (Stream* stream : streams_) {
      stream->AssertClientLockHeld();
      stream->CloseLocked();
      ++stream->pins_;
      streams.push_back(stream);
    }
  }
  for (Callback& done : failed) {
    done(absl::UnavailableError("this worker is shutting down"));
  }
  for (Stream* stream : streams) stream->context_.TryCancel();
  for (Stream* stream : streams) {
    bool destroy = false;
    {
      absl::MutexLock lock(&mu_);
      stream->AssertClientLockHeld();
      destroy = --stream->pins_ == 0 && stream->done_;
    }
    if (destroy) delete stream;
  }
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](absl::flat_hash_set<Stream*>* streams) { return streams->empty(); },
        &streams_));
  }
  expiry_loop_.Stop();
}

absl::Time CollectiveStreamClient::ExpireCalls() {
  const absl::Time now = absl::Now();
  std::vector<Callback> expired;
  {
    absl::MutexLock lock(&mu_);
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      auto call = calls_.find(deadlines_.begin()->second);
      expired.push_back(std::move(call->second.done));
      calls_.erase(call);
      deadlines_.erase(deadlines_.begin());
    }
    next_expiry_ =
        deadlines_.empty() ? absl::InfiniteFuture() : deadlines_.begin()->first;
  }
  for (Callback& done : expired) {
    done(absl::DeadlineExceededError(
        "the coordinator did not answer the collective call before its "
        "deadline"));
  }
  absl::MutexLock lock(&mu_);
  return next_expiry_;
}

CollectiveStreamClient::Callback CollectiveStreamClient::TakeCallLocked(
    uint64_t call_id, const Stream* stream) {
  auto call = calls_.find(call_id);
  if (call == calls_.end() || call->second.stream != stream) return nullptr;
  Callback done = std::move(call->second.done);
  deadlines_.erase({call->second.deadline, call_id});
  calls_.erase(call);
  return done;
}

CollectiveStreamClient::StreamActions CollectiveStreamClient::NextActionsLocked(
    Stream* stream, bool external) {
  StreamActions actions;
  stream->AssertClientLockHeld();
  if (!stream->started_ || stream->writing_ || stream->broken_) return actions;
  if (!stream->queue_.empty()) {
    stream->writing_ = true;
    actions.write = &stream->queue_.front();
  } else if (stream->closing_ && !stream->writes_done_) {
    stream->writing_ = true;
    stream->writes_done_ = true;
    actions.writes_done = true;
  }
  if (external && actions.any()) ++stream->external_;
  return actions;
}

void CollectiveStreamClient::PerformExternal(Stream* stream,
                                             StreamActions actions) {
  if (!actions.any()) return;
  stream->Perform(actions);
  bool release = false;
  {
    absl::MutexLock lock(&mu_);
    stream->AssertClientLockHeld();
    --stream->external_;
    release = stream->ReleaseHoldLocked();
  }
  if (release) stream->RemoveHold();
}

}  // namespace chorus
