// LocalCalls: the worker's local-call core. Applications on the worker's
// host (through its gRPC local API or its call socket) and ranks in the
// worker's own process (embedded C++ and Python ranks, through the
// in-process door) join groups and run collectives here; every way in gets
// the same checks, sequence numbers, retries, codes and ErrorDetails.
//
// It owns what a local rank is: the memberships joined through it, the call
// ledger (CallLedger: numbers used, skipped, retried), the shared regions
// of each rank (SharedRegions), and the task threads for calls that may
// wait before they are sent. It runs calls on a CallRuntime (the
// WorkerRuntime, or a fake in tests) and never includes gRPC: its doors
// (local_api_service.h, call_socket.h, in_process_door.h) authenticate,
// translate, call it once and translate back.
//
// A join holds no thread while its group assembles, and a collective none
// while the coordinator matches it; a call that may wait to take its number
// (a lower one still to come) or to connect does that on a task thread, so
// a door's thread never blocks unless its caller waits for the call anyway
// (RunInPlace, RunOnDevice).
//
// Lifecycle: made before the runtime (the runtime serves its gRPC door),
// then Bind() to it; calls before Bind() get UNAVAILABLE. BeginShutdown()
// before the runtime's Shutdown(), then Drain() waits for the calls in
// flight. Thread safety: all methods are thread-safe.
#ifndef CHORUS_SERVER_WORKER_LOCAL_LOCAL_CALLS_H_
#define CHORUS_SERVER_WORKER_LOCAL_LOCAL_CALLS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "chorus/types.h"
#include "chorus/v1/worker.pb.h"
#include "common/burst_memory.h"
#include "server/worker/local/call_ledger.h"
#include "server/worker/local/call_runtime.h"
#include "server/worker/local/shared_regions.h"
#include "server/worker/membership.h"
#include "server/worker/task_runner.h"

namespace chorus {

// The largest input or output of one call on shared memory or streamed in
// pieces unless the worker says otherwise (--max_tensor_bytes): 4 GiB.
inline constexpr uint64_t kDefaultMaxTensorBytes = uint64_t{4} << 30;

// The largest piece of a tensor in one CollectiveChunked message: 4 MiB.
inline constexpr uint64_t kMaxPieceBytes = uint64_t{4} << 20;

// The caller's own memory, for a call of a caller in this process (a rank
// that embeds the runtime): the call reads its input from `input` and
// writes its output (OutputBytes() of it) into `output`, in place, with no
// copy into a message or a shared region. Both stay valid and untouched by
// the caller until the call ended.
struct CallerMemory {
  absl::string_view input;
  absl::Span<char> output;
};

// One collective call checked against the memberships, ready to run.
struct LocalCall {
  CallRuntime* runtime = nullptr;  // not owned
  // Shared with the record of the rank: never copied per call.
  std::shared_ptr<const Membership> membership;
  CollectiveSpec spec;
  RunOptions options;
  uint64_t sequence = 0;
  // A call on shared memory: the regions its input and output are in
  // (kept mapped while it runs) and its output's place there, at least
  // OutputBytes() long. Null for a call whose data travels in messages.
  std::shared_ptr<SharedRegion> input_region;
  std::shared_ptr<SharedRegion> output_region;
  absl::Span<char> shared_output;
  // A call on its caller's memory (CallerMemory): its output goes to
  // shared_output, in no region.
  bool in_place = false;
  // The output belongs to a caller in this process: the ledger keeps no
  // copy of it, and a retry of the number is refused.
  bool keeps_no_output = false;
  // A call on device memory (RunOnDevice): its buffers.
  const void* device_input = nullptr;
  void* device_output = nullptr;
  bool on_device = false;
  // Run on the starting thread, which then waits for the call's end
  // (CallRuntime::Run: a lone caller reads its own reply, with no hand-off
  // between threads), not with RunAsync.
  bool wait_here = false;
  // The input's sizes were checked already: the run need not check again.
  bool checked = false;
};

// Takes a finished call's output for its retries (CallLedger::Keep); called
// once, when the reply went out. Null where the call did not run here (a
// refusal, or a retry answered from the ledger) and where it keeps no
// output (keeps_no_output: its outcome is kept as it ends).
using KeepOutput = std::function<void(std::string output)>;
// How a call ends: its result and its KeepOutput.
using CallDone =
    std::function<void(absl::StatusOr<RunResult> result, KeepOutput keep)>;
// How a call on its caller's memory ends: its plan, or its status.
using InPlaceDone = std::function<void(absl::StatusOr<RunResult> result)>;

// A rank joined through the core: its membership, and the call socket
// the worker serves ("" for none).
struct JoinedRank {
  Membership membership;
  std::string call_socket;
};
using JoinDone = std::function<void(absl::StatusOr<JoinedRank> joined)>;

// Writes the plan `result` ran with into `plan`.
void ToPlanProto(const RunResult& result, v1::Plan* plan);

// Writes `membership` (its rank, world, epoch, devices and bounds) and the
// worker's `call_socket` into `response`.
void ToJoinResponse(const Membership& membership,
                    const std::string& call_socket,
                    v1::LocalJoinResponse* response);

class LocalCalls {
 public:
  // `max_tensor_bytes` bounds the input and the output of a streamed or
  // shared-memory call; `max_shared_bytes` the shared regions held at once
  // (0: none).
  explicit LocalCalls(uint64_t max_tensor_bytes = kDefaultMaxTensorBytes,
                      uint64_t max_shared_bytes = kDefaultMaxSharedBytes);
  ~LocalCalls();
  LocalCalls(const LocalCalls&) = delete;
  LocalCalls& operator=(const LocalCalls&) = delete;

