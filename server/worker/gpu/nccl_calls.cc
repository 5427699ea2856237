#include "server/worker/gpu/nccl_calls.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/futex_word.h"

namespace chorus {
namespace {

// How often a rank looks whether its communicator connected: NCCL offers
// no notification for a non-blocking communicator's setup, once per group
// epoch.
constexpr absl::Duration kConnectPoll = absl::Milliseconds(1);

std::string CallName(const NcclCall& call) {
  return absl::StrCat("collective #", call.sequence, " of group ", call.group);
}

}  // namespace

// A rank's communicator, the stream its collectives run on, and the memory
// and events they use, kept for the epoch's next calls (no allocation or
// free while NCCL's kernels of other calls may wait for peers). Going, it
// aborts the communicator (which never waits for a peer), waits for what
// its stream still runs, then frees the rest.
struct NcclCalls::Comm {
  // Memory of the GPU (or pinned host memory) that grows to the largest
  // call's need.
  struct Staging {
    void* memory = nullptr;
    uint64_t bytes = 0;
    bool pinned = false;
  };

  Comm(DeviceRuntime* gpus, NcclRuntime* nccl, uint64_t epoch, int device)
      : gpus(gpus), nccl(nccl), epoch(epoch), device(device) {}
  ~Comm() {
    if (handle != nullptr) nccl->Abort(handle);
    if (stream != nullptr) gpus->DeleteStream(device, stream);
    for (Staging* s : {&input, &output, &aside, &host}) Free(*s);
    for (DeviceRuntime::Event e : {caller_written, finished}) {
      if (e != nullptr) gpus->DeleteEvent(device, e);
    }
  }

  void Free(Staging& s) {
    if (s.pinned) {
      gpus->FreePinned(device, static_cast<char*>(s.memory));
    } else {
      gpus->FreeDevice(device, s.memory);
    }
    s = Staging{nullptr, 0, s.pinned};
  }

  // At least `bytes` of `s`; called between calls, when the stream is idle.
  absl::StatusOr<void*> Reserve(Staging& s, uint64_t bytes) {
    if (bytes <= s.bytes) return s.memory;
    Free(s);
    absl::StatusOr<void*> memory =
        s.pinned ? absl::StatusOr<void*>(gpus->AllocPinned(device, bytes))
                 : gpus->AllocDevice(device, bytes);
    if (!memory.ok()) return memory.status();
    s.memory = *memory;
    s.bytes = bytes;
    return s.memory;
  }

  DeviceRuntime* const gpus;
  NcclRuntime* const nccl;
  const uint64_t epoch;
  const int device;
  NcclRuntime::Comm handle = nullptr;
  DeviceRuntime::Stream stream = nullptr;
  // Copies of a host input and output on the GPU, an input set aside where
  // it overlaps the output in a way NCCL does not run in place, and the
  // output's way back to the host.
  Staging input, output, aside, host{nullptr, 0, true};
  // Recorded on the caller's stream, and after each call's work (waiting
  // for it once the call is done returns the work's error at once).
  DeviceRuntime::Event caller_written = nullptr;
  DeviceRuntime::Event finished = nullptr;
};

NcclCalls::NcclCalls(DeviceRuntime* gpus) : gpus_(gpus), nccl_(gpus->Nccl()) {}

NcclCalls::~NcclCalls() {
  absl::MutexLock lock(&mu_);
  comms_.clear();
}

int NcclCalls::version() const { return nccl_->version(); }

absl::StatusOr<std::shared_ptr<NcclCalls::Comm>> NcclCalls::CommFor(
    const NcclCall& call, Transport& transport) {
  std::shared_ptr<Comm> stale;
  {
    absl::MutexLock lock(&mu_);
    auto it = comms_.find({call.group, call.rank});
    if (it != comms_.end()) {
      if (it->second->epoch == call.epoch &&
          it->second->device == call.device) {
        return it->second;
      }
      stale = std::move(it->second);
      comms_.erase(it);
    }
  }
  stale.reset();  // a former epoch's, aborted outside the lock
  absl::StatusOr<std::shared_ptr<Comm>> made = MakeComm(call, transport);
  if (!made.ok()) return made;
  absl::MutexLock lock(&mu_);
  // The group's verdict may have come (and Forget() gone) meanwhile.
  if (call.aborted != nullptr) {
    if (absl::Status aborted = call.aborted(); !aborted.ok()) return aborted;
  }
  comms_[{call.group, call.rank}] = *made;
  return made;
}

absl::StatusOr<std::shared_ptr<NcclCalls::Comm>> NcclCalls::MakeComm(
    const NcclCall& call, Transport& transport) {
  std::string id;
  if (call.rank == 0) {
    absl::StatusOr<std::string> made = nccl_->NewId();
    if (!made.ok()) return made.status();
    id = *std::move(made);
    for (int to = 1; to < call.world_size; ++to) {
      if (absl::Status sent = transport.Send(to, id); !sent.ok()) return sent;
    }
  } else {
    absl::StatusOr<std::string> got = transport.Recv(0);
    if (!got.ok()) return got.status();
    if (got->size() != NcclRuntime::kIdBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          CallName(call), ": rank 0 sent an NCCL id of ", got->size(),
          " bytes (", NcclRuntime::kIdBytes, " expected)"));
    }
    id = *std::move(got);
  }
  auto comm = std::make_shared<Comm>(gpus_, nccl_, call.epoch, call.device);
  absl::StatusOr<DeviceRuntime::Stream> stream = gpus_->NewStream(call.device);
  if (!stream.ok()) return stream.status();
  comm->stream = *stream;
  for (DeviceRuntime::Event* event : {&comm->caller_written, &comm->finished}) {
    absl::StatusOr<DeviceRuntime::Event> made = gpus_->NewEvent(call.device);
    if (!made.ok()) return made.status();
    *event = *made;
  }
  absl::StatusOr<NcclRuntime::Comm> handle =
      nccl_->StartComm(call.device, id, call.world_size, call.rank);
  if (!handle.ok()) return handle.status();
  comm->handle = *handle;
  if (absl::Status s = AwaitConnected(call, *comm); !s.ok()) return s;
  return comm;
}

