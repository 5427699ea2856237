#include "server/worker/dataplane/inbox.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace chorus {
namespace {

std::string GroupEpoch(const std::string& group, uint64_t epoch) {
  return absl::StrCat(group, "/", epoch);
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
}

bool Inbox::Deliver(StreamId stream, const MessageKey& key, std::string data,
                    std::function<void()> resume) {
  absl::MutexLock lock(&mu_);
  const std::string group_epoch = GroupEpoch(key.group, key.epoch);
  if (aborted_.contains(group_epoch)) return true;
  seen_.insert(group_epoch);
  const uint64_t size = data.size();
  messages_[key.ToString()] = Stored{std::move(data), stream};
  auto it = streams_.find(stream);
  if (it == streams_.end()) return true;
  it->second.bytes += size;
  if (it->second.bytes <= stream_limit_bytes_) return true;
  it->second.resume = std::move(resume);
  return false;
}

absl::StatusOr<std::string> Inbox::Take(const MessageKey& key,
                                        absl::Time deadline) {
  const std::string id = key.ToString();
  const std::string group_epoch = GroupEpoch(key.group, key.epoch);
  std::function<void()> resume;
  std::string data;
  {
    absl::MutexLock lock(&mu_);
    seen_.insert(group_epoch);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return messages_.contains(id) || aborted_.contains(group_epoch);
    };
    mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
    if (auto aborted = aborted_.find(group_epoch); aborted != aborted_.end()) {
      return aborted->second;
    }
    auto it = messages_.find(id);
    if (it == messages_.end()) {
      return absl::DeadlineExceededError(
          absl::StrCat("rank ", key.from_rank, " of group ", key.group,
                       " sent no data for collective #", key.sequence,
                       " within the deadline"));
    }
    data = std::move(it->second.data);
    const StreamId stream = it->second.stream;
    messages_.erase(it);
    auto s = streams_.find(stream);
    if (s != streams_.end()) {
      s->second.bytes -= std::min<uint64_t>(s->second.bytes, data.size());
      if (s->second.resume && s->second.bytes <= stream_limit_bytes_) {
        resume = std::move(s->second.resume);
        s->second.resume = nullptr;
      }
    }
  }
  if (resume) resume();
  return data;
}

void Inbox::Abort(const std::string& group, uint64_t epoch,
                  const absl::Status& status) {
  std::vector<std::function<void()>> resumes;
  {
    absl::MutexLock lock(&mu_);
    AbortLocked(GroupEpoch(group, epoch), status, &resumes);
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
  const std::string prefix = group_epoch + "/";
  for (auto it = messages_.begin(); it != messages_.end();) {
    if (!absl::StartsWith(it->first, prefix)) {
      ++it;
      continue;
    }
    auto s = streams_.find(it->second.stream);
    if (s != streams_.end()) {
      s->second.bytes -=
          std::min<uint64_t>(s->second.bytes, it->second.data.size());
      if (s->second.resume && s->second.bytes <= stream_limit_bytes_) {
        resumes->push_back(std::move(s->second.resume));
        s->second.resume = nullptr;
      }
    }
    messages_.erase(it++);
  }
}

}  // namespace chorus
