#include "server/worker/gpu/emulated_nccl_runtime.h"

#include <cstring>
#include <iterator>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "server/reduce/cpu/cpu_reduce.h"
#include "server/worker/gpu/emulated_device_runtime.h"

namespace chorus {

// The ranks of one communicator and their collectives under way.
struct EmulatedNcclRuntime::Clique {
  // One collective: each rank's input (copied when it arrived) and output.
  struct Round {
    std::vector<std::string> inputs;
    std::vector<void*> outputs;
    int arrived = 0;
    int left = 0;
    bool done = false;
  };

  explicit Clique(int world)
      : world(world), started(world, false), aborted(world, false) {}

  const int world;
  absl::Mutex mu;
  std::vector<bool> started ABSL_GUARDED_BY(mu);
  int joined ABSL_GUARDED_BY(mu) = 0;
  // Ranks whose communicator was aborted: their collectives end at once;
  // the others' wait on, as NCCL's kernels of other processes would, until
  // they are aborted too.
  std::vector<bool> aborted ABSL_GUARDED_BY(mu);
  std::map<uint64_t, Round> rounds ABSL_GUARDED_BY(mu);
};

namespace {

// A rank's communicator.
struct EmulatedComm {
  std::shared_ptr<EmulatedNcclRuntime::Clique> clique;
  int device = 0;
  int rank = 0;
  // The next collective's number; ranks enqueue them in one order.
  uint64_t next = 0;
};

EmulatedComm* AsEmulated(NcclRuntime::Comm comm) {
  return reinterpret_cast<EmulatedComm*>(comm);
}

// Every rank's output of `spec` from every rank's input, as NCCL computes
// it (`spec.op` never avg). Ranks without an output get an empty one.
std::vector<std::string> Outputs(const CollectiveSpec& spec, int world,
                                 const std::vector<std::string>& inputs) {
  std::vector<std::string> out(world);
  const uint64_t block = spec.count * DTypeSize(spec.dtype);
  switch (spec.kind) {
    case CollectiveKind::kBroadcast:
      for (std::string& o : out) o = inputs[spec.root];
      return out;
    case CollectiveKind::kAllGather: {
      std::string all;
      for (const std::string& in : inputs) all += in;
      for (std::string& o : out) o = all;
      return out;
    }
    default:
      break;
  }
  std::string sum = inputs[0];
  for (int r = 1; r < world; ++r) {
    cpu_reduce::ReduceInto(spec.op, spec.dtype, sum.data(), inputs[r].data(),
                           sum.size() / DTypeSize(spec.dtype))
        .IgnoreError();
  }
  for (int r = 0; r < world; ++r) {
    if (spec.kind == CollectiveKind::kAllReduce) out[r] = sum;
    if (spec.kind == CollectiveKind::kReduce && r == spec.root) out[r] = sum;
    if (spec.kind == CollectiveKind::kReduceScatter) {
      out[r] = sum.substr(r * block, block);
    }
  }
  return out;
}

// Rank `rank`'s part of collective `number` of `clique`, on its stream's
// thread: waits until every rank arrived or the clique was aborted.
void Arrive(EmulatedNcclRuntime::Clique& clique, uint64_t number, int rank,
            const CollectiveSpec& spec, std::string input, void* output) {
  absl::MutexLock lock(&clique.mu);
  EmulatedNcclRuntime::Clique::Round& round = clique.rounds[number];
  round.inputs.resize(clique.world);
  round.outputs.resize(clique.world);
  round.inputs[rank] = std::move(input);
  round.outputs[rank] = output;
  if (++round.arrived == clique.world) {
    std::vector<std::string> out = Outputs(spec, clique.world, round.inputs);
    for (int r = 0; r < clique.world; ++r) {
      // An aborted rank's output may be freed already.
      if (!out[r].empty() && !clique.aborted[r]) {
        std::memcpy(round.outputs[r], out[r].data(), out[r].size());
      }
    }
    round.done = true;
  }
  struct Waiting {
    EmulatedNcclRuntime::Clique* clique;
    uint64_t number;
    int rank;
  } waiting{&clique, number, rank};
  clique.mu.Await(absl::Condition(
      +[](Waiting* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->clique->mu) {
        return w->clique->aborted[w->rank] || w->clique->rounds[w->number].done;
      },
      &waiting));
  if (++round.left == clique.world) clique.rounds.erase(number);
}

}  // namespace

EmulatedNcclRuntime::EmulatedNcclRuntime(EmulatedDeviceRuntime* gpus)
    : gpus_(gpus) {}

EmulatedNcclRuntime::~EmulatedNcclRuntime() = default;

absl::StatusOr<std::string> EmulatedNcclRuntime::NewId() {
  absl::BitGen random;
  std::string id(kIdBytes, '\0');
  for (char& c : id) c = static_cast<char>(absl::Uniform<uint8_t>(random));
  return id;
}

absl::StatusOr<NcclRuntime::Comm> EmulatedNcclRuntime::StartComm(
    int device, absl::string_view id, int world, int rank) {
  if (absl::Status usable =
          gpus_->Usable(device, "making an NCCL communicator");
      !usable.ok()) {
    return usable;
  }
  if (id.size() != kIdBytes || world < 1 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(absl::StrCat(
        DeviceRuntime::Name(device), ": NCCL communicator of ", world,
        " ranks, rank ", rank, ", id of ", id.size(), " bytes"));
  }
  absl::MutexLock lock(&mu_);
  for (auto it = cliques_.begin(); it != cliques_.end();) {
    it = it->second.expired() ? cliques_.erase(it) : std::next(it);
  }
  std::shared_ptr<Clique> clique = cliques_[std::string(id)].lock();
  if (clique == nullptr) {
    clique = std::make_shared<Clique>(world);
    cliques_[std::string(id)] = clique;
  }
  absl::MutexLock clique_lock(&clique->mu);
  if (clique->world != world || clique->started[rank]) {
    return absl::InvalidArgumentError(absl::StrCat(
        DeviceRuntime::Name(device), ": rank ", rank, " of ", world,
        " does not fit the communicator of ", clique->world, " ranks"));
  }
  clique->started[rank] = true;
  ++starts_;
  ++clique->joined;
  auto* comm = new EmulatedComm{clique, device, rank};
  return reinterpret_cast<Comm>(comm);
}

absl::StatusOr<bool> EmulatedNcclRuntime::CommReady(Comm comm) {
  Clique& clique = *AsEmulated(comm)->clique;
  absl::MutexLock lock(&clique.mu);
  if (clique.aborted[AsEmulated(comm)->rank]) {
    return absl::InternalError(
        absl::StrCat(DeviceRuntime::Name(AsEmulated(comm)->device),
                     ": the NCCL communicator was aborted"));
  }
  return clique.joined == clique.world;
}

absl::Status EmulatedNcclRuntime::Enqueue(Comm comm, const CollectiveSpec& spec,
                                          const void* input, void* output,
                                          DeviceRuntime::Stream stream,
                                          absl::Time) {
  EmulatedComm& c = *AsEmulated(comm);
  const int world = c.clique->world;
  if (!NcclRunsSpec(spec) || spec.op == ReduceOp::kAvg) {
    return absl::InvalidArgumentError(
        absl::StrCat(DeviceRuntime::Name(c.device), ": NCCL does not run ",
                     CollectiveKindName(spec.kind), " of ",
                     DTypeName(spec.dtype), " as Chorus defines it"));
  }
  const uint64_t in_bytes = InputBytes(spec, world, c.rank);
  const uint64_t out_bytes = OutputBytes(spec, world, c.rank);
  if (!TakesAsGiven(spec.kind, input, in_bytes, output, out_bytes)) {
    // NCCL would read input its output already overwrote.
    return absl::InvalidArgumentError(absl::StrCat(
        DeviceRuntime::Name(c.device), ": NCCL's ",
        CollectiveKindName(spec.kind),
        " does not run on an input and output that overlap this way"));
  }
  for (auto [ptr, bytes, what] :
       {std::make_tuple(input, in_bytes, "input pointer"),
        std::make_tuple(static_cast<const void*>(output), out_bytes,
                        "output pointer")}) {
    if (absl::Status s = gpus_->CheckPointer(c.device, ptr, bytes, what);
        !s.ok()) {
      return s;
    }
  }
  gpus_->EnqueueKernel(
      c.device, stream,
      [clique = c.clique, number = c.next++, rank = c.rank, spec, input,
       in_bytes, output] {
        // The input as it is when the collective runs on the stream.
        Arrive(*clique, number, rank, spec,
               std::string(static_cast<const char*>(input), in_bytes), output);
      });
  return absl::OkStatus();
}

void EmulatedNcclRuntime::Abort(Comm comm) {
  EmulatedComm* c = AsEmulated(comm);
  {
    absl::MutexLock lock(&c->clique->mu);
    c->clique->aborted[c->rank] = true;
  }
  {
    absl::MutexLock lock(&mu_);
    ++aborts_;
  }
  delete c;
}

int EmulatedNcclRuntime::starts() const {
  absl::MutexLock lock(&mu_);
  return starts_;
}

int EmulatedNcclRuntime::aborts() const {
  absl::MutexLock lock(&mu_);
  return aborts_;
}

}  // namespace chorus
