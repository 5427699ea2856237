// TcpListener: the receiving end of the TCP data plane. Peers connect, send
// kWireHello, then wire frames (wire_frame.h); each frame is handed to the
// Inbox under its key. One thread accepts and one thread per connection
// reads (blocked in the kernel, not polling). Without TLS, a rank's thread
// polling the inbox for a frame of at most 64 KiB from a connection may read
// that frame itself (Inbox::SetStreamPoll), so the message does not wait for
// the connection's thread to wake; both take the connection's read lock, so
// frames still reach the inbox whole and in order.
// Exists because: 8-byte all_reduce under the leader plan, 2 ranks on one
// 2-core host, whole runs of 30,000 calls took 0.61-0.66x the time (medians
// of three sets of ten alternated pairs; bench/README.md, "A waiting rank
// reads its own frames"). While the inbox holds too much
// of a connection's data the thread stops reading, so TCP flow control holds
// the sender back. A connection that ends without a goodbye frame, or sends
// a malformed frame, marks the group epochs it carried lost (RecentGroups).
//
// Lifecycle: Start() binds and starts accepting; Shutdown() (or the
// destructor) closes the listener and every connection and joins the
// threads. The inbox must outlive it.
//
// With TLS on (transport_security.h), each connection first runs the
// server side of a TlsStream handshake, closed if the whole of it takes
// over 5 s; at most 64 connections are in their handshake at once, and one
// more drops the oldest of them (so unauthenticated clients hold at most 64
// threads, each for at most 5 s). Only
// worker certificates are accepted, and a frame is delivered only when its
// sending rank is held by that worker (PeerDirectory; a frame for an epoch
// not learned yet waits for it, up to 30 s). Anything else closes the
// connection.
//
// Thread safety: thread-safe.
#ifndef CHORUS_SERVER_WORKER_DATAPLANE_TCP_LISTENER_H_
#define CHORUS_SERVER_WORKER_DATAPLANE_TCP_LISTENER_H_

#include <deque>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/worker/dataplane/frame_reader.h"
#include "server/worker/dataplane/inbox.h"
#include "server/worker/dataplane/peer_directory.h"

namespace chorus {

class TlsStream;

class TcpListener {
 public:
  // Listens on `host` at `port` (0: any free port). `directory` (not
  // owned; needed with TLS on) says who holds each rank. Returns
  // UNAVAILABLE when the address cannot be bound, INVALID_ARGUMENT for TLS
  // without a directory.
  static absl::StatusOr<std::unique_ptr<TcpListener>> Start(
      const std::string& host, int port, Inbox* inbox,
      PeerDirectory* directory = nullptr);

  ~TcpListener();
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;

  // The bound port.
  int port() const { return port_; }

  // Stops accepting, ends every connection and waits for their threads;
  // idempotent.
  void Shutdown();

 private:
  struct Connection;

  TcpListener(int fd, int port, Inbox* inbox, PeerDirectory* directory);
  void AcceptLoop();
  void Serve(const std::shared_ptr<Connection>& connection);
  // Reads the hello and then frames of `connection` (through `tls` when not
  // null), calling `on_message` for each, until the stream ends or
  // `on_message` returns false. Returns how it ended.
  StreamEnd ReadFrames(const std::shared_ptr<Connection>& connection,
                       TlsStream* tls, const FrameCallback& on_message,
                       std::string* why);
  // Hands a message read from `connection` to `inbox`. Returns false when
  // the connection is over its share of the inbox: it stays paused until
  // the inbox resumes it.
  static bool Deliver(const std::shared_ptr<Connection>& connection,
                      Inbox& inbox, const MessageKey& key, std::string data);
  // The inbox's poll of `connection` (Inbox::SetStreamPoll): when nobody
  // else reads it and it holds a whole small frame, reads and delivers that
  // frame without blocking. Returns what it did.
  static Inbox::PollResult ReadForWaiter(
      const std::shared_ptr<Connection>& connection, Inbox& inbox);
  // Returns whether worker `caller` holds the sending rank of `key`, waiting
  // up to 30 s for an epoch not learned yet (false when it is not learned
  // by then, or the listener stops first).
  bool Admit(const std::shared_ptr<Connection>& connection,
             const std::string& caller, const MessageKey& key);
  // Returns false (logging why) when the certificate of the peer of `tls`
  // was revoked since the list `*checked` counts (then updated).
  static bool StillTrusted(const Connection& connection, const TlsStream& tls,
                           uint64_t* checked);
  // Marks `connection` ended and ends its socket for the peer.
  static void EndConnection(Connection& connection);
  // Keeps at most kMaxHandshakes connections in their handshake, counting
  // `connection` (about to start): ends the oldest one when over.
  void MakeRoomForHandshakeLocked(const std::shared_ptr<Connection>& connection)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Joins the threads of connections that ended.
  void ReapLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int fd_;
  const int port_;
  Inbox* const inbox_;              // not owned
  PeerDirectory* const directory_;  // not owned; null without TLS
  std::thread accept_thread_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::list<std::shared_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
  // Connections in their TLS handshake, oldest first (some may be over).
  std::deque<std::weak_ptr<Connection>> handshaking_ ABSL_GUARDED_BY(mu_);
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_DATAPLANE_TCP_LISTENER_H_
