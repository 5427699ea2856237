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

// A rank's communicator and the stream its collectives run on. Going, it
// aborts the communicator (which never waits for a peer), then waits for
// what its stream still runs.
struct NcclCalls::Comm {
  Comm(DeviceRuntime* gpus, NcclRuntime* nccl, uint64_t epoch, int device)
      : gpus(gpus), nccl(nccl), epoch(epoch), device(device) {}
  ~Comm() {
    if (handle != nullptr) nccl->Abort(handle);
    if (stream != nullptr) gpus->DeleteStream(device, stream);
  }

  DeviceRuntime* const gpus;
  NcclRuntime* const nccl;
  const uint64_t epoch;
  const int device;
  NcclRuntime::Comm handle = nullptr;
  DeviceRuntime::Stream stream = nullptr;
};

// The memory and marks of one call, freed once its stream is done with
// them.
struct NcclRun {
  NcclRun(DeviceRuntime* gpus, int device) : gpus(gpus), device(device) {}
  ~NcclRun() {
    gpus->FreeDevice(device, input);
    gpus->FreeDevice(device, output);
    gpus->FreePinned(device, host);
    if (caller_written != nullptr) gpus->DeleteEvent(device, caller_written);
    if (finished != nullptr) gpus->DeleteEvent(device, finished);
  }

  DeviceRuntime* const gpus;
  const int device;
  // Device copies of host input and output, and the output's way back.
  void* input = nullptr;
  void* output = nullptr;
  char* host = nullptr;
  DeviceRuntime::Event caller_written = nullptr;
  // Recorded after the call's work: waiting for it once `done` is set
  // returns the work's error (a kernel's fault) at once.
  DeviceRuntime::Event finished = nullptr;
  // Set to 1 (and woken) by the stream once the call's work is done; shared
  // with the host function that sets it.
  std::shared_ptr<std::atomic<uint64_t>> done =
      std::make_shared<std::atomic<uint64_t>>(0);
};

NcclCalls::NcclCalls(DeviceRuntime* gpus) : gpus_(gpus), nccl_(gpus->Nccl()) {}

NcclCalls::~NcclCalls() {
  absl::MutexLock lock(&mu_);
  comms_.clear();
}

int NcclCalls::version() const { return nccl_->version(); }

int NcclCalls::comms() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(comms_.size());
}

absl::StatusOr<std::shared_ptr<NcclCalls::Comm>> NcclCalls::CommFor(
    const NcclCall& call, Transport& transport) {
  std::shared_ptr<Comm> stale;
  {
    absl::MutexLock lock(&mu_);
    auto it = comms_.find({call.group, call.rank});
    if (it != comms_.end()) {
      if (it->second->epoch == call.epoch) return it->second;
      stale = std::move(it->second);
      comms_.erase(it);
    }
  }
  stale.reset();  // a former epoch's, aborted outside the lock
  absl::StatusOr<std::shared_ptr<Comm>> made = MakeComm(call, transport);
  if (made.ok()) {
    absl::MutexLock lock(&mu_);
    comms_[{call.group, call.rank}] = *made;
  }
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

}  // namespace chorus