  // Sets the runtime calls run on (not owned; outlives the calls).
  void Bind(CallRuntime* runtime);
  // The call socket a join announces ("" for none, the default).
  void SetCallSocket(std::string path);
  // From now on a rank whose client went away is not reported (the worker is
  // stopping: its deregistration tells the coordinator), and calls waiting
  // for their number end with UNAVAILABLE.
  void BeginShutdown();
  // Waits for the calls in flight to end.
  void Drain();
  // This worker's name, for messages ("" before Bind()).
  std::string WorkerName() const;
  // Where doors count the joins and calls they keep alive, from receipt
  // until they released them (gRPC frees a call's memory some time after
  // its reply), so that the memory of a burst of them goes back to the
  // system (burst_memory.h).
  BurstMemory* burst_memory() { return &burst_memory_; }

  // Joins as `args` says within `timeout`, holding no thread while the
  // group assembles; `done` runs once, on a thread that must not block,
  // with the rank (now known to the core) or CallRuntime::JoinAsync's
  // codes, UNAVAILABLE before Bind(). A rank that follows its elastic group
  // into the next epoch leaves its membership of the old one behind.
  void Join(const JoinArgs& args, absl::Duration timeout, JoinDone done);

  // Returns the membership joined as `rank` of `group` at `epoch`;
  // UNAVAILABLE before Bind(), FAILED_PRECONDITION when there is none (or at
  // another epoch).
  absl::StatusOr<Membership> FindMembership(const std::string& group,
                                            uint64_t epoch, int rank) const;

  // A hold on `membership` ended (WorkerLocal.HoldMembership): its rank left
  // on purpose when `released`, else its client process went away (`peer`
  // names it), which is reported to the coordinator (on a task thread) so
  // that it aborts the group epoch; a rank of an elastic group that left on
  // purpose is reported leaving, so that the others go on at once. Either
  // way the rank is forgotten.
  void EndHold(const Membership& membership, bool released,
               absl::string_view peer);

  // The caller of a join that succeeded went away before it took the answer
  // (its join RPC cancelled: a rank of a forming group killed while the
  // others joined, or a newcomer admitted before its withdrawal reached the
  // coordinator): no hold will ever name the rank, so it is reported gone at
  // once, as when a hold ends unreleased (the others get MEMBERSHIP_CHANGED
  // or the group's abort rather than waiting out a deadline for it), and
  // forgotten. `peer` names the caller.
  void JoinUnanswered(const Membership& membership, absl::string_view peer);

  // Forgets `membership` (its rank left), its numbers and its shared
  // regions; later calls on it get FAILED_PRECONDITION ("join first").
  // Nothing happens when the rank joined again at another epoch meanwhile.
  void Forget(const Membership& membership);

  // Makes a shared region of `bytes` for that rank. Returns it, or
  // FindMembership()'s codes, SharedRegions::Open's, and
  // FAILED_PRECONDITION when the rank left meanwhile.
  absl::StatusOr<std::shared_ptr<SharedRegion>> OpenRegion(
      const std::string& group, uint64_t epoch, int rank, uint64_t bytes);
  // Drops region `id` of that rank: OK, FindMembership()'s codes, NOT_FOUND.
  absl::Status ReleaseRegion(const std::string& group, uint64_t epoch, int rank,
                             uint64_t id);

