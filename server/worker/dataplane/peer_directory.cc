#include "server/worker/dataplane/peer_directory.h"

namespace chorus {

void PeerDirectory::Learn(const std::string& group, uint64_t epoch,
                          std::vector<std::string> worker_names) {
  Epoch entry;
  entry.names = std::move(worker_names);
  Store(group, epoch, std::move(entry));
}

void PeerDirectory::LearnPartial(const std::string& group, uint64_t epoch,
                                 int world_size, const RankPeer& self) {
  Epoch entry;
  entry.names.resize(world_size);
  entry.addresses.resize(world_size);
  entry.self_rank = self.rank;
  if (self.rank >= 0 && self.rank < world_size) {
    entry.names[self.rank] = self.name;
    entry.addresses[self.rank] = self.address;
  }
  Store(group, epoch, std::move(entry));
}

void PeerDirectory::Store(const std::string& group, uint64_t epoch,
                          Epoch entry) {
  std::vector<std::pair<std::function<void(Verdict)>, Verdict>> ready;
  {
    absl::MutexLock lock(&mu_);
    std::map<uint64_t, Epoch>& epochs = groups_[group];
    epochs[epoch] = std::move(entry);
    while (epochs.size() > kEpochsPerGroup) epochs.erase(epochs.begin());
    ready = TakeAnsweredLocked(group);
  }
  for (auto& [callback, verdict] : ready) callback(verdict);
}

void PeerDirectory::LearnRanks(const std::string& group, uint64_t epoch,
                               const std::vector<RankPeer>& peers) {
  std::vector<std::pair<std::function<void(Verdict)>, Verdict>> ready;
  {
    absl::MutexLock lock(&mu_);
    auto found = groups_.find(group);
    if (found == groups_.end()) return;
    auto it = found->second.find(epoch);
    if (it == found->second.end() || !it->second.partial()) return;
    Epoch& entry = it->second;
    for (const RankPeer& peer : peers) {
      if (peer.rank < 0 || peer.rank >= static_cast<int>(entry.names.size())) {
        continue;
      }
      entry.names[peer.rank] = peer.name;
      entry.addresses[peer.rank] = peer.address;
    }
    ready = TakeAnsweredLocked(group);
  }
  for (auto& [callback, verdict] : ready) callback(verdict);
}

std::vector<std::pair<std::function<void(PeerDirectory::Verdict)>,
                      PeerDirectory::Verdict>>
PeerDirectory::TakeAnsweredLocked(const std::string& group) {
  std::vector<std::pair<std::function<void(Verdict)>, Verdict>> ready;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    Waiter& waiter = it->second;
    const Verdict verdict =
        waiter.group == group
            ? CheckLocked(waiter.group, waiter.epoch, waiter.rank, waiter.name)
            : Verdict::kUnknown;
    if (verdict != Verdict::kUnknown) {
      ready.emplace_back(std::move(waiter.ready), verdict);
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
  return ready;
}

PeerDirectory::Verdict PeerDirectory::Check(const std::string& group,
                                            uint64_t epoch, int rank,
                                            const std::string& name) const {
  absl::ReaderMutexLock lock(&mu_);
  return CheckLocked(group, epoch, rank, name);
}

const PeerDirectory::Epoch* PeerDirectory::FindLocked(const std::string& group,
                                                      uint64_t epoch) const {
  auto found = groups_.find(group);
  if (found == groups_.end()) return nullptr;
  auto it = found->second.find(epoch);
  return it == found->second.end() ? nullptr : &it->second;
}

namespace {

// Entry `rank` of `entries`; "" when out of range.
std::string EntryOf(const std::vector<std::string>& entries, int rank) {
  return rank >= 0 && rank < static_cast<int>(entries.size()) ? entries[rank]
                                                              : "";
}

}  // namespace

std::string PeerDirectory::WorkerName(const std::string& group, uint64_t epoch,
                                      int rank) const {
  absl::ReaderMutexLock lock(&mu_);
  const Epoch* entry = FindLocked(group, epoch);
  return entry == nullptr ? "" : EntryOf(entry->names, rank);
}

std::string PeerDirectory::Address(const std::string& group, uint64_t epoch,
                                   int rank) const {
  absl::ReaderMutexLock lock(&mu_);
  const Epoch* entry = FindLocked(group, epoch);
  return entry == nullptr ? "" : EntryOf(entry->addresses, rank);
}

void PeerDirectory::SetResolver(Resolver resolver) {
  absl::MutexLock lock(&mu_);
  resolver_ = std::move(resolver);
}

PeerDirectory::Verdict PeerDirectory::CheckLocked(
    const std::string& group, uint64_t epoch, int rank,
    const std::string& name) const {
  auto found = groups_.find(group);
  if (found == groups_.end()) return Verdict::kUnknown;
  const std::map<uint64_t, Epoch>& epochs = found->second;
  auto it = epochs.find(epoch);
  if (it == epochs.end()) {
    // Newer than every epoch learned: not learned yet. Older: forgotten or
    // never this worker's, and dead either way.
    return epoch > epochs.rbegin()->first ? Verdict::kUnknown
                                          : Verdict::kNotMember;
  }
  const std::vector<std::string>& names = it->second.names;
  if (rank < 0 || rank >= static_cast<int>(names.size())) {
    return Verdict::kNotMember;
  }
  if (names[rank].empty() && it->second.partial()) return Verdict::kUnknown;
  return names[rank] == name ? Verdict::kMember : Verdict::kNotMember;
}

uint64_t PeerDirectory::WaitFor(const std::string& group, uint64_t epoch,
                                int rank, const std::string& name,
                                Verdict* verdict,
                                std::function<void(Verdict)> ready) {
  Resolver resolver;
  int self_rank = -1;
  uint64_t token;
  {
    absl::MutexLock lock(&mu_);
    *verdict = CheckLocked(group, epoch, rank, name);
    if (*verdict != Verdict::kUnknown) return 0;
    token = next_token_++;
    waiters_[token] = Waiter{group, epoch, rank, name, std::move(ready)};
    const Epoch* entry = FindLocked(group, epoch);
    if (entry != nullptr && entry->partial()) {
      resolver = resolver_;
      self_rank = entry->self_rank;
    }
  }
  if (resolver) resolver(group, epoch, self_rank, rank);
  return token;
}

bool PeerDirectory::Cancel(uint64_t token) {
  absl::MutexLock lock(&mu_);
  return waiters_.erase(token) > 0;
}

}  // namespace chorus
