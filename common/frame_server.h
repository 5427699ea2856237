// FrameServer: serves connections that carry frames (call_frame.h) on a
// listening socket, TCP or Unix, with one thread and epoll: the coordinator's
// call port and a worker's local call socket; and, with
// Framing::kHttpRequests, a daemon's metrics port (one HTTP request per
// connection, so no client holds a thread at any stage). A connection starts
// with the client's hello; then it sends frames, each handed whole to the
// handler on the serving thread in the order the connection sent them. Replies
// are sent by whichever thread has them (a Replier), straight to the socket
// when it has room, else queued for the serving thread: no thread waits on
// a slow reader. Of the replies the handler sends to one connection on the
// serving thread while it takes one read's frames, the first is written at
// once and the others together once those frames are taken: two writes per
// connection however many of its calls a frame completed (the last rank's
// call to a barrier answers every rank; a worker's ranks share its
// connection). A connection that does not start with the hello is closed
// without a reply, and so is one that has not sent it within the options'
// greeting_timeout, and the oldest of those still silent when more than
// max_ungreeted are; a frame over the limit gets one error frame (the
// options' error_payload) and the connection is closed once that is
// written (or after greeting_timeout, if its client does not read); a
// connection that closes drops the replies still due to it. Each wake-up reads
// at most 1 MiB of one connection, so none starves the others; out of file
// descriptors, it stops accepting until one closes.
//
// With TLS (Options::tls) every connection is mutual TLS 1.3 from its first
// byte (tls_session.h): the hello and the frames travel inside it, and the
// handler learns the identity the client's certificate names. A connection
// whose handshake fails (no certificate, another CA's, plaintext) is closed
// with no frame, and the reason is logged.
//
// Lifecycle: Start() serves until Shutdown() (or destruction), which closes
// every connection and the listener. Thread safety: Shutdown() and
// connections() may be called from any thread; Replier::Send() too.
#ifndef CHORUS_COMMON_FRAME_SERVER_H_
#define CHORUS_COMMON_FRAME_SERVER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/transport_security.h"

namespace chorus {

class FrameServer {
 public:
  struct Connection;

  // Sends frames to one connection. Copyable; does nothing once the
  // connection closed.
  class Replier {
   public:
    explicit Replier(std::weak_ptr<Connection> to) : to_(std::move(to)) {}
    // Sends a frame holding `payload`.
    void Send(absl::string_view payload) const;

   private:
    std::weak_ptr<Connection> to_;
  };

  // Handles one whole frame's payload from the client `peer` names (null
  // without TLS). Returns false to close the connection once the replies it
  // sent first are written (within greeting_timeout). With
  // Framing::kHttpRequests the payload is the request head, and what the
  // handler returns is not asked: the connection closes after its reply.
  using Handler = std::function<bool(std::string payload, Replier reply,
                                     const Identity* peer)>;

  // What the connections carry.
  enum class Framing {
    // The options' hello, then call frames (call_frame.h) both ways.
    kCallFrames,
    // One HTTP/1.1 request head (http_message.h) per connection, handed to
    // the handler whole; the handler sends the whole response (as it is,
    // not in a frame) and the connection closes once it is written.
    kHttpRequests,
  };

  struct Options {
    // For log lines ("call port").
    std::string name;
    Framing framing = Framing::kCallFrames;
    // What every connection must start with (call frames only).
    std::string hello;
    // Frames over this many bytes are refused.
    uint64_t max_frame_bytes = 0;
    // The payload of the one frame sent before closing a connection whose
    // frame was over the limit (`why` says so).
    std::function<std::string(const absl::Status& why)> error_payload;
    // Mutual TLS on every connection, with the process's certificates.
    bool tls = false;
    // A connection that has not sent its whole hello (after its TLS
    // handshake) this long after it was accepted is closed, so clients that
    // never greet cannot hold descriptors for good.
    absl::Duration greeting_timeout = absl::Seconds(5);
    // At most this many connections may be waiting for their greeting
    // (TLS handshake and hello) at once; one more closes the oldest.
    size_t max_ungreeted = 256;
    // How long the serving thread polls for the next frame before it
    // blocks (AdaptiveSpin); zero: it blocks at once.
    absl::Duration spin = absl::ZeroDuration();
  };

