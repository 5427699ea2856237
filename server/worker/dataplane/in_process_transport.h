// InProcessHub and InProcessTransport: every rank of a group in one process,
// one thread per rank, with no sockets. The algorithms' unit tests run a
// collective this way, over the same Transport interface and with the same
// statuses as between workers: the hub keeps its messages in an Inbox (as a
// worker does), so a wait ends at the deadline, at an abort, or when a peer
// is lost, with the Inbox's and PeerTransport's texts.
// Exists because: the algorithms are unit-tested at every world size, dtype
// and op in one process (tests/unit/ring_test.cc and its neighbours), which
// no socket transport allows on a 2-core machine; nothing in production
// uses it.
//
// Delivery is immediate and unbounded (no flow control): a Send() never
// blocks. A test loses a rank with LosePeer(), as a worker whose data-plane
// stream broke: every wait of the group that finds no message then ends
// with PeerGoneError naming that rank, and every send to it fails with
// UnreachableError.
//
// Lifecycle: the hub outlives every transport made on it; a hub serves one
// group at one epoch, any number of its collectives (by sequence number).
// Thread safety: the hub is thread-safe; each InProcessTransport is
// thread-compatible, used by its rank's thread.
#ifndef CHORUS_SERVER_WORKER_DATAPLANE_IN_PROCESS_TRANSPORT_H_
#define CHORUS_SERVER_WORKER_DATAPLANE_IN_PROCESS_TRANSPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/worker/dataplane/inbox.h"
#include "server/worker/dataplane/transport.h"

namespace chorus {

class InProcessHub {
 public:
  // `world_size` ranks of the group `group` (named in statuses).
  InProcessHub(std::string group, int world_size);

  InProcessHub(const InProcessHub&) = delete;
  InProcessHub& operator=(const InProcessHub&) = delete;

  const std::string& group() const { return group_; }
  int world_size() const { return world_size_; }

  // How rank `rank` is named as a peer in statuses: "in-process rank <r>".
  static std::string PeerName(int rank);

  // Marks rank `rank` lost (see the file comment). Irreversible.
  void LosePeer(int rank);

  // Ends every wait of the group, now and later, with `status`, as the
  // coordinator's abort verdict does on a worker.
  void Abort(const absl::Status& status);

 private:
  friend class InProcessTransport;

  // The group epoch every message of the hub carries.
  static constexpr uint64_t kEpoch = 1;

  // Whether `rank` was lost.
  bool IsLost(int rank);

  const std::string group_;
  const int world_size_;
  Inbox inbox_;
  absl::Mutex mu_;
  std::vector<bool> lost_ ABSL_GUARDED_BY(mu_);
};

class InProcessTransport final : public Transport {
 public:
  // Rank `rank` of `hub`'s group (the hub is not owned) in the group's
  // collective number `sequence`, whose waits end at `deadline`.
  InProcessTransport(InProcessHub* hub, int rank, uint64_t sequence,
                     absl::Time deadline);

  int rank() const override { return rank_; }
  int world_size() const override { return hub_->world_size(); }

  // As Transport::Send: copies `data` into the hub. Returns UNAVAILABLE
  // (UnreachableError) when rank `to` or this rank was lost; OK otherwise.
  absl::Status Send(int to, absl::string_view data) override;

  // As Transport::Recv: DEADLINE_EXCEEDED, UNAVAILABLE (PeerGoneError) once
  // a rank was lost, the status given to InProcessHub::Abort.
  absl::StatusOr<std::string> Recv(int from) override;
  absl::StatusOr<std::string> RecvBy(int from, absl::Time deadline) override;

  // As Transport::AwaitWord: the hub's inbox waits (Inbox::AwaitWord).
  absl::Status AwaitWord(int from, const std::atomic<uint64_t>& word,
                         uint64_t target) override;

 private:
  MessageKey Key(int from, int to, uint32_t tag) const;

  InProcessHub* const hub_;  // not owned
  const int rank_;
  const uint64_t sequence_;
  const absl::Time deadline_;
  std::vector<uint32_t> sent_;
  std::vector<uint32_t> received_;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_DATAPLANE_IN_PROCESS_TRANSPORT_H_
