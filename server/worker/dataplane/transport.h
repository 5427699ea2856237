// Transport: how the algorithms of one collective call talk to the other
// ranks of its group, and all they know of the data plane. A rank sends a
// message to a rank and receives the next message from a rank; messages
// between an ordered pair of ranks arrive in the order they were sent, so
// the algorithm never names them. A peer that is lost shows up as the status
// of a Send() or Recv(), naming its rank.
//
// Implementations: PeerTransport (peer_transport.h), for ranks on other
// workers (over TCP) and on this one; and
// InProcessTransport (in_process_transport.h), for every rank of a group in
// one process, which the algorithms' unit tests use. A virtual call per
// message costs nothing next to a chunk; implementations must not copy the
// bytes they send more than the medium needs.
//
// Lifecycle: one per collective call on one rank, used for that call only.
// Thread safety: thread-compatible (one algorithm thread uses it).
#ifndef CHORUS_SERVER_WORKER_DATAPLANE_TRANSPORT_H_
#define CHORUS_SERVER_WORKER_DATAPLANE_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace chorus {

class Transport {
 public:
  virtual ~Transport() = default;

  // This rank, and the number of ranks of the call's group.
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // Sends the next message to rank `to` (another rank of the group, or this
  // one); `data` is not kept after the call returns. Returns OK once the
  // message is on its way; DEADLINE_EXCEEDED when the peer took no data
  // until the call's deadline, UNAVAILABLE ("rank <to> of group <g>
  // unreachable: ...") when the peer cannot be reached, INVALID_ARGUMENT for
  // a message the medium cannot carry.
  virtual absl::Status Send(int to, absl::string_view data) = 0;

  // Waits for the next message from rank `from` and returns it. Returns
  // DEADLINE_EXCEEDED ("rank <from> of group <g> sent no data for collective
  // #<n> within the deadline"), UNAVAILABLE ("rank <r> of group <g> is gone:
  // ...", see PeerGoneError) when a peer of the call was lost, or the
  // group's abort status (usually ABORTED) once the coordinator aborted it.
  virtual absl::StatusOr<std::string> Recv(int from) = 0;

  // Recv() whose wait also ends at `deadline` (DEADLINE_EXCEEDED then, the
  // message staying next from `from`); a deadline past returns at once.
  virtual absl::StatusOr<std::string> RecvBy(int from, absl::Time deadline) = 0;

  // Waits until `word`, which rank `from` (on this host) advances in memory
  // shared with this process, holds at least `target` (Inbox::AwaitWord).
  // Returns OK, or what Recv(from) would return instead of a message:
  // DEADLINE_EXCEEDED, UNAVAILABLE once a peer of the call was lost, the
  // group's abort status.
  virtual absl::Status AwaitWord(int from, const std::atomic<uint64_t>& word,
                                 uint64_t target) = 0;

  // Hands back a message Recv() returned once the rank is done with it, so
  // that a later message of its size may be received into it; the default
  // frees it.
  virtual void Recycle(std::string message) {}
};

// The status a rank waiting for data gets once the data-plane stream of
// rank `rank` of `group`, held by worker `worker` ("" when unknown) and
// coming from `peer`, broke: UNAVAILABLE "rank <rank> of group <group> on
// worker <worker> is gone: its data-plane stream from <peer> broke", with a
// PEER_LOST ErrorDetail naming the rank.
absl::Status PeerGoneError(absl::string_view group, int rank,
                           absl::string_view worker, absl::string_view peer);

// The status of a failed send to rank `to` of `group`, held by worker
// `worker` ("" when unknown): `cause` with its code kept when it is
// DEADLINE_EXCEEDED or INVALID_ARGUMENT (else UNAVAILABLE, with a PEER_LOST
// ErrorDetail naming rank `to`), its message after "rank <to> of group
// <group> on worker <worker> unreachable: ".
absl::Status UnreachableError(absl::string_view group, int to,
                              absl::string_view worker,
                              const absl::Status& cause);

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_DATAPLANE_TRANSPORT_H_
