// NcclRuntime: NCCL communicators between the GPUs of a group, the
// operations NcclCalls (nccl_calls.h) drives for a call planned `nccl`: a
// unique id that one rank makes and the others receive, a communicator per
// rank started without blocking and polled until its ranks connected, a
// collective enqueued on a stream of the rank's GPU, and an abort that ends
// a communicator's work at once (a kernel waiting for a lost peer returns)
// and frees it, which never waits for a peer.
//
// Implementations: this build's (BuiltInNcclRuntime(): NCCL's when Chorus
// is built with CUDA and NCCL, else none, version() 0) and
// EmulatedNcclRuntime (emulated_nccl_runtime.h), communicators between the
// GPUs of an EmulatedDeviceRuntime in one process, so that the orchestration
// (the id's relay, the bounded connect, aborts) runs in tests on every
// machine.
// Exists because: NCCL needs a GPU, which the machines CI runs on lack.
//
// Errors start with the device's name ("Cuda(0): ") and quote NCCL's:
// UNAVAILABLE (no driver, device or network), RESOURCE_EXHAUSTED (out of
// memory), INVALID_ARGUMENT (a spec NCCL cannot run), INTERNAL (any other
// failure, e.g. a peer that broke the communicator), UNIMPLEMENTED (no NCCL
// in this build).
//
// Lifecycle: a runtime outlives every communicator it gave out; a
// communicator is freed by Abort(), once.
// Thread safety: thread-safe; Abort() may be called from any thread while
// another waits for the communicator's work.
#ifndef CHORUS_SERVER_WORKER_GPU_NCCL_RUNTIME_H_
#define CHORUS_SERVER_WORKER_GPU_NCCL_RUNTIME_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/collective.h"
#include "server/worker/gpu/device_runtime.h"

namespace chorus {

class NcclRuntime {
 public:
  struct CommHandle;
  using Comm = CommHandle*;

  // The size of a unique id (NCCL's ncclUniqueId).
  static constexpr size_t kIdBytes = 128;

  virtual ~NcclRuntime() = default;

  // NCCL's version code (major * 10000 + minor * 100 + patch); 0 when
  // there is no NCCL. A worker advertises it when it registers.
  virtual int version() const = 0;

  // A new unique id, kIdBytes bytes, naming a communicator to be; the
  // calling process serves its ranks' first connections. Returns
  // UNIMPLEMENTED without NCCL, UNAVAILABLE when no network was usable.
  virtual absl::StatusOr<std::string> NewId() = 0;

  // Starts rank `rank`'s communicator of `world` ranks on `device` for
  // `id` and returns without waiting for the other ranks: CommReady() says
  // when it is usable. Returns the errors above.
  virtual absl::StatusOr<Comm> StartComm(int device, absl::string_view id,
                                         int world, int rank) = 0;

  // True once every rank connected; false while that is under way.
  // Returns the communicator's error once it failed.
  virtual absl::StatusOr<bool> CommReady(Comm comm) = 0;

  // Whether NCCL runs `kind` on these buffers as given: apart, or in place
  // as Enqueue() takes it (the same buffer, of one size, for all_reduce,
  // reduce and broadcast). all_gather and reduce_scatter in place need
  // NCCL's offsets, which Chorus's callers do not use: such an input is
  // set aside first.
  static bool TakesAsGiven(CollectiveKind kind, const void* input,
                           uint64_t input_bytes, const void* output,
                           uint64_t output_bytes) {
    const auto in = reinterpret_cast<uintptr_t>(input);
    const auto out = reinterpret_cast<uintptr_t>(output);
    const bool overlap = input_bytes > 0 && output_bytes > 0 &&
                         in < out + output_bytes && out < in + input_bytes;
    return !overlap || (in == out && input_bytes == output_bytes &&
                        kind != CollectiveKind::kAllGather &&
                        kind != CollectiveKind::kReduceScatter);
  }

  // Enqueues `spec` on `stream` (of the communicator's device): `input`
  // (InputBytes) and `output` (OutputBytes) are memory of that device that
  // TakesAsGiven(). `spec` is one NcclRunsSpec accepts, with avg given as
  // sum (the caller divides). Returns once enqueued; the work completes in
  // stream order, or ends unfinished when the communicator is aborted. NCCL
  // connects to a collective's peers when it first needs them; an enqueue
  // that waits for that gives up at `until` (DEADLINE_EXCEEDED). Returns
  // INVALID_ARGUMENT for another spec.
  virtual absl::Status Enqueue(Comm comm, const CollectiveSpec& spec,
                               const void* input, void* output,
                               DeviceRuntime::Stream stream,
                               absl::Time until) = 0;

  // Ends the communicator's work (what a stream still runs of it returns
  // without finishing) and frees it.
  virtual void Abort(Comm comm) = 0;
};

// This build's NCCL: NCCL's when built with CUDA and NCCL, else one whose
// version() is 0 and whose every operation returns UNIMPLEMENTED. Never
// null; lives for the whole process.
NcclRuntime* BuiltInNcclRuntime();

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_GPU_NCCL_RUNTIME_H_
