// CallPortClient: a worker's collective calls on the coordinator's call port
// (server/coordinator/call_port.h) — collective calls, commits and failure
// reports — on one TCP connection shared by every call of the worker and
// told apart by call id: a call is one frame written by the calling thread
// and one frame read back.
// Exists because: as call_port.h says (8 B all_reduce about 3-5x faster than
// as gRPC calls); the worker's gRPC calls stay for a port it cannot reach.
//
// No thread of its own: a waiting caller reads the connection itself and
// hands other callers' replies to them, so a lone call (the common case)
// has no thread hand-off. Every call ends by its own deadline: the
// coordinator learns the time left and answers DEADLINE_EXCEEDED naming the
// missing ranks a little before it; a caller whose deadline passes without
// an answer gets DEADLINE_EXCEEDED saying that the coordinator did not
// answer (its late reply is dropped). When the
// connection breaks (the coordinator died or restarted, the network failed)
// its calls in flight end with UNAVAILABLE; the next call connects again, to
// the port the address function then gives.
//
// With TLS on in the process (transport_security.h) the connection is
// mutual TLS with the process's certificates, and the call port must
// present the coordinator's (call_port_dial.h); a handshake that fails
// counts as a port that cannot be reached (Ready() says so, and the worker
// calls over gRPC).
//
// CallAsync() and CommitAsync() send a call without waiting for it: the
// client's one completion thread ("chorus-callport", started with the first
// such call) reads the connection, ends the calls whose deadline passes, and
// runs their callbacks, so any number of calls may wait for other ranks
// without a thread each. While the last call sent was asynchronous it reads
// with no call pending too (up to 10 s ahead), so that the next reply costs
// it one wake-up. A blocking call stops that read-ahead and, unless
// asynchronous calls are pending (then it takes its reply from the
// completion thread), reads its own reply: a caller that blocks call after
// call is woken once per call, by its reply, as with no completion thread.
//
// Lifecycle: Shutdown() (or the destructor) ends every call in flight with
// UNAVAILABLE and waits until each has returned (and each asynchronous
// call's callback has run).
// Thread safety: Call() and CallAsync() may run concurrently from any
// threads.
#ifndef CHORUS_SERVER_WORKER_CALL_PORT_CLIENT_H_
#define CHORUS_SERVER_WORKER_CALL_PORT_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"
#include "common/adaptive_spin.h"
#include "common/call_frame.h"
#include "common/tls_session.h"
#include "server/worker/call_port_dial.h"

namespace chorus {

class CallPortClient {
 public:
  // `address` returns the call port's current "host:port", or "" when the
  // coordinator has none; it is asked before each new connection.
  // `coordinator` (the coordinator's gRPC address, may be empty) names the
  // coordinator in statuses.
  // `spin`: how long a reader polls for a reply before it blocks
  // (AdaptiveSpin; zero: never).
  explicit CallPortClient(std::function<std::string()> address,
                          std::string coordinator = "",
                          absl::Duration spin = kDefaultSpin);
  ~CallPortClient();
  CallPortClient(const CallPortClient&) = delete;
  CallPortClient& operator=(const CallPortClient&) = delete;

  // Sends `request` and waits for its reply until `deadline`. Returns the
  // response, or the coordinator's verdict (any code, as Coordinator.
  // Collective),
  // DEADLINE_EXCEEDED, or UNAVAILABLE when the connection broke or could
  // not be made or the client is shutting down.
  absl::StatusOr<v1::CollectiveResponse> Call(v1::CollectiveRequest request,
                                              absl::Time deadline);

  // How an asynchronous call ended: Call()'s result.
  using CallDone =
      std::function<void(absl::StatusOr<v1::CollectiveResponse> result)>;

  // Call() without waiting: sends `request` and returns; `done` runs once
  // with Call()'s result (same codes) on the completion thread, or on the
  // caller's thread when the call ends before it was sent (UNAVAILABLE:
  // no connection, shutting down). `done` must not block.
  void CallAsync(v1::CollectiveRequest request, absl::Time deadline,
                 CallDone done);