absl::Status NcclCalls::AwaitConnected(const NcclCall& call, Comm& comm) {
  while (true) {
    absl::StatusOr<bool> ready = nccl_->CommReady(comm.handle);
    if (!ready.ok() || *ready) return ready.status();
    if (call.aborted != nullptr) {
      if (absl::Status aborted = call.aborted(); !aborted.ok()) return aborted;
    }
    if (absl::Now() >= call.deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(CallName(call), ": the NCCL communicator of rank ",
                       call.rank, " on ", DeviceRuntime::Name(call.device),
                       " was still connecting to its peers at the deadline"));
    }
    absl::SleepFor(kConnectPoll);
  }
}

void NcclCalls::Forget(const std::string& group, uint64_t epoch, int rank) {
  std::vector<std::shared_ptr<Comm>> ended;  // aborted outside the lock
  absl::ReleasableMutexLock lock(&mu_);
  for (auto it = comms_.lower_bound({group, 0});
       it != comms_.end() && it->first.first == group;) {
    if (it->second->epoch <= epoch &&
        (rank == kEveryRank || it->first.second == rank)) {
      ended.push_back(std::move(it->second));
      it = comms_.erase(it);
    } else {
      ++it;
    }
  }
  lock.Release();
  ended.clear();
}

void NcclCalls::Drop(const NcclCall& call, const std::shared_ptr<Comm>& comm) {
  absl::MutexLock lock(&mu_);
  auto it = comms_.find({call.group, call.rank});
  if (it != comms_.end() && it->second == comm) comms_.erase(it);
}

absl::Status NcclCalls::Run(const NcclCall& call, Transport& transport) {
  absl::StatusOr<std::shared_ptr<Comm>> comm = CommFor(call, transport);
  if (!comm.ok()) return comm.status();
  auto done = std::make_shared<std::atomic<uint64_t>>(0);
  absl::Status status = Enqueue(call, **comm, done);
  if (status.ok()) {
    status = transport.AwaitWord((call.rank + 1) % call.world_size, *done, 1);
    if (absl::IsDeadlineExceeded(status)) {
      status = absl::DeadlineExceededError(absl::StrCat(
          CallName(call), ": NCCL's ", CollectiveKindName(call.spec.kind),
          " on ", DeviceRuntime::Name(call.device),
          " did not complete within the deadline"));
    }
  }
  if (status.ok()) {
    status = gpus_->Wait(
        call.device, (*comm)->finished,
        absl::StrCat("NCCL's ", CollectiveKindName(call.spec.kind)));
  }
  if (!status.ok()) {
    // The last holder's release aborts it, then frees its memory.
    Drop(call, *comm);
    return status;
  }
  Deliver(call, **comm);
  return absl::OkStatus();
}