  // Runs `request` (WorkerLocal.Collective: its data in the message, or in
  // shared regions) within `deadline`, filling `response` (its data, and
  // when OK its sequence, plan, the newcomers waiting and the next
  // membership a sync admitted them into); `done` runs once with the result
  // and a
  // KeepOutput to hand the response's data to once the reply went out, on
  // a thread that must not block, possibly before this returns. `request`
  // and `response` stay valid until then. Codes: UNAVAILABLE before Bind();
  // FAILED_PRECONDITION for a rank not joined (or a stale epoch) or a
  // region it does not hold; INVALID_ARGUMENT for a malformed call
  // (ValidateCall), shared buffers half set, past a region's end or too
  // small; RESOURCE_EXHAUSTED over max_tensor_bytes; CallLedger::Use's
  // codes (none of the above takes the number); then the runtime's, with an
  // ErrorDetail whose number_used is set. A retry of a number gets the
  // first attempt's outcome without running again.
  void Run(const v1::LocalCollectiveRequest& request, absl::Time deadline,
           v1::LocalCollectiveResponse* response, CallDone done);

  // Checks a call whose `input_bytes` of input will arrive in pieces
  // (WorkerLocal.CollectiveChunked) before any of it arrives. Returns the
  // call for RunPrepared(), or Run()'s codes before the number, and
  // INVALID_ARGUMENT for a call that carries data or shared buffers.
  absl::StatusOr<LocalCall> PrepareStreamed(
      const v1::LocalCollectiveRequest& request, uint64_t input_bytes) const;
  // Runs a call PrepareStreamed() returned on `input`, writing `output`;
  // `done` as Run()'s. `input` and `output` stay valid until `done` ran.
  void RunPrepared(LocalCall call, absl::Time deadline, absl::string_view input,
                   std::string* output, CallDone done);

  // Runs `request` for a caller in this process on its own memory, on this
  // thread: returns once the call ended, having waited for its number and a
  // connection to the coordinator first where it must. Returns the plan it
  // ran with, or Run()'s codes; besides, before the call takes its number:
  // INVALID_ARGUMENT for a request that carries data or shared buffers or
  // an output too small, RESOURCE_EXHAUSTED over max_tensor_bytes. A retry
  // of its number is refused with FAILED_PRECONDITION: no output is kept.
  absl::StatusOr<RunResult> RunInPlace(
      const v1::LocalCollectiveRequest& request, absl::Time deadline,
      const CallerMemory& memory);
  // RunInPlace() for an output of any size: the call writes it into
  // `*output` (a C++ rank's string). Codes as RunInPlace().
  absl::StatusOr<RunResult> RunHere(const v1::LocalCollectiveRequest& request,
                                    absl::Time deadline,
                                    absl::string_view input,
                                    std::string* output);
  // RunInPlace() without waiting: `done` runs once with its result, on a
  // thread that must not block, possibly before this returns. `memory`
  // stays valid, and its output untouched, until then.
  void StartInPlace(const v1::LocalCollectiveRequest& request,
                    absl::Time deadline, const CallerMemory& memory,
                    InPlaceDone done);

  // What a sync that ended with `result` returns as its output
  // (worker.proto's SyncOutcome): the newcomers waiting and, where it
  // admitted some, the rank's membership of the next epoch.
  v1::SyncOutcome SyncOutcomeOf(const RunResult& result) const;

  // Runs `request` on buffers in the memory of its device (Cuda(n)), on this
  // thread: `input` holds InputBytes() and `output` gets OutputBytes() (null
  // where that is 0), read after the work on the caller's `stream`
  // (RunOptions::stream; null: ready). Codes as RunInPlace(), and
  // CallRuntime::CheckDeviceMemory's and RunOnDevice's.
  absl::StatusOr<RunResult> RunOnDevice(
      const v1::LocalCollectiveRequest& request, absl::Time deadline,
      const void* input, void* output, void* stream = nullptr);
  // RunOnDevice() without waiting: the call runs on a task thread (the
  // device's staging waits there, never on the caller's), and `done` runs
  // once with its result, possibly before this returns (a refusal). The
  // buffers stay valid until then; with a `stream`, the output is complete
  // in that stream's order (the stream was made to wait for it).
  void StartOnDevice(const v1::LocalCollectiveRequest& request,
                     absl::Time deadline, const void* input, void* output,
                     void* stream, InPlaceDone done);

