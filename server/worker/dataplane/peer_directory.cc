#include "server/worker/dataplane/peer_directory.h"

namespace chorus {

void PeerDirectory::Learn(const std::string& group, uint64_t epoch,
                          std::vector<std::string> worker_names) {
  std::vector<std::pair<std::function<void(Verdict)>, Verdict>> ready;
  {
    absl::MutexLock lock(&mu_);
    std::map<uint64_t, std::vector<std::string>>& epochs = groups_[group];
    epochs[epoch] = std::move(worker_names);
    while (epochs.size() > kEpochsPerGroup) epochs.erase(epochs.begin());
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      Waiter& waiter = it->second;
      const Verdict verdict = waiter.group == group
                                  ? CheckLocked(waiter.group, waiter.epoch,
                                                waiter.rank, waiter.name)
                                  : Verdict::kUnknown;
      if (verdict != Verdict::kUnknown) {
        ready.emplace_back(std::move(waiter.ready), verdict);
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& [callback, verdict] : ready) callback(verdict);
}

PeerDirectory::Verdict PeerDirectory::Check(const std::string& group,
                                            uint64_t epoch, int rank,
                                            const std::string& name) const {
  absl::ReaderMutexLock lock(&mu_);
  return CheckLocked(group, epoch, rank, name);
}

std::string PeerDirectory::WorkerName(const std::string& group, uint64_t epoch,
                                      int rank) const {
  absl::ReaderMutexLock lock(&mu_);
  auto found = groups_.find(group);
  if (found == groups_.end()) return "";
  auto it = found->second.find(epoch);
  if (it == found->second.end() || rank < 0 ||
      rank >= static_cast<int>(it->second.size())) {
    return "";
  }
  return it->second[rank];
}

PeerDirectory::Verdict PeerDirectory::CheckLocked(
    const std::string& group, uint64_t epoch, int rank,
    const std::string& name) const {
  auto found = groups_.find(group);
  if (found == groups_.end()) return Verdict::kUnknown;
  const std::map<uint64_t, std::vector<std::string>>& epochs = found->second;
  auto it = epochs.find(epoch);
  if (it == epochs.end()) {
    // Newer than every epoch learned: not learned yet. Older: forgotten or
    // never this worker's, and dead either way.
    return epoch > epochs.rbegin()->first ? Verdict::kUnknown
                                          : Verdict::kNotMember;
  }
  const std::vector<std::string>& names = it->second;
  if (rank < 0 || rank >= static_cast<int>(names.size())) {
    return Verdict::kNotMember;
  }
  return names[rank] == name ? Verdict::kMember : Verdict::kNotMember;
}

uint64_t PeerDirectory::WaitFor(const std::string& group, uint64_t epoch,
                                int rank, const std::string& name,
                                Verdict* verdict,
                                std::function<void(Verdict)> ready) {
  absl::MutexLock lock(&mu_);
  *verdict = CheckLocked(group, epoch, rank, name);
  if (*verdict != Verdict::kUnknown) return 0;
  const uint64_t token = next_token_++;
  waiters_[token] = Waiter{group, epoch, rank, name, std::move(ready)};
  return token;
}

bool PeerDirectory::Cancel(uint64_t token) {
  absl::MutexLock lock(&mu_);
  return waiters_.erase(token) > 0;
}

}  // namespace chorus
