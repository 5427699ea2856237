#include "server/worker/repeat_asks.h"

#include <algorithm>
#include <atomic>
#include <utility>

namespace chorus {

struct RepeatAsks::Rank {
  std::string group;
  uint64_t epoch = 0;
  int rank = 0;
  std::vector<CollectiveSpec> shapes;
  // Set while a token of the rank lives; the token's deleter clears it.
  std::atomic<bool> asking{false};
};

namespace {

bool SameShape(const CollectiveSpec& a, const CollectiveSpec& b) {
  return a.dtype == b.dtype && a.count == b.count && a.op == b.op;
}

}  // namespace

std::shared_ptr<const void> RepeatAsks::TryAsk(const std::string& group,
                                               uint64_t epoch, int rank,
                                               const CollectiveSpec& spec) {
  absl::MutexLock lock(&mu_);
  auto it = std::find_if(
      ranks_.begin(), ranks_.end(), [&](const std::shared_ptr<Rank>& entry) {
        return entry->rank == rank && entry->epoch == epoch &&
               entry->group == group;
      });
  std::shared_ptr<Rank> entry;
  if (it != ranks_.end()) {
    entry = std::move(*it);
    ranks_.erase(it);
  } else {
    entry = std::make_shared<Rank>();
    entry->group = group;
    entry->epoch = epoch;
    entry->rank = rank;
    if (ranks_.size() == kMaxRanks) ranks_.erase(ranks_.begin());
  }
  ranks_.push_back(entry);
  const bool called =
      std::any_of(entry->shapes.begin(), entry->shapes.end(),
                  [&](const CollectiveSpec& s) { return SameShape(s, spec); });
  if (!called) {
    if (entry->shapes.size() < kMaxShapes) entry->shapes.push_back(spec);
    return nullptr;
  }
  if (entry->asking.exchange(true)) return nullptr;
  // The token points at the entry it keeps; its deleter lets the rank ask
  // again.
  Rank* const asked = entry.get();
  return std::shared_ptr<const void>(
      asked,
      [entry = std::move(entry)](const void*) { entry->asking.store(false); });
}

void RepeatAsks::Drop(const std::string& group, uint64_t epoch, int rank) {
  absl::MutexLock lock(&mu_);
  ranks_.erase(std::remove_if(ranks_.begin(), ranks_.end(),
                              [&](const std::shared_ptr<Rank>& entry) {
                                return entry->group == group &&
                                       entry->epoch == epoch &&
                                       (rank < 0 || entry->rank == rank);
                              }),
               ranks_.end());
}

}  // namespace chorus
