// CallRuntime: what the local-call core (LocalCalls) needs of a worker
// runtime: joining groups, running collectives on host or device memory,
// and reporting a rank gone. WorkerRuntime implements it; unit tests of the
// core implement it with a fake, as the coordinator's core is tested with a
// fake clock. Keeps the core free of gRPC and of the runtime's internals.
//
// Thread safety: implementations are thread-safe; callbacks run once, on a
// thread of the runtime's that must not block.
#ifndef CHORUS_SERVER_WORKER_LOCAL_CALL_RUNTIME_H_
#define CHORUS_SERVER_WORKER_LOCAL_CALL_RUNTIME_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "chorus/types.h"
#include "server/worker/membership.h"

namespace chorus {

class CallRuntime {
 public:
  virtual ~CallRuntime() = default;

  // The name this worker registered under, for messages.
  virtual const std::string& name() const = 0;

  // Joins as `args` says without blocking: `done` runs once with the
  // membership, or the coordinator's INVALID_ARGUMENT, NOT_FOUND,
  // UNIMPLEMENTED, DEADLINE_EXCEEDED (naming the missing ranks),
  // FAILED_PRECONDITION or UNAVAILABLE.
  virtual void JoinAsync(
      const JoinArgs& args, absl::Duration timeout,
      std::function<void(absl::StatusOr<Membership>)> done) = 0;

  // Reports that `membership`'s rank is gone (`why`), or with `leaving`
  // that it leaves its elastic group; returns the group's verdict
  // (ABORTED), or why the coordinator could not be told.
  virtual absl::Status ReportRankGone(const Membership& membership,
                                      const absl::Status& why,
                                      bool leaving) = 0;

  // Says that this process holds `membership`'s rank no more (it left, or
  // its client went away): what the runtime keeps for it alone may go.
  virtual void RankEnded(const Membership& membership) {}

  // Runs call `sequence` of `membership` on host memory and returns once it
  // ended: its plan, INVALID_ARGUMENT for a malformed call, or the
  // coordinator's verdict (mismatch, refusal, DEADLINE_EXCEEDED, ABORTED).
  virtual absl::StatusOr<RunResult> Run(const Membership& membership,
                                        uint64_t sequence,
                                        const CollectiveSpec& spec,
                                        absl::string_view input,
                                        std::string* output,
                                        const RunOptions& options) = 0;

  // Run() without blocking: `done` runs once with Run()'s result. `input`,
  // `output` and options.output_place stay valid until then.
  virtual void RunAsync(
      const Membership& membership, uint64_t sequence,
      const CollectiveSpec& spec, absl::string_view input, std::string* output,
      const RunOptions& options,
      std::function<void(absl::StatusOr<RunResult>)> done) = 0;

  // Whether RunAsync() sends a call without first waiting to connect to the
  // coordinator.
  virtual bool SendsWithoutWaiting() = 0;

  // Returns OK when RunOnDevice() can run `spec` on `input` and `output` in
  // memory of `device`; INVALID_ARGUMENT or UNIMPLEMENTED otherwise. Reads
  // no memory.
  virtual absl::Status CheckDeviceMemory(const Membership& membership,
                                         const CollectiveSpec& spec,
                                         const Device& device,
                                         const void* input,
                                         const void* output) const = 0;

  // Run() on buffers in the memory of the call's device (Cuda(n)); returns
  // once the output is complete. Codes as Run(), and the device's errors.
  virtual absl::StatusOr<RunResult> RunOnDevice(const Membership& membership,
                                                uint64_t sequence,
                                                const CollectiveSpec& spec,
                                                const void* input, void* output,
                                                const RunOptions& options) = 0;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_LOCAL_CALL_RUNTIME_H_