 private:
  // A call handed to the runtime, until its end.
  struct RunningCall;

  CallRuntime* runtime() const;
  // Reports the rank of `membership` gone (`leaving`: it left on purpose)
  // to the coordinator on a task thread, logging the verdict.
  void ReportGone(const Membership& membership, absl::Status why, bool leaving);
  // Records `membership` as the rank's current one; returns the call socket
  // to announce.
  std::string Remember(const Membership& membership);
  // The call socket to announce.
  std::string CallSocket() const;
  // Looks up the membership `request` names and reads its spec and options.
  // Codes: UNAVAILABLE, FAILED_PRECONDITION. Takes no number.
  absl::StatusOr<LocalCall> PrepareCall(
      const v1::LocalCollectiveRequest& request) const;
  // The input of a call whose data is in its message or in shared regions
  // (setting the call's regions), with the sizes of a shared call checked.
  absl::StatusOr<absl::string_view> PrepareInput(
      const v1::LocalCollectiveRequest& request, LocalCall* call) const;
  // INVALID_ARGUMENT for a call on its caller's memory that carries data or
  // shared buffers.
  static absl::Status CheckNoPayload(const v1::LocalCollectiveRequest& request);
  // PrepareCall() and the checks of a call on device memory (RunOnDevice).
  absl::StatusOr<LocalCall> PrepareOnDevice(
      const v1::LocalCollectiveRequest& request, const void* input,
      void* output, void* stream) const;
  // PrepareCall() and the checks of a call on its caller's memory.
  absl::StatusOr<LocalCall> PrepareInPlace(
      const v1::LocalCollectiveRequest& request, absl::string_view input,
      uint64_t output_room) const;
  // ValidateCall's INVALID_ARGUMENT, then RESOURCE_EXHAUSTED over
  // max_tensor_bytes.
  absl::Status CheckSizes(const LocalCall& call, uint64_t input_bytes) const;
  // Starts `call` on `input`: on this thread, or on a task thread when it
  // may wait for its number or the coordinator (unless call.wait_here).
  void StartCall(LocalCall call, absl::Time deadline, absl::string_view input,
                 std::string* output, CallDone done);
  // Takes the call's number and runs it (or answers its retry).
  void TakeNumberAndRun(LocalCall call, absl::Time deadline,
                        absl::string_view input, std::string* output,
                        CallDone done);
  // Answers a retry of a number whose first attempt ended with `first`.
  static void AnswerRetry(const LocalCall& call, const CallOutcome& first,
                          std::string* output, const CallDone& done);
  // Hands a call that took its number to the runtime.
  void Launch(LocalCall call, absl::Time deadline, absl::string_view input,
              std::string* output, CallDone done);
  // Ends `running` with the runtime's result `ran`: records its outcome for
  // retries (through the KeepOutput) and calls its `done`.
  void EndCall(RunningCall& running, absl::StatusOr<RunResult> ran);
  // Runs a call of a caller in this process on this thread and returns its
  // result.
  absl::StatusOr<RunResult> RunOnThisThread(LocalCall call, absl::Time deadline,
                                            absl::string_view input,
                                            std::string* output);
  // RunInPlace() (`wait_here`) and StartInPlace().
  void InPlace(const v1::LocalCollectiveRequest& request, absl::Time deadline,
               const CallerMemory& memory, bool wait_here, InPlaceDone done);

  const uint64_t max_tensor_bytes_;
  mutable absl::Mutex mu_;
  CallRuntime* runtime_ ABSL_GUARDED_BY(mu_) = nullptr;  // not owned
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  std::string call_socket_ ABSL_GUARDED_BY(mu_);
  // (group, rank) -> membership.
  absl::flat_hash_map<std::pair<std::string, int>,
                      std::shared_ptr<const Membership>>
      memberships_ ABSL_GUARDED_BY(mu_);
  // The sequence numbers each joined rank has used.
  CallLedger ledger_;
  SharedRegions regions_;
  // Calls that wait before they are sent, and reports of ranks gone.
  TaskRunner tasks_;
  // Calls whose `done` has not returned yet.
  absl::Mutex calls_mu_;
  int calls_running_ ABSL_GUARDED_BY(calls_mu_) = 0;
  // The joins and collectives the doors keep alive.
  BurstMemory burst_memory_;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_LOCAL_LOCAL_CALLS_H_
