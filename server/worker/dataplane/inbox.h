// Inbox: where a worker's peer streams deliver data-plane messages, keyed by
// (group, epoch, sequence, from rank, to rank, tag), until the rank they are
// for takes them.
//
// Flow control: each sending stream may hold at most `stream_limit_bytes`
// untaken bytes here (one message is always accepted). Deliver() reports
// when a stream is over its limit; the stream then stops reading (gRPC's own
// flow control then holds the sender back) until the callback it passed runs.
//
// Group epochs: a group formed again gets a higher epoch and the old one is
// over (the coordinator aborts its calls). Once the inbox sees a group's
// newer epoch it forgets the older one and drops its messages; data or
// waits for an older epoch that come later end as if it had been aborted.
// So the inbox keeps state for one epoch per group, not every epoch a
// worker ever served.
//
// Lifecycle: one per worker runtime, outliving its peer service.
// Thread safety: all methods are thread-safe; callbacks run without the
// inbox's lock held.
#ifndef CHORUS_SERVER_WORKER_DATAPLANE_INBOX_H_
#define CHORUS_SERVER_WORKER_DATAPLANE_INBOX_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/adaptive_spin.h"
#include "server/worker/dataplane/payload_buffers.h"

namespace chorus {

struct MessageKey {
  std::string group;
  uint64_t epoch = 0;
  uint64_t sequence = 0;
  int from_rank = 0;
  int to_rank = 0;
  uint32_t tag = 0;

  std::string ToString() const;
};

class Inbox {
 public:
  explicit Inbox(uint64_t stream_limit_bytes = 64 << 20);

  Inbox(const Inbox&) = delete;
  Inbox& operator=(const Inbox&) = delete;

  // Identifies one sending stream for flow control.
  using StreamId = uint64_t;
  StreamId NewStream();
  // Forgets a closed stream (and its SetStreamPoll()); its untaken messages
  // stay deliverable.
  void CloseStream(StreamId stream);

  // What a stream's poll (SetStreamPoll) did.
  enum class PollResult {
    kDelivered,     // it delivered a message
    kNothingYet,    // the stream has nothing whole yet
    kLeftToStream,  // what the stream has is for its own thread to read
  };
  using StreamPoll = std::function<PollResult()>;

  // Lets a rank's thread that waits in Take() for a message from a rank
  // whose last message came by `stream` read the stream itself while it
  // polls (AdaptiveSpin), instead of waiting for the stream's own thread to
  // wake: `poll` must not block; it delivers what the stream has ready (by
  // Deliver()). After kLeftToStream the wait polls it no more. It may be
  // called after CloseStream() by a Take() already polling.
  void SetStreamPoll(StreamId stream, StreamPoll poll);

  // Stores a message; one delivered again under a key not yet taken
  // replaces the first. Returns true when the stream may keep reading; false
  // when it is over its limit, in which case `resume` runs once the rank
  // took enough of its messages. Returns true and drops the message if the
  // key's group epoch was aborted.
  bool Deliver(StreamId stream, const MessageKey& key, std::string data,
               std::function<void()> resume);

  // Waits for the message `key` and returns it. Returns DEADLINE_EXCEEDED
  // naming the sending rank (and `from_worker`, the worker holding it, when
  // given) when `deadline` passes, the status given to Abort() for the
  // key's group and epoch, or ABORTED when a newer epoch of the group was
  // seen.
  absl::StatusOr<std::string> Take(const MessageKey& key, absl::Time deadline,
                                   absl::string_view from_worker = "");

  // Waits until `word`, which rank `key.from_rank` advances in memory
  // shared with this process (a same_host segment), holds at least
  // `target`: polls (AdaptiveSpin), then blocks on it (futex_word.h).
  // Returns OK; as Take() would for `key`'s group epoch: DEADLINE_EXCEEDED
  // naming the rank (and `from_worker`), the abort status, ABORTED for a
  // newer epoch; or the status of a lost peer of the group epoch. An abort,
  // lost peer or newer epoch wakes the wait at once (or, when it came just
  // as the wait blocked, within kWordRecheck).
  absl::Status AwaitWord(const MessageKey& key,
                         const std::atomic<uint64_t>& word, uint64_t target,
                         absl::Time deadline,
                         absl::string_view from_worker = "");

  // How long AwaitWord() blocks at most before it looks at its group
  // epoch's aborts and lost peers again.
  static constexpr absl::Duration kWordRecheck = absl::Milliseconds(20);

  // Ends every Take() on `group` at `epoch` (and later ones) with `status`
  // and drops its stored messages.
  void Abort(const std::string& group, uint64_t epoch,
             const absl::Status& status);

