// Same-host all-reduces repeated on a binding (same_host_binding.h).
#include "server/worker/algorithms/same_host_binding.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <utility>

#include "common/futex_word.h"
#include "server/worker/algorithms/same_host_steps.h"

namespace chorus {
namespace {

using Step = SameHostBinding::Step;

// A call's fingerprint: its sequence, its kind, dtype and op, its count.
struct Fingerprint {
  uint64_t words[SharedSegments::kFingerprintWords] = {};
  bool operator==(const Fingerprint& other) const {
    return std::equal(std::begin(words), std::end(words),
                      std::begin(other.words));
  }
};

Fingerprint FingerprintOf(uint64_t sequence, const CollectiveSpec& spec) {
  Fingerprint print;
  print.words[0] = sequence;
  print.words[1] = static_cast<uint64_t>(spec.kind) << 16 |
                   static_cast<uint64_t>(spec.dtype) << 8 |
                   static_cast<uint64_t>(spec.op);
  print.words[2] = spec.count;
  return print;
}

bool SameShape(const CollectiveSpec& a, const CollectiveSpec& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.count == b.count &&
         a.op == b.op;
}

// Raises `stage` to `value` (never lowers it) and wakes its waiters.
void RaiseStage(std::atomic<uint64_t>& stage, uint64_t value) {
  uint64_t seen = stage.load(std::memory_order_relaxed);
  while (seen < value &&
         !stage.compare_exchange_weak(seen, value, std::memory_order_release,
                                      std::memory_order_relaxed)) {
  }
  WakeWordWaiters(stage);
}

}  // namespace

SameHostBinding::SameHostBinding(int world, int rank, SharedSegments::Own own,
                                 std::vector<SharedSegments::Peer> peers,
                                 std::vector<uint64_t> tickets)
    : world_(world),
      rank_(rank),
      own_(own),
      peers_(std::move(peers)),
      tickets_(std::move(tickets)) {}

SameHostBinding::~SameHostBinding() {
  for (const SharedSegments::Peer& peer : peers_) {
    if (peer.handle != nullptr) SharedSegments::Get().Unmap(peer);
  }
  SharedSegments::Get().Discard(own_);
}

bool SameHostBinding::TryClaim() {
  return !claimed_.exchange(true, std::memory_order_acquire);
}

void SameHostBinding::Unclaim() {
  claimed_.store(false, std::memory_order_release);
}

uint64_t SameHostBinding::capacity() const {
  uint64_t bytes = own_.capacity;
  for (int r = 0; r < world_; ++r) {
    if (r != rank_) bytes = std::min(bytes, peers_[r].capacity);
  }
  return bytes;
}

void SameHostBinding::AddShape(const CollectiveSpec& spec) {
  absl::MutexLock lock(&shapes_mu_);
  for (const CollectiveSpec& shape : shapes_) {
    if (SameShape(shape, spec)) return;
  }
  // Tens of shapes per epoch (a model's buckets) is the common case; more
  // are forgotten oldest first (their calls then ask the coordinator).
  constexpr size_t kMaxShapes = 128;
  if (shapes_.size() == kMaxShapes) shapes_.erase(shapes_.begin());
  shapes_.push_back(spec);
}

void SameHostBinding::AddShapesOf(const SameHostBinding& older) {
  std::vector<CollectiveSpec> shapes;
  {
    absl::MutexLock lock(&older.shapes_mu_);
    shapes = older.shapes_;
  }
  for (const CollectiveSpec& shape : shapes) AddShape(shape);
}

bool SameHostBinding::Fits(const CollectiveSpec& spec) const {
  if (spec.kind != CollectiveKind::kAllReduce ||
      spec.count * DTypeSize(spec.dtype) > capacity()) {
    return false;
  }
  absl::MutexLock lock(&shapes_mu_);
  return std::any_of(
      shapes_.begin(), shapes_.end(),
      [&](const CollectiveSpec& s) { return SameShape(s, spec); });
}

uint64_t SameHostBinding::StageOf(int r, uint64_t sequence, Step step) const {
  return (tickets_[r] + sequence) * 8 + static_cast<uint64_t>(step);
}

// One call on a binding, run with its run_mu_ held.
class BoundCall {
 public:
  BoundCall(SameHostBinding& binding, const BoundCallArgs& args)
      : b_(binding), args_(args), n_(args.sequence) {}

