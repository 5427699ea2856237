// The replies of one Calls channel of chorus._embedded (embedded_calls.h),
// kept until a Python thread takes them: the worker's threads push the
// replies of the channel's calls, and wait()/drain() take them. An eventfd
// is readable while replies wait (or once the queue closed), so that a
// Python caller can select() on it as on a call socket.
//
// Lifecycle: made with its channel; shared by the channel and the calls it
// has in flight (shared_ptr), so a call that ends after its channel went
// pushes into a closed queue. Close() ends it for good.
// Thread safety: all methods are thread-safe; none needs the GIL.
#ifndef CHORUS_CLIENT_PYTHON_EMBEDDED_REPLY_QUEUE_H_
#define CHORUS_CLIENT_PYTHON_EMBEDDED_REPLY_QUEUE_H_

#include <cstdint>
#include <deque>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/v1/worker.pb.h"

namespace chorus {

// A reply as the Python side reads it (chorus._frames' tuple).
struct QueuedReply {
  uint64_t call_id = 0;
  int code = 0;
  std::string message;
  std::string details;
  std::string data;
  int64_t algorithm = 0;
  uint64_t chunk_bytes = 0;
};

// `answer` as the Python side reads it, less its data (which the caller
// copies, or not); its message and details are moved out.
QueuedReply QueueableReply(v1::LocalCallReply& answer);

class ReplyQueue {
 public:
  ReplyQueue();
  ~ReplyQueue();
  ReplyQueue(const ReplyQueue&) = delete;
  ReplyQueue& operator=(const ReplyQueue&) = delete;

  // The eventfd readable while replies wait or once closed; -1 when the
  // system would not make one (errno says why).
  int event_fd() const { return event_fd_; }

  // Queues a reply (dropped once closed).
  void Push(QueuedReply reply);

  // Moves every queued reply to `out`, waiting until there is one, the
  // queue closed or `deadline` passed. Returns false when it closed and
  // nothing was left.
  bool Take(absl::Time deadline, std::deque<QueuedReply>* out);

  // Wakes every waiter for good; later replies are dropped. Idempotent.
  void Close();

  bool closed() const;

 private:
  bool Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || !replies_.empty();
  }
  // Makes the eventfd readable / not readable.
  void Signal() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Clear() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int event_fd_;
  mutable absl::Mutex mu_;
  std::deque<QueuedReply> replies_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace chorus

#endif  // CHORUS_CLIENT_PYTHON_EMBEDDED_REPLY_QUEUE_H_