  // Connects unless connected (without checking an open connection, which
  // Call() does). Returns OK when calls can be sent now;
  // FAILED_PRECONDITION when the coordinator has no call port or it cannot
  // be reached (then for 10 s without trying again), UNAVAILABLE when
  // shutting down. Nothing is sent to the core.
  absl::Status Ready(absl::Time deadline);

  // Whether a connection is open now (it may still turn out broken).
  bool Connected();

  // Sends the commit of a data-plane collective and waits for the verdict
  // until `deadline`. Returns the coordinator's verdict (as Coordinator.
  // Commit) or the codes of Call().
  absl::Status Commit(const v1::CommitRequest& request, absl::Time deadline);

  // How an asynchronous commit ended: Commit()'s result.
  using CommitDone = std::function<void(absl::Status verdict)>;

  // Commit() without waiting: sends the commit and returns; `done` runs
  // once with Commit()'s result (same codes) as CallAsync()'s does, so the
  // verdict reaches the rank without a hand-off to the committing thread.
  // `done` must not block.
  void CommitAsync(const v1::CommitRequest& request, absl::Time deadline,
                   CommitDone done);

  // Reports a data-plane failure and waits for the verdict until
  // `deadline`. Returns the group's abort (as Coordinator.ReportFailure),
  // the coordinator's NOT_FOUND / FAILED_PRECONDITION, or the codes of
  // Call().
  absl::StatusOr<v1::ReportFailureResponse> ReportFailure(
      const v1::ReportFailureRequest& request, absl::Time deadline);

  // Ends the calls in flight with UNAVAILABLE and waits for them to return;
  // later calls fail at once. Idempotent.
  void Shutdown();

 private:
  struct Waiter {
    bool done = false;
    absl::StatusOr<v1::CallPortReply> result;
    // Set for an asynchronous call (owned by waiters_ until it is done,
    // then by async_done_): what its callback needs.
    std::function<void(absl::StatusOr<v1::CallPortReply>)> on_done;
    uint64_t call_id = 0;
    absl::Time start;
    absl::Time deadline;
    std::string what;
  };

