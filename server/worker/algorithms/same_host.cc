// The same_host plan: all-reduce between ranks whose workers run on one
// host, through shared memory (SharedSegments) instead of sockets.
//
//   A. Every rank copies the blocks of its input that its peers reduce
//      (block p for rank p: not its own) into a shared segment of its own,
//      each at its offset, and sends every other rank its pid, the segment's
//      descriptor and id, and its lease's ticket. A rank without a segment
//      says so, and then every rank falls back to the ring at once.
//   B. Every rank maps each peer's segment. One that mapped them all
//      reduces element block r (r its rank) of every rank's input, in rank
//      order (its own from its input, the others from their segments), into
//      its segment, where its own block would be. It then sets
//      its segment's stage to "reduced", or to "cannot" when it could not
//      map them all. A rank that mapped them all waits for every peer's
//      stage; unless all say "reduced", every rank (each knows it: by a
//      peer's "cannot" or its own) exchanges one more message, so that no
//      segment is reused while another rank still reads its stage, and
//      falls back to the ring in this same call, on its input (its output,
//      which may be its input, was not written yet).
//   C. Every rank copies block p from rank p's segment into its output
//      (its own block from its own), sets its stage to "done", and waits
//      for every peer's "done", so no rank reuses its segment (or returns)
//      while another still reads it.
//
// One round of messages and two of stages, which a waiting rank polls and
// then sleeps on (Transport::AwaitWord); three rounds of messages took 1.1x
// to 2.3x the time (bench/README.md, "Same host: stages in shared memory").
// A rank copies (n-1)/n of its input into shared memory and all of its output
// out of it, and reduces from where the data is: 2 - 1/n times the bytes
// copied per call where copying the whole input and publishing the reduced
// block cost 2 ("Same host: fewer copies").
//
// Each block is combined once, in rank order (in the accumulator type, e.g.
// f32 for f16/bf16, and rounded once), and copied: every rank gets
// bit-identical results. A call that ran to its end may keep its segments,
// mapped, for the rank's later calls of its shape (AlgorithmArgs::
// bind_same_host, same_host_binding.h).
#include <unistd.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/futex_word.h"
#include "server/worker/algorithms/algorithm.h"
#include "server/worker/algorithms/chunked.h"
#include "server/worker/algorithms/same_host_binding.h"
#include "server/worker/algorithms/same_host_steps.h"
#include "server/worker/algorithms/shared_segments.h"

namespace chorus {
namespace {

// What a rank tells its peers in step A.
struct Exposed {
  uint64_t pid = 0;
  int64_t fd = -1;  // -1: no segment
  uint64_t id = 0;
  uint64_t ticket = 0;
};

// The steps a segment's stage records, for the call that leased it with
// ticket t: StageOf(t, step), larger for each later step and lease.
enum class Step : uint64_t { kReduced = 1, kCannot = 2, kDone = 3 };

uint64_t StageOf(uint64_t ticket, Step step) {
  return ticket * 4 + static_cast<uint64_t>(step);
}

// Sets this rank's stage to `step` and wakes the peers waiting on it.
void Advance(const SharedSegments::Own& own, Step step) {
  own.stage->store(StageOf(own.ticket, step), std::memory_order_release);
  WakeWordWaiters(*own.stage);
}

// Sends `message` to every other rank, then receives one from each.
absl::StatusOr<std::vector<std::string>> AllToAll(Transport& transport,
                                                  const std::string& message) {
  const int world = transport.world_size();
  for (int peer = 0; peer < world; ++peer) {
    if (peer == transport.rank()) continue;
    absl::Status sent = transport.Send(peer, message);
    if (!sent.ok()) return sent;
  }
  std::vector<std::string> received(world);
  for (int peer = 0; peer < world; ++peer) {
    if (peer == transport.rank()) continue;
    absl::StatusOr<std::string> data = transport.Recv(peer);
    if (!data.ok()) return data.status();
    received[peer] = *std::move(data);
  }
  return received;
}

// The peers' segments mapped for one call; unmapped when it ends.
class PeerSegments {
 public:
  explicit PeerSegments(int world) : peers_(world) {}
  ~PeerSegments() {
    for (const SharedSegments::Peer& peer : peers_) {
      if (peer.handle != nullptr) SharedSegments::Get().Unmap(peer);
    }
  }
  SharedSegments::Peer& operator[](int rank) { return peers_[rank]; }
  // Hands the mappings over (to a binding); they are no longer unmapped
  // here.
  std::vector<SharedSegments::Peer> Release() { return std::move(peers_); }

