// InProcessDoor: the door of the local-call core for ranks in the worker's
// own process: C++ ranks that embed the runtime (Communicator::JoinEmbedded)
// and Python ranks (chorus._embedded). Each method translates, calls the
// core (LocalCalls) once and translates back; there is no caller to
// authenticate, as the caller is this process. Every call goes through the
// core's ledger, so an embedded rank gets the same checks of its sequence
// numbers as a rank through a worker daemon.
// Exists because: an embedded rank's 8 B all_reduce costs no hop to a
// daemon and no copy: embedded Python ranks run it within 1.1-1.9x of C++
// ranks, daemon ranks at 2.6-3.3x (bench/README.md, "Python client next to
// embedded ranks").
//
// Lifecycle: made with the core it serves (not owned; outlives it).
// Thread safety: all methods are thread-safe.
#ifndef CHORUS_SERVER_WORKER_LOCAL_IN_PROCESS_DOOR_H_
#define CHORUS_SERVER_WORKER_LOCAL_IN_PROCESS_DOOR_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "chorus/types.h"
#include "chorus/v1/worker.pb.h"
#include "server/worker/local/call_frames.h"
#include "server/worker/local/local_calls.h"
#include "server/worker/membership.h"

namespace chorus {

class InProcessDoor {
 public:
  explicit InProcessDoor(LocalCalls* calls) : calls_(calls) {}

  // Joins as `args` says; returns once the rank is a member, with
  // LocalCalls::Join's codes.
  absl::StatusOr<Membership> Join(const JoinArgs& args, absl::Duration timeout);

  // The rank of `membership` leaves: its later calls are refused, and a
  // rank of an elastic group is reported leaving (the others go on).
  void Leave(const Membership& membership);

  // Runs call `sequence` of `membership` on `input` on this thread, writing
  // this rank's output to `*output`; returns once it ended, with
  // LocalCalls::RunHere's codes.
  absl::StatusOr<RunResult> Run(const Membership& membership, uint64_t sequence,
                                const CollectiveSpec& spec,
                                absl::string_view input, std::string* output,
                                const RunOptions& options);

  // Run() on buffers in the memory of the call's device (Cuda(n)), with
  // LocalCalls::RunOnDevice's codes.
  absl::StatusOr<RunResult> RunOnDevice(const Membership& membership,
                                        uint64_t sequence,
                                        const CollectiveSpec& spec,
                                        const void* input, void* output,
                                        const RunOptions& options);

  // LocalCalls::RunOnDevice and StartOnDevice: a call on device memory
  // named by a request (a Python rank's prefix), ordered on the caller's
  // `stream` (null: none).
  absl::StatusOr<RunResult> RunOnDevice(
      const v1::LocalCollectiveRequest& request, absl::Time deadline,
      const void* input, void* output, void* stream);
  void StartOnDevice(const v1::LocalCollectiveRequest& request,
                     absl::Time deadline, const void* input, void* output,
                     void* stream, InPlaceDone done);

  // Runs a call socket frame (RunLocalCallFrame): `send` gets the reply once,
  // on a thread that must not block, possibly before this returns.
  void RunFrame(v1::LocalCallFrame frame, LocalReplySink send);

  // LocalCalls::RunInPlace and StartInPlace: a call on its caller's memory.
  absl::StatusOr<RunResult> RunInPlace(
      const v1::LocalCollectiveRequest& request, absl::Time deadline,
      const CallerMemory& memory);
  void StartInPlace(const v1::LocalCollectiveRequest& request,
                    absl::Time deadline, const CallerMemory& memory,
                    InPlaceDone done);
  // RunInPlace() of a sync (which has no buffers): returns its outcome
  // (worker.proto's SyncOutcome, serialized: what a call socket reply
  // carries as its data), or RunInPlace()'s codes.
  absl::StatusOr<std::string> SyncInPlace(
      const v1::LocalCollectiveRequest& request, absl::Time deadline);

 private:
  LocalCalls* const calls_;  // not owned
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_LOCAL_IN_PROCESS_DOOR_H_