namespace chorus {

absl::Status NcclCalls::Run(const NcclCall& call, Transport& transport) {
  absl::StatusOr<std::shared_ptr<Comm>> comm = CommFor(call, transport);
  if (!comm.ok()) return comm.status();
  NcclRun run(gpus_, call.device);
  absl::Status status = Enqueue(call, **comm, run);
  if (status.ok()) {
    status =
        transport.AwaitWord((call.rank + 1) % call.world_size, *run.done, 1);
    if (absl::IsDeadlineExceeded(status)) {
      status = absl::DeadlineExceededError(absl::StrCat(
          CallName(call), ": NCCL's ", CollectiveKindName(call.spec.kind),
          " on ", DeviceRuntime::Name(call.device),
          " did not complete within the deadline"));
    }
  }
  if (status.ok()) {
    status = gpus_->Wait(
        call.device, run.finished,
        absl::StrCat("NCCL's ", CollectiveKindName(call.spec.kind)));
  }
  if (!status.ok()) {
    // Aborted before `run` goes: its stream no longer uses the memory.
    Drop(call, *comm);
    comm->reset();
    return status;
  }
  Deliver(call, run);
  return absl::OkStatus();
}

absl::Status NcclCalls::Enqueue(const NcclCall& call, Comm& comm,
                                NcclRun& run) {
  const void* input = nullptr;
  void* output = nullptr;
  if (absl::Status s = PlaceOnGpu(call, comm, run, &input, &output); !s.ok()) {
    return s;
  }
  CollectiveSpec spec = call.spec;
  const bool avg = spec.op == ReduceOp::kAvg;
  if (avg) spec.op = ReduceOp::kSum;
  if (absl::Status s = nccl_->Enqueue(comm.handle, spec, input, output,
                                      comm.stream, call.deadline);
      !s.ok()) {
    return s;
  }
  const uint64_t out_bytes = OutputBytes(spec, call.world_size, call.rank);
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
  if (out_bytes > 0 && (!call.on_device || call.hash != nullptr)) {
    absl::StatusOr<char*> host = gpus_->AllocPinned(call.device, out_bytes);
    if (!host.ok()) return host.status();
    run.host = *host;
    if (absl::Status s =
            gpus_->CopyAsync(call.device, run.host, output, out_bytes,
                             comm.stream, "copying the output off the GPU");
        !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<DeviceRuntime::Event> finished = gpus_->NewEvent(call.device);
  if (!finished.ok()) return finished.status();
  run.finished = *finished;
  if (absl::Status s = gpus_->Record(call.device, run.finished, comm.stream);
      !s.ok()) {
    return s;
  }
  return gpus_->EnqueueHost(call.device, comm.stream, [done = run.done] {
    done->store(1);
    WakeWordWaiters(*done);
  });
}

absl::Status NcclCalls::PlaceOnGpu(const NcclCall& call, Comm& comm,
                                   NcclRun& run, const void** input,
                                   void** output) {
  const CollectiveSpec& spec = call.spec;
  const uint64_t in_bytes = InputBytes(spec, call.world_size, call.rank);
  const uint64_t out_bytes = OutputBytes(spec, call.world_size, call.rank);
  const bool needs_input = !InputMayBeEmpty(spec, call.rank);
  if (call.on_device) {
    *input = call.device_input;
    *output = call.device_output;
    if (call.caller_stream != nullptr) {
      auto caller = reinterpret_cast<DeviceRuntime::Stream>(call.caller_stream);
      absl::StatusOr<DeviceRuntime::Event> event = gpus_->NewEvent(call.device);
      if (!event.ok()) return event.status();
      run.caller_written = *event;
      absl::Status s = gpus_->Record(call.device, *event, caller);
      if (s.ok()) s = gpus_->StreamWait(call.device, comm.stream, *event);
      if (!s.ok()) return s;
    }
  } else {
    for (auto [bytes, place] :
         {std::make_pair(needs_input ? in_bytes : 0, &run.input),
          std::make_pair(out_bytes, &run.output)}) {
      if (bytes == 0) continue;
      absl::StatusOr<void*> memory = gpus_->AllocDevice(call.device, bytes);
      if (!memory.ok()) return memory.status();
      *place = *memory;
    }
    *input = run.input;
    *output = run.output;
    if (needs_input) {
      if (absl::Status s = gpus_->CopyAsync(
              call.device, run.input, call.host_input.data(),
              std::min<uint64_t>(in_bytes, call.host_input.size()), comm.stream,
              "copying the input onto the GPU");
          !s.ok()) {
        return s;
      }
    }
  }
  // Off the root a broadcast reads nothing: NCCL ignores that pointer.
  if (!needs_input) *input = *output;
  return absl::OkStatus();
}

void NcclCalls::Deliver(const NcclCall& call, NcclRun& run) {
  const uint64_t out_bytes = OutputBytes(call.spec, call.world_size, call.rank);
  const absl::string_view result = run.host == nullptr
                                       ? absl::string_view()
                                       : absl::string_view(run.host, out_bytes);
  if (!call.on_device && call.host_output != nullptr) {
    call.host_output->assign(result.data(), result.size());
  }
  if (call.hash != nullptr && !result.empty()) call.hash->Add(0, result);
}

}  // namespace chorus
