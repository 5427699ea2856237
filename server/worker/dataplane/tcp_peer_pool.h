// TcpPeerPool: the data plane's default PeerSender. Keeps one persistent TCP
// connection per peer address, reused by every collective. It connects to
// the data port the peer registered with (learned from group joins,
// LearnPeer), or asks the peer (Peer.DataPlane) where a peer registered none,
// and writes wire frames (wire_frame.h) straight from the caller's buffer with
// one sendmsg per frame: no copy of the data. A broken connection is
// reopened once on the next send, except after the dead-peer timeout (the
// peer acknowledged nothing for a lease) or for a group already aborted.
//
// A connection belongs to the peer identity (worker id and incarnation) it
// was opened for: once a join says the address is another identity, the
// old connection is closed, not reused.
//
// A connection is checked before it carries the first frame of each
// collective (a collective the connection has not carried yet): if the peer
// closed it (the peer's process restarted and the old connection sits in
// CLOSE-WAIT here) it is reopened silently, rather than the frame vanishing
// into a dead connection and the collective waiting out its deadline. Every
// connection also gets a dead-peer timeout (TCP_USER_TIMEOUT and keepalives,
// SetDeadPeerTimeout) of the lease the coordinator gave this worker, so a
// connection across a partition fails within the lease instead of sitting
// in retransmission backoff after the network heals.
//
// With TLS on (transport_security.h), each connection runs a TlsStream
// handshake after the hello's TCP connect and the frames travel encrypted;
// the listener must present the certificate of the worker a join named at
// that address (any worker certificate where no join named one), so a
// listener that took over the address cannot receive the group's data.
//
// Lifecycle: one per worker runtime. Shutdown() (or the destructor) says
// goodbye on and closes every connection.
// Thread safety: Send() may be called concurrently; writes to one peer are
// serialised.
#ifndef CHORUS_SERVER_WORKER_DATAPLANE_TCP_PEER_POOL_H_
#define CHORUS_SERVER_WORKER_DATAPLANE_TCP_PEER_POOL_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/v1/worker.grpc.pb.h"
#include "common/tls_stream.h"
#include "server/worker/dataplane/inbox.h"
#include "server/worker/dataplane/peer_sender.h"

namespace chorus {

class TcpPeerPool final : public PeerSender {
 public:
  // `dead_peer_timeout` returns the timeout for each new connection (the
  // current lease; called once per connection); empty or returning zero
  // leaves the kernel's defaults.
  explicit TcpPeerPool(
      std::function<absl::Duration()> dead_peer_timeout = nullptr);
  ~TcpPeerPool() override;

  TcpPeerPool(const TcpPeerPool&) = delete;
  TcpPeerPool& operator=(const TcpPeerPool&) = delete;

  // As PeerSender::Send; UNAVAILABLE also when the peer has no TCP data
  // plane.
  absl::Status Send(const std::string& address, const MessageKey& key,
                    absl::string_view data, absl::Time deadline) override;

  // As PeerSender::AbortGroup: a send of that group epoch blocked on its
  // connection is cut (the connection is shut down and closed; the next
  // send opens a new one), and later sends of it return ABORTED at once
  // (for the last 256 group epochs aborted).
  void AbortGroup(const std::string& group, uint64_t epoch) override;

  // As PeerSender::LearnPeer. Closes a connection of another identity now
  // when no send holds it, else at that address's next send.
  void LearnPeer(const std::string& address,
                 const PeerRegistration& identity) override;

  // Ends sends in progress (they return UNAVAILABLE, as every later send
  // does), then says goodbye on and closes every connection.
  void Shutdown() override;

