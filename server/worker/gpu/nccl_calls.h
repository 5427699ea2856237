// NcclCalls: a worker's collectives planned `nccl` (ALGORITHM_NCCL). Each
// rank of a group epoch gets one NCCL communicator, made at its first such
// call: rank 0 makes the unique id and sends it to every other rank over
// the Chorus data plane (the call's Transport), all start their
// communicators and wait, bounded by the call's deadline and ended by the
// group's abort, until every rank connected. Every call then runs on the
// rank's GPU on a stream of the communicator: after the caller's stream
// (device memory) or after a copy of host memory onto the GPU, NCCL's
// collective, avg's division, a copy back to host memory where the caller
// gave that, and a host function that marks the call done. The rank waits
// for that mark as for a peer's data (Transport::AwaitWord): the deadline,
// a lost peer or the coordinator's abort of the group end the wait, and
// then the communicator is aborted (its kernels return) and forgotten, so
// a group epoch's next call fails over the data plane as any plan would.
//
// Lifecycle: one per worker; it destroys its communicators when it goes.
// Thread safety: thread-safe; calls of one rank of a group run one at a
// time (the worker runs a rank's collectives in order).
#ifndef CHORUS_SERVER_WORKER_GPU_NCCL_CALLS_H_
#define CHORUS_SERVER_WORKER_GPU_NCCL_CALLS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/collective.h"
#include "common/result_hash.h"
#include "server/worker/dataplane/transport.h"
#include "server/worker/gpu/device_runtime.h"
#include "server/worker/gpu/nccl_runtime.h"

namespace chorus {

struct NcclCall {
  std::string group;
  uint64_t epoch = 0;
  uint64_t sequence = 0;
  int rank = 0;
  int world_size = 0;
  // The rank's GPU.
  int device = 0;
  CollectiveSpec spec;
  // Device memory of that GPU (the caller's stream, when set, wrote the
  // input), or else host memory.
  bool on_device = false;
  const void* device_input = nullptr;
  void* device_output = nullptr;
  void* caller_stream = nullptr;
  absl::string_view host_input;
  std::string* host_output = nullptr;
  // Waits for the other ranks' communicators end here.
  absl::Time deadline = absl::InfiniteFuture();
  // The group's abort, as far as this worker knows it (OK: none).
  std::function<absl::Status()> aborted;
  // When set, the output's bytes are added to it (the results check).
  ResultHash* hash = nullptr;
};

class NcclCalls {
 public:
  // `gpus` (not owned) outlives this; its Nccl() runs the collectives.
  explicit NcclCalls(DeviceRuntime* gpus);
  ~NcclCalls();
  NcclCalls(const NcclCalls&) = delete;
  NcclCalls& operator=(const NcclCalls&) = delete;

  // The NCCL version a worker advertises (0: none).
  int version() const;

  // Runs `call`; `transport` is the call's (the id travels on it). Returns
  // OK once the output is in place; else the transport's statuses
  // (DEADLINE_EXCEEDED, UNAVAILABLE for a lost peer, the group's abort),
  // NCCL's and the GPU's errors (nccl_runtime.h, device_runtime.h), or
  // INVALID_ARGUMENT for a malformed id from rank 0.
  absl::Status Run(const NcclCall& call, Transport& transport);

  // Aborts the communicators of `group` at `epoch` and before (the group's
  // verdict ended it), of rank `rank` alone unless it is kEveryRank (the
  // rank left): at once where no call runs on them, else once that call,
  // which the verdict ends too, returns.
  static constexpr int kEveryRank = -1;
  void Forget(const std::string& group, uint64_t epoch, int rank = kEveryRank);

 private:
  struct Comm;
  // The communicator of `call`'s rank at its epoch, made (with the id's
  // relay) when there is none. Returns Run()'s codes.
  absl::StatusOr<std::shared_ptr<Comm>> CommFor(const NcclCall& call,
                                                Transport& transport);
  absl::StatusOr<std::shared_ptr<Comm>> MakeComm(const NcclCall& call,
                                                 Transport& transport);
  // Waits until `comm` connected. Returns Run()'s codes.
  absl::Status AwaitConnected(const NcclCall& call, Comm& comm);
  // Forgets `comm` (the last holder's release aborts it).
  void Drop(const NcclCall& call, const std::shared_ptr<Comm>& comm);
  // Enqueues `call`'s work on `comm`'s stream, ending with setting `done`
  // to 1 (and waking its waiters). Returns the GPU's and NCCL's errors.
  absl::Status Enqueue(const NcclCall& call, Comm& comm,
                       const std::shared_ptr<std::atomic<uint64_t>>& done);
  // Enqueues the input's way onto the GPU (a host input, or a device input
  // NCCL cannot take where it is); sets where NCCL reads and writes.
  absl::Status PlaceOnGpu(const NcclCall& call, Comm& comm, const void** input,
                          void** output);
  // After the call's work: its output into host memory, and its hash.
  void Deliver(const NcclCall& call, Comm& comm);

  DeviceRuntime* const gpus_;
  NcclRuntime* const nccl_;
  mutable absl::Mutex mu_;
  // By (group, rank): the communicator of its latest epoch.
  std::map<std::pair<std::string, int>, std::shared_ptr<Comm>> comms_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_GPU_NCCL_CALLS_H_