  absl::StatusOr<BoundEnd> Run() {
    const Fingerprint mine = FingerprintOf(n_, args_.spec);
    CopyPeersBlocks(args_.spec, b_.world_, b_.rank_, args_.input, b_.own_.data);
    for (int w = 0; w < SharedSegments::kFingerprintWords; ++w) {
      b_.own_.fingerprint[w].store(mine.words[w], std::memory_order_relaxed);
    }
    RaiseStage(*b_.own_.stage, Own(Step::kArrived));
    absl::StatusOr<bool> agreed = AllArrivedAlike(mine);
    if (!agreed.ok() || !*agreed) {
      RaiseStage(*b_.own_.stage, Own(Step::kWithdrawn));
      if (!agreed.ok()) return agreed.status();
      return BoundEnd::kAskCoordinator;
    }
    RaiseStage(*b_.own_.stage, Own(Step::kGo));
    absl::StatusOr<bool> all_go = AllGo();
    if (!all_go.ok()) return all_go.status();
    if (!*all_go) return BoundEnd::kAskCoordinator;
    absl::Status reduced = ReduceAndCopy();
    if (!reduced.ok()) return reduced;
    return BoundEnd::kDone;
  }

 private:
  uint64_t Own(Step step) const { return b_.StageOf(b_.rank_, n_, step); }
  uint64_t Of(int r, Step step) const { return b_.StageOf(r, n_, step); }

  // Whether rank r's stage says it withdrew from this call: withdrawn(n),
  // or beyond call n altogether.
  bool Withdrew(int r, uint64_t stage) const {
    return stage == Of(r, Step::kWithdrawn) || stage > Of(r, Step::kDone);
  }

  // Phase 1: waits (until the patience) for every peer to arrive, and
  // compares its fingerprint with `mine`. Returns true when all arrived
  // alike; false to withdraw; the transport's abort or lost peer.
  absl::StatusOr<bool> AllArrivedAlike(const Fingerprint& mine) {
    for (int r = 0; r < b_.world_; ++r) {
      if (r == b_.rank_) continue;
      const std::atomic<uint64_t>& stage = *b_.peers_[r].stage;
      absl::Status came =
          args_.patience->AwaitWord(r, stage, Of(r, Step::kArrived));
      if (absl::IsDeadlineExceeded(came)) return false;
      if (!came.ok()) return came;
      if (Withdrew(r, stage.load(std::memory_order_acquire))) return false;
      Fingerprint theirs;
      for (int w = 0; w < SharedSegments::kFingerprintWords; ++w) {
        theirs.words[w] =
            b_.peers_[r].fingerprint[w].load(std::memory_order_relaxed);
      }
      // The fingerprint read belongs to call n only if the peer is still
      // at it (a peer that moved on withdrew; withdrawing here is safe).
      std::atomic_thread_fence(std::memory_order_acquire);
      if (Withdrew(r, stage.load(std::memory_order_relaxed))) return false;
      if (!(theirs == mine)) return false;
    }
    return true;
  }

  // Phase 2: waits for every peer's go or withdrawal. Returns whether all
  // said go.
  absl::StatusOr<bool> AllGo() {
    bool all_go = true;
    for (int r = 0; r < b_.world_; ++r) {
      if (r == b_.rank_) continue;
      const std::atomic<uint64_t>& stage = *b_.peers_[r].stage;
      absl::Status came =
          args_.transport->AwaitWord(r, stage, Of(r, Step::kWithdrawn));
      if (!came.ok()) return came;
      if (Withdrew(r, stage.load(std::memory_order_acquire))) all_go = false;
    }
    return all_go;
  }

  // Steps B and C of the planned call on the bound segments.
  absl::Status ReduceAndCopy() {
    const CollectiveSpec& spec = args_.spec;
    AlgorithmArgs steps;
    steps.spec = spec;
    const auto input = [&](int r) -> const char* {
      return r == b_.rank_ ? args_.input.data() : b_.peers_[r].data;
    };
    absl::Status reduced =
        ReduceOwnBlock(steps, b_.world_, b_.rank_, input, b_.own_.data);
    if (!reduced.ok()) return reduced;
    RaiseStage(*b_.own_.stage, Own(Step::kReduced));
    absl::Status heard = AwaitAll(Step::kReduced);
    if (!heard.ok()) return heard;
    char* out = args_.output_place;
    if (out == nullptr) {
      args_.output->resize(spec.count * DTypeSize(spec.dtype));
      out = args_.output->data();
    }
    const auto segment = [&](int r) -> const char* {
      return r == b_.rank_ ? b_.own_.data : b_.peers_[r].data;
    };
    CopyReducedBlocks(steps, b_.world_, segment, out);
    RaiseStage(*b_.own_.stage, Own(Step::kDone));
    absl::Status done = AwaitAll(Step::kDone);
    if (!done.ok() && AllDoneWithin(args_.grace)) return absl::OkStatus();
    return done;
  }