  // Serves the connections of `listen_fd` (listening; the server owns it
  // from now on) with `handler`. Returns INTERNAL when the serving thread's
  // epoll or eventfd cannot be made, FAILED_PRECONDITION for TLS in a
  // process without it.
  static absl::StatusOr<std::unique_ptr<FrameServer>> Start(int listen_fd,
                                                            Options options,
                                                            Handler handler);

  ~FrameServer();
  FrameServer(const FrameServer&) = delete;
  FrameServer& operator=(const FrameServer&) = delete;

  // Connections open now.
  size_t connections() const {
    return open_connections_.load(std::memory_order_relaxed);
  }

  // Stops serving, closes every connection (replies still due are dropped)
  // and the listener. Idempotent.
  void Shutdown();

 private:
  FrameServer(Options options, Handler handler)
      : options_(std::move(options)), handler_(std::move(handler)) {}

  void Serve();
  void Accept();
  // What becomes of a connection after a read.
  enum class Next { kKeep, kClose, kFinish };
  // Reads what `connection` has and handles its whole frames. Returns
  // kClose when it must be closed now, kFinish when once its replies are
  // written.
  Next ReadFrom(const std::shared_ptr<Connection>& connection);
  // Takes `bytes` the client sent (after TLS): the hello, then frames.
  // Returns false when the connection must close (after its replies when
  // it is marked finishing).
  bool Take(const std::shared_ptr<Connection>& connection,
            absl::string_view bytes);
  // Take() for Framing::kHttpRequests: the request head. Returns false once
  // it was handled (the connection is finishing), or when it is too long.
  bool TakeHttpHead(const std::shared_ptr<Connection>& connection,
                    absl::string_view bytes);
  // Hands the whole frames buffered for `connection` to the handler, and
  // then writes the replies the handler sent meanwhile on this thread.
  // Returns false when the connection must be closed.
  bool TakeFrames(const std::shared_ptr<Connection>& connection);
  // Hands the frames to the handler (TakeFrames' loop).
  bool HandleFrames(const std::shared_ptr<Connection>& connection);
  // Writes what the socket takes of the connection's replies; returns
  // whether none are left (false when it is closed).
  static bool Flush(Connection& connection);
  // Closes `connection` now when its replies are written, else when they
  // are or after greeting_timeout, whichever comes first.
  void Finish(const std::shared_ptr<Connection>& connection);
  void Close(int fd);
  // Whether `connection` is still open (its descriptor not another's).
  bool IsOpen(const std::shared_ptr<Connection>& connection);
  // Closes the connection accepted first of those still ungreeted.
  void CloseOldestUngreeted();
  // Closes the connections whose greeting or lingering time ran out;
  // returns how long until the next one does (-1 ms: none waits).
  int CloseOverdue();

  const Options options_;
  const Handler handler_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: Shutdown() wakes the serving thread
  std::thread thread_;
  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  // Owned by the serving thread.
  absl::flat_hash_map<int, std::shared_ptr<Connection>> connections_;
  // Connections in the order accepted (so by greeting deadline), until
  // their deadline; those greeted by then are skipped.
  std::deque<std::pair<absl::Time, std::weak_ptr<Connection>>> greeting_;
  // Finishing connections by deadline, until it comes or they close.
  std::deque<std::pair<absl::Time, std::weak_ptr<Connection>>> lingering_;
  bool accept_paused_ = false;
  // Open connections that have not sent their whole hello.
  size_t ungreeted_ = 0;
  std::atomic<size_t> open_connections_{0};
};

}  // namespace chorus

#endif  // CHORUS_COMMON_FRAME_SERVER_H_
