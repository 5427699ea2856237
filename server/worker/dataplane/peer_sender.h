// PeerSender: the sending end of the data plane between workers. It takes a
// message for the worker at a peer address and puts it on that worker's
// inbox (through its TcpListener), keeping a connection per peer for every
// collective. Implemented by TcpPeerPool (raw TCP wire frames).
//
// Lifecycle: one per worker runtime. Shutdown() (or the destructor) ends
// sends in progress and closes every connection.
// Thread safety: Send() may be called concurrently from any threads; writes
// to one peer are serialised.
#ifndef CHORUS_SERVER_WORKER_DATAPLANE_PEER_SENDER_H_
#define CHORUS_SERVER_WORKER_DATAPLANE_PEER_SENDER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/worker/dataplane/inbox.h"

namespace chorus {

// Which registration of a peer worker a group's member is, as the
// coordinator's join reply says (GroupMember).
struct PeerRegistration {
  uint64_t worker_id = 0;
  uint64_t incarnation = 0;
  // Its TCP data-plane port; 0 when it did not register one.
  uint32_t data_port = 0;
  // The worker's name, which its certificate names with TLS on; empty when
  // unknown.
  std::string name;

  bool operator==(const PeerRegistration& other) const {
    return worker_id == other.worker_id && incarnation == other.incarnation &&
           data_port == other.data_port && name == other.name;
  }
  bool operator!=(const PeerRegistration& other) const {
    return !(*this == other);
  }
};

class PeerSender {
 public:
  virtual ~PeerSender() = default;

  // Sends `data` as the message `key` to the worker at `address`,
  // connecting first if needed (waiting for the connection until
  // `deadline`, 2 s at most). Blocks while the peer's flow control holds it
  // back, until `deadline`. Returns UNAVAILABLE naming the address when no
  // connection could be made, the connection broke and reopening it failed,
  // or this sender is shut down; DEADLINE_EXCEEDED when the peer took no data
  // until `deadline`; INVALID_ARGUMENT for a key the wire cannot carry.
  virtual absl::Status Send(const std::string& address, const MessageKey& key,
                            absl::string_view data, absl::Time deadline) = 0;

  // Ends the sends in progress of messages of `group` at `epoch` (the
  // coordinator aborted it): they return ABORTED, rather than waiting for a
  // peer that may be gone until the kernel or their deadline gives up, and
  // so do later sends of that group epoch.
  virtual void AbortGroup(const std::string& group, uint64_t epoch) {}

  // Records that the worker at `address` is now `identity` (a group joined
  // with it says so). Connections opened to another identity there (a
  // restarted process, or a worker the coordinator evicted and took back)
  // are closed rather than reused, and new ones use its data port.
  virtual void LearnPeer(const std::string& address,
                         const PeerRegistration& identity) {}

  // Makes every later send return UNAVAILABLE, ends sends in progress where
  // the medium allows (TcpPeerPool's), then closes every connection, saying
  // goodbye where the medium has one. Idempotent.
  virtual void Shutdown() = 0;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_DATAPLANE_PEER_SENDER_H_