  // Records that a peer holding ranks of `group` at `epoch` is gone (its
  // stream broke). Take() calls on that group epoch that find no message
  // end with `status`; unlike Abort() this is an observation of this worker
  // to report to the coordinator, not a verdict, and messages already
  // delivered can still be taken.
  void PeerLost(const std::string& group, uint64_t epoch,
                const absl::Status& status);

  // Returns the status `group` at `epoch` was aborted with, or OK.
  absl::Status AbortStatus(const std::string& group, uint64_t epoch);

  // Aborts every group epoch this inbox has seen so far (the coordinator
  // that formed them is gone); group epochs seen later are unaffected.
  void AbortAllSeen(const absl::Status& status);

  // The buffers large payloads delivered here are received into again.
  PayloadBuffers& payloads() { return payloads_; }

  // How long Take() polls for its message before it blocks (AdaptiveSpin;
  // zero: never). Default: kDefaultSpin.
  void SetSpin(absl::Duration max) { spin_.set_max(max); }

 private:
  struct Stored {
    std::string data;
    StreamId stream = 0;
    // GroupEpoch() of the message's key.
    std::string group_epoch;
  };
  // Take() under the lock; streams to resume go to `resumes`.
  absl::StatusOr<std::string> TakeLocked(
      const MessageKey& key, absl::Time deadline, absl::string_view from_worker,
      std::vector<std::function<void()>>* resumes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes `bytes` off `stream`'s count; once the stream is within its limit
  // again, moves its resume callback to `resumes`.
  void ReleaseLocked(StreamId stream, uint64_t bytes,
                     std::vector<std::function<void()>>* resumes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbortLocked(const std::string& group_epoch, const absl::Status& status,
                   std::vector<std::function<void()>>* resumes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Notes that `group` reached `epoch`; when that is newer than the epoch
  // seen so far, forgets the older one and drops its messages. Returns OK,
  // or ABORTED when `epoch` is older than one already seen.
  absl::Status NoteEpochLocked(const std::string& group, uint64_t epoch,
                               std::vector<std::function<void()>>* resumes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why a wait on `group` at `epoch` must end: the abort status, a lost
  // peer's, ABORTED for a newer epoch; OK when none.
  absl::Status EndedLocked(const std::string& group, uint64_t epoch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The poll of the stream that last delivered a message from `key`'s
  // sending rank; null when none.
  std::shared_ptr<const StreamPoll> PollForLocked(const MessageKey& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes every AwaitWord() blocked now, to look at what ended.
  void WakeWordWaitersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the messages of `group_epoch` and releases their bytes.
  void DropMessagesLocked(const std::string& group_epoch,
                          std::vector<std::function<void()>>* resumes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct StreamState {
    uint64_t bytes = 0;
    std::function<void()> resume;
  };

  const uint64_t stream_limit_bytes_;
  absl::Mutex mu_;
  StreamId next_stream_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<std::string, Stored> messages_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<StreamId, StreamState> streams_ ABSL_GUARDED_BY(mu_);
  // SetStreamPoll()'s polls.
  absl::flat_hash_map<StreamId, std::shared_ptr<const StreamPoll>> polls_
      ABSL_GUARDED_BY(mu_);
  // (group, sending rank) -> the stream its last message came by.
  absl::flat_hash_map<std::pair<std::string, int>, StreamId> sender_streams_
      ABSL_GUARDED_BY(mu_);
  // group -> the newest epoch seen.
  absl::flat_hash_map<std::string, uint64_t> latest_epoch_ ABSL_GUARDED_BY(mu_);
  // Every "group/epoch" seen by Deliver() or Take().
  absl::flat_hash_set<std::string> seen_ ABSL_GUARDED_BY(mu_);
  // "group/epoch" -> why it was aborted.
  absl::flat_hash_map<std::string, absl::Status> aborted_ ABSL_GUARDED_BY(mu_);
  // "group/epoch" -> why a peer of it is gone (see PeerLost).
  absl::flat_hash_map<std::string, absl::Status> lost_ ABSL_GUARDED_BY(mu_);
  // The words AwaitWord() calls wait on, with how many wait on each.
  absl::flat_hash_map<const std::atomic<uint64_t>*, int> watched_words_
      ABSL_GUARDED_BY(mu_);
  PayloadBuffers payloads_;
  // Counts what may end a Take(): deliveries, aborts, lost peers, epochs.
  std::atomic<uint64_t> changes_{0};
  AdaptiveSpin spin_;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_DATAPLANE_INBOX_H_
