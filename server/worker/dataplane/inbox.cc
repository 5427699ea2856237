#include "server/worker/dataplane/inbox.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/futex_word.h"
#include "common/rank_list.h"

namespace chorus {
namespace {

std::string GroupEpoch(const std::string& group, uint64_t epoch) {
  return absl::StrCat(group, "/", epoch);
}

// What a wait on `group` at `epoch` ends with once `latest` was seen.
absl::Status EpochOver(const std::string& group, uint64_t epoch,
                       uint64_t latest) {
  return absl::AbortedError(absl::StrCat("group ", group, " epoch ", epoch,
                                         " is over: this worker has seen its "
                                         "epoch ",
                                         latest));
}

// What a wait for `key`'s sender ends with at its deadline.
absl::Status NoDataError(const MessageKey& key, absl::string_view from_worker) {
  return absl::DeadlineExceededError(absl::StrCat(
      RankOfGroup(key.group, key.from_rank, from_worker),
      " sent no data for collective #", key.sequence, " within the deadline"));
}

}  // namespace

std::string MessageKey::ToString() const {
  return absl::StrCat(group, "/", epoch, "/", sequence, "/", from_rank, "/",
                      to_rank, "/", tag);
}

Inbox::Inbox(uint64_t stream_limit_bytes)
    : stream_limit_bytes_(stream_limit_bytes) {}

Inbox::StreamId Inbox::NewStream() {
  absl::MutexLock lock(&mu_);
  StreamId id = next_stream_++;
  streams_[id];
  return id;
}

void Inbox::CloseStream(StreamId stream) {
  absl::MutexLock lock(&mu_);
  streams_.erase(stream);
  polls_.erase(stream);
  absl::erase_if(sender_streams_, [stream](const auto& sender) {
    return sender.second == stream;
  });
}

void Inbox::SetStreamPoll(StreamId stream, StreamPoll poll) {
  auto shared = std::make_shared<const StreamPoll>(std::move(poll));
  absl::MutexLock lock(&mu_);
  if (streams_.contains(stream)) polls_[stream] = std::move(shared);
}

std::shared_ptr<const Inbox::StreamPoll> Inbox::PollForLocked(
    const MessageKey& key) {
  auto sender = sender_streams_.find(std::make_pair(key.group, key.from_rank));
  if (sender == sender_streams_.end()) return nullptr;
  auto poll = polls_.find(sender->second);
  return poll == polls_.end() ? nullptr : poll->second;
}

bool Inbox::Deliver(StreamId stream, const MessageKey& key, std::string data,
                    std::function<void()> resume) {
  std::vector<std::function<void()>> resumes;
  bool more = true;
  {
    absl::MutexLock lock(&mu_);
    std::string group_epoch = GroupEpoch(key.group, key.epoch);
    const bool over = !NoteEpochLocked(key.group, key.epoch, &resumes).ok() ||
                      aborted_.contains(group_epoch);
    if (!over) {
      seen_.insert(group_epoch);
      const uint64_t size = data.size();
      auto [stored, inserted] = messages_.try_emplace(key.ToString());
      if (!inserted) {
        // The replaced message's bytes are no longer held.
        ReleaseLocked(stored->second.stream, stored->second.data.size(),
                      &resumes);
      }
      stored->second = Stored{std::move(data), stream, std::move(group_epoch)};
      sender_streams_[std::make_pair(key.group, key.from_rank)] = stream;
      changes_.fetch_add(1, std::memory_order_release);
      auto it = streams_.find(stream);
      if (it != streams_.end()) {
        it->second.bytes += size;
        if (it->second.bytes > stream_limit_bytes_) {
          it->second.resume = std::move(resume);
          more = false;
        }
      }
    }
  }
  for (auto& r : resumes) r();
  return more;
}

void Inbox::ReleaseLocked(StreamId stream, uint64_t bytes,
                          std::vector<std::function<void()>>* resumes) {
  auto s = streams_.find(stream);
  if (s == streams_.end()) return;
  s->second.bytes -= std::min<uint64_t>(s->second.bytes, bytes);
  if (s->second.resume && s->second.bytes <= stream_limit_bytes_) {
    resumes->push_back(std::move(s->second.resume));
    s->second.resume = nullptr;
  }
}

absl::StatusOr<std::string> Inbox::Take(const MessageKey& key,
                                        absl::Time deadline,
                                        absl::string_view from_worker) {
  std::vector<std::function<void()>> resumes;
  absl::StatusOr<std::string> taken;
  {
    absl::MutexLock lock(&mu_);
    taken = TakeLocked(key, deadline, from_worker, &resumes);
  }
  // Streams released on any path (a newer epoch seen, a message taken)
  // resume here, without the lock.
  for (auto& resume : resumes) resume();
  return taken;
}

absl::StatusOr<std::string> Inbox::TakeLocked(
    const MessageKey& key, absl::Time deadline, absl::string_view from_worker,
    std::vector<std::function<void()>>* resumes) {
  const std::string id = key.ToString();
  const std::string group_epoch = GroupEpoch(key.group, key.epoch);
  if (absl::Status current = NoteEpochLocked(key.group, key.epoch, resumes);
      !current.ok()) {
    return current;
  }
  seen_.insert(group_epoch);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return messages_.contains(id) || aborted_.contains(group_epoch) ||
           lost_.contains(group_epoch) || latest_epoch_[key.group] != key.epoch;
  };
  const bool waits = deadline > absl::Now();
  if (!ready() && waits) {
    // The message often comes within microseconds (the peer is in the same
    // step): polling first saves a wake-up (AdaptiveSpin).
    // While it polls, this thread reads the sender's stream itself when it
    // can (SetStreamPoll): that spares waking the stream's thread.
    std::shared_ptr<const StreamPoll> poll = PollForLocked(key);
    uint64_t seen = changes_.load(std::memory_order_acquire);
    mu_.Unlock();
    spin_.Spin([&] {
      uint64_t now = changes_.load(std::memory_order_acquire);
      if (now == seen && poll != nullptr) {
        const PollResult polled = (*poll)();
        if (polled == PollResult::kLeftToStream) poll = nullptr;
        if (polled == PollResult::kDelivered) {
          now = changes_.load(std::memory_order_acquire);
        }
      }
      if (now == seen) return false;
      seen = now;
      absl::MutexLock lock(&mu_);
      return ready();
    });
    mu_.Lock();
  }
  if (waits) mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  if (latest_epoch_[key.group] != key.epoch) {
    // A newer epoch arrived while this one waited.
    return NoteEpochLocked(key.group, key.epoch, resumes);
  }
  if (auto aborted = aborted_.find(group_epoch); aborted != aborted_.end()) {
    return aborted->second;
  }
  auto it = messages_.find(id);
  if (it == messages_.end()) {
    if (auto lost = lost_.find(group_epoch); lost != lost_.end()) {
      return lost->second;
    }
    return NoDataError(key, from_worker);
  }
  std::string data = std::move(it->second.data);
  const StreamId stream = it->second.stream;
  messages_.erase(it);
  ReleaseLocked(stream, data.size(), resumes);
  return data;
}