 private:
  struct Peer {
    absl::Mutex mu;
    std::string address;
    std::unique_ptr<v1::Peer::Stub> stub;
    // The connected socket, or -1.
    int fd ABSL_GUARDED_BY(mu) = -1;
    // Over `fd` with TLS on.
    std::unique_ptr<TlsStream> tls ABSL_GUARDED_BY(mu);
    // The identity `fd` was opened for.
    PeerRegistration connected_as ABSL_GUARDED_BY(mu);
    // The identity a join reported last; LearnPeer() sets it without
    // waiting for `mu`, which a send may hold until its deadline.
    absl::Mutex learned_mu ABSL_ACQUIRED_AFTER(mu);
    PeerRegistration learned ABSL_GUARDED_BY(learned_mu);
    // The last AbortedLocked() answer: for this group epoch, with this many
    // AbortGroup() calls made so far.
    std::string checked_group ABSL_GUARDED_BY(mu);
    uint64_t checked_epoch ABSL_GUARDED_BY(mu) = 0;
    uint64_t checked_aborts ABSL_GUARDED_BY(mu) = 0;
    bool checked_aborted ABSL_GUARDED_BY(mu) = false;
    // The collective (group, epoch, sequence) `fd` last carried a frame of;
    // a frame of another one checks the connection first.
    std::string last_group ABSL_GUARDED_BY(mu);
    uint64_t last_epoch ABSL_GUARDED_BY(mu) = 0;
    uint64_t last_sequence ABSL_GUARDED_BY(mu) = 0;
    // The send writing now: its socket (-1: none) and group epoch, and
    // whether AbortGroup() cut it. The writer clears the socket before it
    // closes it, so AbortGroup() (holding writing_mu) shuts down only an
    // open socket, never a number the kernel gave out again.
    absl::Mutex writing_mu ABSL_ACQUIRED_AFTER(mu);
    int writing_fd ABSL_GUARDED_BY(writing_mu) = -1;
    std::string writing_group ABSL_GUARDED_BY(writing_mu);
    uint64_t writing_epoch ABSL_GUARDED_BY(writing_mu) = 0;
    bool cut ABSL_GUARDED_BY(writing_mu) = false;
  };

  Peer* GetPeer(const std::string& address);
  static PeerRegistration Learned(Peer& peer);
  // Closes the connection when it was opened for another identity than
  // the one learned last, or the peer's certificate was revoked.
  static void DropIfStaleLocked(Peer& peer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(peer.mu);
  // Connects to the learned data port, or asks the peer for its TCP port
  // first when none was learned.
  absl::Status OpenLocked(Peer& peer, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(peer.mu);
  absl::Status WriteLocked(Peer& peer, const MessageKey& key,
                           absl::string_view data, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(peer.mu);
  // Whether AbortGroup() was called for `group` at `epoch` lately.
  bool WasAborted(const std::string& group, uint64_t epoch);
  // WasAborted for `key`'s group epoch, asked per frame: the peer keeps the
  // last answer, so only a new group epoch or a new AbortGroup() call since
  // takes the lock and the scan.
  bool AbortedLocked(Peer& peer, const MessageKey& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(peer.mu);
  // WriteLocked where AbortGroup() can cut the write; sets *cut when it did.
  // Returns ABORTED, writing nothing, for a group epoch aborted before.
  absl::Status WriteCuttableLocked(Peer& peer, const MessageKey& key,
                                   absl::string_view data, absl::Time deadline,
                                   bool* cut)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(peer.mu);
  // Writes `parts` on the peer's connection (through TLS when on); stops
  // when `cancel_fd` (-1: none) fires. Codes of WriteAll (tcp_socket.h).
  static absl::Status WriteFrameLocked(Peer& peer,
                                       const absl::string_view* parts,
                                       size_t count, absl::Time deadline,
                                       int cancel_fd)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(peer.mu);
  // Says goodbye when `goodbye` and the connection is healthy, then closes.
  static void CloseLocked(Peer& peer, bool goodbye)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(peer.mu);

  // An eventfd that Shutdown() makes readable, waking every send that
  // waits for its peer.
  const std::function<absl::Duration()> dead_peer_timeout_;
  const int shutdown_fd_;
  std::atomic<bool> shut_down_{false};
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Peer>> peers_
      ABSL_GUARDED_BY(mu_);
  // The group epochs AbortGroup() was called for, newest last.
  static constexpr size_t kAbortsRemembered = 256;
  absl::Mutex aborted_mu_;
  std::deque<std::pair<std::string, uint64_t>> aborted_
      ABSL_GUARDED_BY(aborted_mu_);
  // How many times AbortGroup() was called.
  std::atomic<uint64_t> aborts_{0};
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_DATAPLANE_TCP_PEER_POOL_H_
