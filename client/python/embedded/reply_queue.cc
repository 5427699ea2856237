#include "client/python/embedded/reply_queue.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <utility>

namespace chorus {

QueuedReply QueueableReply(v1::LocalCallReply& answer) {
  QueuedReply reply;
  reply.call_id = answer.call_id();
  reply.code = answer.code();
  reply.message = std::move(*answer.mutable_message());
  reply.details = std::move(*answer.mutable_status_details());
  reply.algorithm = answer.response().plan().algorithm();
  reply.chunk_bytes = answer.response().plan().chunk_bytes();
  return reply;
}

ReplyQueue::ReplyQueue() : event_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

ReplyQueue::~ReplyQueue() {
  if (event_fd_ >= 0) close(event_fd_);
}

void ReplyQueue::Push(QueuedReply reply) {
  absl::MutexLock lock(&mu_);
  if (closed_) return;
  if (replies_.empty()) Signal();
  replies_.push_back(std::move(reply));
}

bool ReplyQueue::Take(absl::Time deadline, std::deque<QueuedReply>* out) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithDeadline(absl::Condition(this, &ReplyQueue::Ready), deadline);
  if (replies_.empty()) return !closed_;
  out->swap(replies_);
  replies_.clear();
  Clear();
  return true;
}

void ReplyQueue::Close() {
  absl::MutexLock lock(&mu_);
  if (closed_) return;
  closed_ = true;
  Signal();
}

bool ReplyQueue::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

void ReplyQueue::Signal() {
  const uint64_t one = 1;
  (void)!write(event_fd_, &one, sizeof(one));
}

void ReplyQueue::Clear() {
  if (closed_) return;  // stays readable: select() sees the end
  uint64_t value;
  (void)!read(event_fd_, &value, sizeof(value));
}

}  // namespace chorus