absl::Status Inbox::AwaitWord(const MessageKey& key,
                              const std::atomic<uint64_t>& word,
                              uint64_t target, absl::Time deadline,
                              absl::string_view from_worker) {
  auto reached = [&] { return word.load(std::memory_order_acquire) >= target; };
  if (reached() || spin_.Spin(reached)) return absl::OkStatus();
  absl::Status ended;
  {
    absl::MutexLock lock(&mu_);
    ++watched_words_[&word];
  }
  while (true) {
    // Loaded before the checks: a store after them changes the word, and
    // the wait below then returns at once.
    const uint64_t seen = word.load(std::memory_order_acquire);
    if (seen >= target) break;
    {
      absl::MutexLock lock(&mu_);
      ended = EndedLocked(key.group, key.epoch);
    }
    if (!ended.ok()) break;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      ended = NoDataError(key, from_worker);
      break;
    }
    WaitWordChange(word, seen, std::min(left, kWordRecheck));
  }
  absl::MutexLock lock(&mu_);
  if (--watched_words_[&word] == 0) watched_words_.erase(&word);
  return ended;
}

absl::Status Inbox::EndedLocked(const std::string& group, uint64_t epoch) {
  const std::string group_epoch = GroupEpoch(group, epoch);
  auto latest = latest_epoch_.find(group);
  if (latest != latest_epoch_.end() && latest->second > epoch) {
    return EpochOver(group, epoch, latest->second);
  }
  if (auto aborted = aborted_.find(group_epoch); aborted != aborted_.end()) {
    return aborted->second;
  }
  if (auto lost = lost_.find(group_epoch); lost != lost_.end()) {
    return lost->second;
  }
  return absl::OkStatus();
}