absl::Status NcclCalls::Enqueue(
    const NcclCall& call, Comm& comm,
    const std::shared_ptr<std::atomic<uint64_t>>& done) {
  const void* input = nullptr;
  void* output = nullptr;
  if (absl::Status s = PlaceOnGpu(call, comm, &input, &output); !s.ok()) {
    return s;
  }
  // Everything the call needs is reserved before NCCL's kernel is queued.
  const uint64_t out_bytes = OutputBytes(call.spec, call.world_size, call.rank);
  const bool back_to_host =
      out_bytes > 0 && (!call.on_device || call.hash != nullptr);
  if (back_to_host) {
    absl::StatusOr<void*> host = comm.Reserve(comm.host, out_bytes);
    if (!host.ok()) return host.status();
  }
  CollectiveSpec spec = call.spec;
  const bool avg = spec.op == ReduceOp::kAvg;
  if (avg) spec.op = ReduceOp::kSum;
  if (absl::Status s = nccl_->Enqueue(comm.handle, spec, input, output,
                                      comm.stream, call.deadline);
      !s.ok()) {
    return s;
  }
  const size_t element = DTypeSize(spec.dtype);
  if (avg && out_bytes > 0) {
    if (absl::Status s = gpus_->FinalizeAvg(call.device, spec.dtype, output,
                                            out_bytes / element,
                                            call.world_size, comm.stream);
        !s.ok()) {
      return s;
    }
  }
  // The output comes back to the host for a host caller, or for its hash.
  if (back_to_host) {
    if (absl::Status s =
            gpus_->CopyAsync(call.device, comm.host.memory, output, out_bytes,
                             comm.stream, "copying the output off the GPU");
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = gpus_->Record(call.device, comm.finished, comm.stream);
      !s.ok()) {
    return s;
  }
  return gpus_->EnqueueHost(call.device, comm.stream, [done] {
    done->store(1);
    WakeWordWaiters(*done);
  });
}

absl::Status NcclCalls::PlaceOnGpu(const NcclCall& call, Comm& comm,
                                   const void** input, void** output) {
  const CollectiveSpec& spec = call.spec;
  const uint64_t in_bytes = InputBytes(spec, call.world_size, call.rank);
  const uint64_t out_bytes = OutputBytes(spec, call.world_size, call.rank);
  const bool needs_input = !InputMayBeEmpty(spec, call.rank);
  const void* from = call.host_input.data();
  uint64_t from_bytes = std::min<uint64_t>(in_bytes, call.host_input.size());
  if (call.on_device) {
    *input = call.device_input;
    *output = call.device_output;
    if (call.caller_stream != nullptr) {
      auto caller = reinterpret_cast<DeviceRuntime::Stream>(call.caller_stream);
      absl::Status s = gpus_->Record(call.device, comm.caller_written, caller);
      if (s.ok()) {
        s = gpus_->StreamWait(call.device, comm.stream, comm.caller_written);
      }
      if (!s.ok()) return s;
    }
    if (!needs_input) *input = *output;  // NCCL reads nothing there
    if (!needs_input || NcclRuntime::TakesAsGiven(spec.kind, *input, in_bytes,
                                                  *output, out_bytes)) {
      return absl::OkStatus();
    }
    // The input is set aside on the GPU first, so the output may overwrite
    // it.
    from = *input;
    from_bytes = in_bytes;
    absl::StatusOr<void*> aside = comm.Reserve(comm.aside, in_bytes);
    if (!aside.ok()) return aside.status();
    *input = *aside;
  } else {
    absl::StatusOr<void*> out = comm.Reserve(comm.output, out_bytes);
    if (!out.ok()) return out.status();
    *output = *out;
    if (!needs_input) {
      *input = *output;  // off the root a broadcast reads nothing
      return absl::OkStatus();
    }
    absl::StatusOr<void*> in = comm.Reserve(comm.input, in_bytes);
    if (!in.ok()) return in.status();
    *input = *in;
  }
  return gpus_->CopyAsync(call.device, const_cast<void*>(*input), from,
                          from_bytes, comm.stream,
                          "copying the input onto the GPU");
}

void NcclCalls::Deliver(const NcclCall& call, Comm& comm) {
  const uint64_t out_bytes = OutputBytes(call.spec, call.world_size, call.rank);
  const bool back_to_host =
      out_bytes > 0 && (!call.on_device || call.hash != nullptr);
  const absl::string_view result =
      back_to_host ? absl::string_view(
                         static_cast<const char*>(comm.host.memory), out_bytes)
                   : absl::string_view();
  if (!call.on_device && call.host_output != nullptr) {
    call.host_output->assign(result.data(), result.size());
  }
  if (call.hash != nullptr && !result.empty()) call.hash->Add(0, result);
}

}  // namespace chorus