 private:
  std::vector<SharedSegments::Peer> peers_;
};

// A. The hellos of every rank (this rank's entry is left empty). Returns
// INTERNAL for one that is malformed.
absl::StatusOr<std::vector<Exposed>> ParseHellos(
    const std::vector<std::string>& hellos, int rank) {
  std::vector<Exposed> exposed(hellos.size());
  for (int peer = 0; peer < static_cast<int>(hellos.size()); ++peer) {
    if (peer == rank) continue;
    if (hellos[peer].size() != sizeof(Exposed)) {
      return absl::InternalError(
          absl::StrCat("rank ", peer, " sent a malformed same_host hello"));
    }
    std::memcpy(&exposed[peer], hellos[peer].data(), sizeof(Exposed));
  }
  return exposed;
}

// B. Maps every peer's segment in `exposed`; returns whether every one
// could be mapped by this rank.
bool MapPeers(const std::vector<Exposed>& exposed, int rank, uint64_t bytes,
              PeerSegments& peers) {
  for (int peer = 0; peer < static_cast<int>(exposed.size()); ++peer) {
    if (peer == rank) continue;
    const Exposed& theirs = exposed[peer];
    absl::StatusOr<SharedSegments::Peer> segment =
        SharedSegments::Get().MapPeer(theirs.pid, static_cast<int>(theirs.fd),
                                      theirs.id, bytes);
    if (!segment.ok()) return false;
    peers[peer] = *segment;
  }
  return true;
}

// Waits until every peer's stage reached `step` of its call. With
// `all_reduced`, clears it when a peer said Step::kCannot.
absl::Status AwaitPeers(Transport& transport,
                        const std::vector<Exposed>& exposed,
                        PeerSegments& peers, Step step, bool* all_reduced) {
  for (int peer = 0; peer < transport.world_size(); ++peer) {
    if (peer == transport.rank()) continue;
    const std::atomic<uint64_t>& stage = *peers[peer].stage;
    const uint64_t ticket = exposed[peer].ticket;
    absl::Status reached =
        transport.AwaitWord(peer, stage, StageOf(ticket, step));
    if (!reached.ok()) return reached;
    // Past "cannot" only by "done" of this same call: a rank that said
    // "cannot" ends the call in the ring, with every other rank.
    if (all_reduced != nullptr && stage.load(std::memory_order_acquire) ==
                                      StageOf(ticket, Step::kCannot)) {
      *all_reduced = false;
    }
  }
  return absl::OkStatus();
}

// A's message: this rank's pid and segment (none when `own` failed).
std::string HelloOf(const absl::StatusOr<SharedSegments::Own>& own) {
  Exposed self;
  self.pid = static_cast<uint64_t>(getpid());
  if (own.ok()) {
    self.fd = own->fd;
    self.id = own->id;
    self.ticket = own->ticket;
  }
  std::string hello(sizeof(Exposed), '\0');
  std::memcpy(hello.data(), &self, sizeof(Exposed));
  return hello;
}

// Whether every peer in `exposed` has a segment.
bool AllHaveSegments(const std::vector<Exposed>& exposed, int rank) {
  for (int peer = 0; peer < static_cast<int>(exposed.size()); ++peer) {
    if (peer != rank && exposed[peer].fd < 0) return false;
  }
  return true;
}

// The ring in place of the same_host plan, on the caller's input.
absl::Status FallBack(const AlgorithmArgs& args, Algorithm* ran) {
  if (ran != nullptr) *ran = Algorithm::kRing;
  return RunRing(args);
}

}  // namespace

absl::Status RunSameHost(const AlgorithmArgs& args, Algorithm* ran) {
  const CollectiveSpec& spec = args.spec;
  if (spec.kind != CollectiveKind::kAllReduce) {
    return absl::InvalidArgumentError(
        absl::StrCat("the same_host plan runs all_reduce only, not ",
                     CollectiveKindName(spec.kind)));
  }
  Transport& transport = *args.transport;
  const int world = transport.world_size();
  const int rank = transport.rank();
  const uint64_t bytes = spec.count * DTypeSize(spec.dtype);
  // The output is written only in step C, after every rank read what it
  // needs of this rank's input (steps A and B), so the two may be the same
  // memory.
  char* out = args.output_place;
  if (out == nullptr) {
    args.output->resize(bytes);
    out = args.output->data();
  }

  // A. Copy the blocks the peers reduce into a shared segment and expose
  // it. Without one, this rank says so, and all fall back.
  absl::StatusOr<SharedSegments::Own> own =
      SharedSegments::Get().Acquire(bytes);
  struct Releaser {
    const absl::StatusOr<SharedSegments::Own>& own;
    bool kept = false;  // by a binding
    ~Releaser() {
      if (own.ok() && !kept) SharedSegments::Get().Release(*own);
    }
  } releaser{own};
  if (own.ok()) CopyPeersBlocks(spec, world, rank, args.input, own->data);
  absl::StatusOr<std::vector<std::string>> hellos =
      AllToAll(transport, HelloOf(own));
  if (!hellos.ok()) return hellos.status();
  absl::StatusOr<std::vector<Exposed>> exposed = ParseHellos(*hellos, rank);
  if (!exposed.ok()) return exposed.status();
  // Every rank sees every hello: all fall back, and none reads a segment.
  if (!own.ok() || !AllHaveSegments(*exposed, rank)) return FallBack(args, ran);

  // B. Map every peer's segment and, where all are, reduce this rank's
  // block; learn whether every rank could.
  PeerSegments peers(world);
  bool all_reduced = MapPeers(*exposed, rank, bytes, peers);
  if (all_reduced) {
    const std::function<const char*(int)> input = [&](int r) -> const char* {
      return r == rank ? args.input.data() : peers[r].data;
    };
    absl::Status reduced = ReduceOwnBlock(args, world, rank, input, own->data);
    if (!reduced.ok()) return reduced;
    Advance(*own, Step::kReduced);
    absl::Status heard =
        AwaitPeers(transport, *exposed, peers, Step::kReduced, &all_reduced);
    if (!heard.ok()) return heard;
  } else {
    Advance(*own, Step::kCannot);
  }
  if (!all_reduced) {
    absl::StatusOr<std::vector<std::string>> read = AllToAll(transport, "f");
    if (!read.ok()) return read.status();
    return FallBack(args, ran);
  }

  // C. Copy the reduced blocks, then wait until no rank reads any more.
  const std::function<const char*(int)> segment = [&](int r) -> const char* {
    return r == rank ? own->data : peers[r].data;
  };
  CopyReducedBlocks(args, world, segment, out);
  Advance(*own, Step::kDone);
  absl::Status done =
      AwaitPeers(transport, *exposed, peers, Step::kDone, nullptr);
  if (done.ok() && args.bind_same_host != nullptr) {
    std::vector<uint64_t> tickets(world);
    for (int r = 0; r < world; ++r) {
      tickets[r] = r == rank ? own->ticket : (*exposed)[r].ticket;
    }
    *args.bind_same_host = std::make_shared<SameHostBinding>(
        world, rank, *own, peers.Release(), std::move(tickets));
    releaser.kept = true;
  }
  return done;
}

}  // namespace chorus