void Inbox::WakeWordWaitersLocked() {
  for (const auto& [word, waiters] : watched_words_) WakeWordWaiters(*word);
}

void Inbox::Abort(const std::string& group, uint64_t epoch,
                  const absl::Status& status) {
  std::vector<std::function<void()>> resumes;
  {
    absl::MutexLock lock(&mu_);
    if (NoteEpochLocked(group, epoch, &resumes).ok()) {
      AbortLocked(GroupEpoch(group, epoch), status, &resumes);
    }
  }
  for (auto& resume : resumes) resume();
}

void Inbox::PeerLost(const std::string& group, uint64_t epoch,
                     const absl::Status& status) {
  std::vector<std::function<void()>> resumes;
  {
    absl::MutexLock lock(&mu_);
    if (NoteEpochLocked(group, epoch, &resumes).ok()) {
      lost_.emplace(GroupEpoch(group, epoch), status);
      changes_.fetch_add(1, std::memory_order_release);
      WakeWordWaitersLocked();
    }
  }
  for (auto& resume : resumes) resume();
}

absl::Status Inbox::AbortStatus(const std::string& group, uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  auto it = aborted_.find(GroupEpoch(group, epoch));
  return it == aborted_.end() ? absl::OkStatus() : it->second;
}

void Inbox::AbortAllSeen(const absl::Status& status) {
  std::vector<std::function<void()>> resumes;
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& group_epoch : seen_) {
      AbortLocked(group_epoch, status, &resumes);
    }
  }
  for (auto& resume : resumes) resume();
}

void Inbox::AbortLocked(const std::string& group_epoch,
                        const absl::Status& status,
                        std::vector<std::function<void()>>* resumes) {
  aborted_.emplace(group_epoch, status);
  changes_.fetch_add(1, std::memory_order_release);
  WakeWordWaitersLocked();
  DropMessagesLocked(group_epoch, resumes);
}

void Inbox::DropMessagesLocked(const std::string& group_epoch,
                               std::vector<std::function<void()>>* resumes) {
  // Compared whole: a prefix test on the keys would also match groups whose
  // names go on past a '/' (aborting "g" at epoch 1 would drop "g/1"'s).
  for (auto it = messages_.begin(); it != messages_.end();) {
    if (it->second.group_epoch != group_epoch) {
      ++it;
      continue;
    }
    ReleaseLocked(it->second.stream, it->second.data.size(), resumes);
    messages_.erase(it++);
  }
}

absl::Status Inbox::NoteEpochLocked(
    const std::string& group, uint64_t epoch,
    std::vector<std::function<void()>>* resumes) {
  auto [latest, inserted] = latest_epoch_.try_emplace(group, epoch);
  if (inserted || latest->second == epoch) return absl::OkStatus();
  if (epoch < latest->second) return EpochOver(group, epoch, latest->second);
  // Every older epoch was forgotten when this one became the latest.
  const std::string old = GroupEpoch(group, latest->second);
  seen_.erase(old);
  aborted_.erase(old);
  lost_.erase(old);
  DropMessagesLocked(old, resumes);
  latest->second = epoch;
  changes_.fetch_add(1, std::memory_order_release);
  WakeWordWaitersLocked();
  return absl::OkStatus();
}

}  // namespace chorus