  // Frames `framed` and registers `waiter` for its reply on the open
  // connection (connecting first), then writes it. Returns the connection's
  // generation; an error when nothing was registered.
  absl::StatusOr<uint64_t> Send(v1::CallPortRequest framed, absl::Time deadline,
                                Waiter* waiter)
      ABSL_LOCKS_EXCLUDED(mu_, write_mu_);
  // Sends `framed` without waiting; `on_done` runs once with its reply or
  // why it has none (on the completion thread, or on this one when nothing
  // was sent). `what` names the call in statuses.
  void SendAsync(v1::CallPortRequest framed, absl::Time deadline,
                 std::string what,
                 std::function<void(absl::StatusOr<v1::CallPortReply>)> on_done)
      ABSL_LOCKS_EXCLUDED(mu_, write_mu_);
  // Marks `waiter` done with `result`; an asynchronous one moves to
  // async_done_ for the completion thread.
  void FinishLocked(Waiter* waiter, absl::StatusOr<v1::CallPortReply> result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The DEADLINE_EXCEEDED of a call the coordinator did not answer.
  absl::Status SilentLocked(const Waiter& waiter)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The completion thread: reads whenever no other thread does, ends
  // asynchronous calls at their deadlines and runs their callbacks, until
  // Shutdown().
  void ServeAsync();

  // Sends `framed` (its call id and timeout are set here) and waits for its
  // reply; `what` names it in a DEADLINE_EXCEEDED message.
  absl::StatusOr<v1::CallPortReply> RoundTrip(v1::CallPortRequest framed,
                                              absl::Time deadline,
                                              const std::string& what);
  // Returns the open connection's socket and generation, connecting first
  // when there is none.
  absl::Status Connect(absl::Time deadline, int* fd, uint64_t* generation)
      ABSL_LOCKS_EXCLUDED(mu_, write_mu_);
  // Makes `connection`, just dialed to `address`, the open one and returns
  // its socket and generation; UNAVAILABLE (closing it) when shutting down.
  absl::Status UseConnection(const std::string& address,
                             CallPortConnection connection, int* fd,
                             uint64_t* generation)
      ABSL_LOCKS_EXCLUDED(mu_, write_mu_);
  // Marks `address` unreachable for a while and returns FAILED_PRECONDITION
  // saying `why`.
  absl::Status Unreachable(const std::string& address, std::string why)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Reads once from `fd` and hands out the replies it completes. Called
  // with reader_ set; returns with it cleared.
  // `wake_fd`, when readable, ends the read early (without breaking the
  // connection); the cancel eventfd when -1.
  void ReadAsReader(int fd, uint64_t generation, absl::Time deadline,
                    int wake_fd = -1) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends bytes read from connection `generation` and hands out the
  // replies they complete.
  void HandleBytesLocked(uint64_t generation, absl::string_view bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads what the open connection has without waiting (late replies) and
  // returns false when the peer closed it or it failed.
  bool DrainLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends connection `generation` (if still current): its calls get
  // `status`, its socket is shut down and closed once unused.
  void BreakLocked(uint64_t generation, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::function<std::string()> address_;
  const std::string coordinator_;
  AdaptiveSpin spin_;
  // An eventfd that Shutdown() makes readable to end waits in poll().
  int cancel_fd_ = -1;

  // Serialises connecting.
  absl::Mutex connect_mu_ ABSL_ACQUIRED_BEFORE(write_mu_);
  // Serialises writes of whole frames. Taken before mu_, never while
  // holding it.
  absl::Mutex write_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex mu_;
  absl::CondVar changed_;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
  // fd_'s TLS session; null without TLS.
  std::shared_ptr<TlsSession> tls_ ABSL_GUARDED_BY(mu_);
  // The address fd_ was connected to.
  std::string connected_address_ ABSL_GUARDED_BY(mu_);
  // A call port that could not be reached, and until when it is not tried.
  std::string unreachable_address_ ABSL_GUARDED_BY(mu_);
  absl::Time unreachable_until_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  CallFrameParser frames_ ABSL_GUARDED_BY(mu_);
  // A caller is reading the connection.
  bool reader_ ABSL_GUARDED_BY(mu_) = false;
  // Sockets of broken connections, closed once no reader or writer can be
  // using them.
  std::vector<int> retired_ ABSL_GUARDED_BY(mu_);
  uint64_t next_call_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Waiter*> waiters_ ABSL_GUARDED_BY(mu_);
  int active_calls_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;

  // Asynchronous calls waiting for their replies, by deadline.
  std::set<std::pair<absl::Time, uint64_t>> async_deadlines_
      ABSL_GUARDED_BY(mu_);
  // Asynchronous calls that ended, whose callbacks are still to run.
  std::vector<Waiter*> async_done_ ABSL_GUARDED_BY(mu_);
  // The deadline the completion thread's read waits until (InfiniteFuture
  // when it is not reading); a call due earlier, or a blocking call while
  // no asynchronous one is pending, wakes it through async_wake_fd_.
  absl::Time async_read_until_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // The last call sent was asynchronous: the completion thread reads ahead
  // for the next reply. A blocking call clears it.
  bool read_ahead_ ABSL_GUARDED_BY(mu_) = false;
  // Wakes the completion thread: an asynchronous call registered or ended,
  // the reader role is free while asynchronous calls wait, or Shutdown().
  // Separate from changed_, which blocking callers wait on, so that their
  // reads do not wake the completion thread.
  absl::CondVar async_changed_;
  int async_wake_fd_ = -1;
  std::thread async_thread_ ABSL_GUARDED_BY(mu_);
  bool async_stop_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_CALL_PORT_CLIENT_H_