  absl::Status AwaitAll(Step step) {
    for (int r = 0; r < b_.world_; ++r) {
      if (r == b_.rank_) continue;
      absl::Status came =
          args_.transport->AwaitWord(r, *b_.peers_[r].stage, Of(r, step));
      if (!came.ok()) return came;
    }
    return absl::OkStatus();
  }

  // Whether every peer says done within `grace`, whatever else ended.
  bool AllDoneWithin(absl::Duration grace) {
    const absl::Time until = absl::Now() + grace;
    for (int r = 0; r < b_.world_; ++r) {
      if (r == b_.rank_) continue;
      const std::atomic<uint64_t>& stage = *b_.peers_[r].stage;
      while (true) {
        const uint64_t seen = stage.load(std::memory_order_acquire);
        if (seen >= Of(r, Step::kDone)) break;
        const absl::Duration left = until - absl::Now();
        if (left <= absl::ZeroDuration()) return false;
        WaitWordChange(stage, seen, std::min(left, absl::Milliseconds(5)));
      }
    }
    return true;
  }

  SameHostBinding& b_;
  const BoundCallArgs& args_;
  const uint64_t n_;
};

absl::StatusOr<BoundEnd> RunBoundSameHost(SameHostBinding& binding,
                                          const BoundCallArgs& args) {
  // A call behind one that ran already (calls overtaking each other) cannot
  // lower the stage: it asks the coordinator.
  if (binding.own_.stage->load(std::memory_order_relaxed) >=
      binding.StageOf(binding.rank_, args.sequence, Step::kArrived)) {
    return BoundEnd::kAskCoordinator;
  }
  return BoundCall(binding, args).Run();
}

std::shared_ptr<SameHostBinding> SameHostBindings::Find(
    const std::string& group, uint64_t epoch, int rank) const {
  absl::MutexLock lock(&mu_);
  for (const Kept& kept : kept_) {
    if (kept.rank == rank && kept.epoch == epoch && kept.group == group) {
      return kept.binding;
    }
  }
  return nullptr;
}

void SameHostBindings::Keep(const std::string& group, uint64_t epoch, int rank,
                            std::shared_ptr<SameHostBinding> binding) {
  std::vector<Kept> dropped;  // destroyed outside the lock
  absl::MutexLock lock(&mu_);
  for (auto it = kept_.begin(); it != kept_.end();) {
    const bool replaced =
        it->group == group &&
        (it->epoch < epoch || (it->epoch == epoch && it->rank == rank));
    if (!replaced) {
      ++it;
      continue;
    }
    if (it->epoch == epoch) binding->AddShapesOf(*it->binding);
    dropped.push_back(std::move(*it));
    it = kept_.erase(it);
  }
  kept_.push_back(Kept{group, epoch, rank, std::move(binding)});
  if (kept_.size() > kMaxBindings) {
    dropped.push_back(std::move(kept_.front()));
    kept_.erase(kept_.begin());
  }
}

void SameHostBindings::Drop(const std::string& group, uint64_t epoch,
                            int rank) {
  std::vector<Kept> dropped;  // destroyed outside the lock
  absl::MutexLock lock(&mu_);
  for (auto it = kept_.begin(); it != kept_.end();) {
    if (it->group == group && it->epoch == epoch &&
        (rank < 0 || it->rank == rank)) {
      dropped.push_back(std::move(*it));
      it = kept_.erase(it);
    } else {
      ++it;
    }
  }
}

void WithdrawBound(SameHostBinding& binding, uint64_t sequence) {
  if (!binding.TryClaim()) return;
  RaiseStage(*binding.own_.stage,
             binding.StageOf(binding.rank_, sequence, Step::kWithdrawn));
  binding.Unclaim();
}

}  // namespace chorus
