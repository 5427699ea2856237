// LocalApiService: the worker daemon's API for applications
// (chorus.v1.WorkerLocal). An application joins a group as one rank through
// the daemon and issues collectives by sequence number; the daemon runs them
// with its WorkerRuntime. Collective carries a call's tensors in one message
// each way; CollectiveChunked streams them in pieces (ChunkedCallReactor);
// with shared_input/shared_output it reads and writes them in place in a
// region of shared memory (SharedRegions) made by OpenSharedRegion; the
// call socket (LocalCallSocket) carries Collective's calls as plain frames
// through RunCall(); a rank that embeds the runtime runs its blocking calls
// on its own memory, on its own thread, through RunInPlace(). All go
// through PrepareCall() and StartCall(), the one way a local collective
// runs. A join holds no thread while its group assembles
// (WorkerRuntime::JoinAsync), and a collective none while the coordinator
// matches it (WorkerRuntime::RunAsync). gRPC's callback threads never block:
// a call that may wait to take its number or to connect does that on a task
// thread. Every call is checked first with CheckLocalCaller.
//
// Lifecycle: constructed before the runtime's server starts (it is one of
// its services) and bound to the runtime with Bind(); Drain() waits for the
// calls in flight. Thread safety: all methods are thread-safe.
#ifndef CHORUS_SERVER_WORKER_LOCAL_API_SERVICE_H_
#define CHORUS_SERVER_WORKER_LOCAL_API_SERVICE_H_

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
#include "chorus/v1/worker.grpc.pb.h"
#include "server/common/burst_memory.h"
#include "server/common/collective.h"
#include "server/worker/call_ledger.h"
#include "server/worker/shared_regions.h"
#include "server/worker/task_runner.h"
#include "server/worker/worker_runtime.h"

namespace chorus {

// The largest input or output of one CollectiveChunked call unless the
// daemon says otherwise (--max_tensor_bytes): 4 GiB.
inline constexpr uint64_t kDefaultMaxTensorBytes = uint64_t{4} << 30;

// The largest piece of a tensor in one CollectiveChunked message: 4 MiB.
inline constexpr uint64_t kMaxPieceBytes = uint64_t{4} << 20;

// The caller's own memory, for a call of a caller in this process (a rank
// that embeds the runtime): the call reads its input from `input` and
// writes its output (OutputBytes() of it) into `output`, in place, with no
// copy into a message or a shared region. Both stay valid and untouched by
// the caller until the call's done ran.
struct CallerMemory {
  absl::string_view input;
  absl::Span<char> output;
};

// One collective call checked against the daemon's memberships, ready to run.
struct LocalCall {
  WorkerRuntime* runtime = nullptr;  // not owned
  // Shared with the daemon's record of the rank: never copied per call.
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
  // shared_output, in no region, and the ledger keeps no copy of it.
  bool in_place = false;
  // Run on the starting thread, which then waits for the call's end
  // (WorkerRuntime::Run: a lone caller reads its own reply from the
  // coordinator, with no hand-off between threads), not with RunAsync.
  bool wait_here = false;
  // CheckSizes() passed for this input: StartCall() need not check again.
  bool checked = false;
};

// Takes a finished call's output for its retries (CallLedger::Keep); called
// once, when the reply went out. Null where the call did not run here (a
// refusal, or a retry answered from the ledger).
using KeepOutput = std::function<void(std::string output)>;
// How StartCall() ends: the call's result and its KeepOutput.
using CallDone =
    std::function<void(absl::StatusOr<RunResult> result, KeepOutput keep)>;

// Who may use the local API, which runs collectives as any rank: callers on
// the worker's Unix socket; over TCP, with TLS on, a client or admin
// certificate, and without TLS only a loopback caller. Returns OK, or
// PERMISSION_DENIED / UNAUTHENTICATED saying what the caller lacks.
absl::Status CheckLocalCaller(const grpc::CallbackServerContext& context);

// Writes the plan `result` ran with into `plan`.
void ToPlanProto(const RunResult& result, v1::Plan* plan);

class LocalApiService final : public v1::WorkerLocal::CallbackService {
 public:
  // `max_tensor_bytes` bounds the input and the output of a
  // CollectiveChunked or shared-memory call; `max_shared_bytes` the shared
  // regions held at once (0: none).
  explicit LocalApiService(uint64_t max_tensor_bytes = kDefaultMaxTensorBytes,
                           uint64_t max_shared_bytes = kDefaultMaxSharedBytes);

  // Sets the runtime calls run on (not owned). Calls before Bind() get
  // UNAVAILABLE.
  void Bind(WorkerRuntime* runtime);

  // Waits for the calls in flight to end.
  void Drain();

  // From now on a hold that ends is not reported (the daemon is stopping:
  // its deregistration tells the coordinator). Call before the runtime's
  // Shutdown().
  void BeginShutdown();

  grpc::ServerUnaryReactor* JoinGroup(grpc::CallbackServerContext* context,
                                      const v1::LocalJoinRequest* request,
                                      v1::LocalJoinResponse* response) override;
  grpc::ServerUnaryReactor* Collective(
      grpc::CallbackServerContext* context,
      const v1::LocalCollectiveRequest* request,
      v1::LocalCollectiveResponse* response) override;
  grpc::ServerBidiReactor<v1::LocalChunkedRequest, v1::LocalChunkedResponse>*
  CollectiveChunked(grpc::CallbackServerContext* context) override;
  grpc::ServerReadReactor<v1::MembershipHold>* HoldMembership(
      grpc::CallbackServerContext* context,
      v1::MembershipHoldReply* reply) override;
  grpc::ServerUnaryReactor* OpenSharedRegion(
      grpc::CallbackServerContext* context,
      const v1::SharedRegionRequest* request,
      v1::SharedRegion* response) override;
  grpc::ServerUnaryReactor* ReleaseSharedRegion(
      grpc::CallbackServerContext* context,
      const v1::SharedRegionRelease* request,
      v1::SharedRegionReleased* response) override;

  // Returns the membership this daemon joined as `rank` of `group` at
  // `epoch`; UNAVAILABLE before Bind(), FAILED_PRECONDITION when it has not
  // joined it (or at another epoch).
  absl::StatusOr<Membership> FindMembership(const std::string& group,
                                            uint64_t epoch, int rank) const;

  // Reports on a task thread that `membership`'s rank is gone (`why`), so
  // that the coordinator aborts its group epoch; does nothing after
  // BeginShutdown().
  void ReportRankGone(const Membership& membership, absl::Status why);

  // Forgets `membership` (its rank left: its hold was released or ended),
  // so that a daemon serving many groups over time keeps only the live
  // ones, and drops its shared regions; later calls on it get
  // FAILED_PRECONDITION ("join first"). Does nothing to the membership when
  // the rank joined again at another epoch meanwhile.
  void Forget(const Membership& membership);

  // This worker's name, for messages ("" before Bind()).
  std::string WorkerName() const;

  // Looks up the membership `request` names and reads its spec and options
  // (all but `data`). Returns the call, UNAVAILABLE before Bind(), or
  // FAILED_PRECONDITION when this daemon has not joined the group as that
  // rank or the epoch is not the one it joined at. Takes no sequence number.
  absl::StatusOr<LocalCall> PrepareCall(
      const v1::LocalCollectiveRequest& request) const;

  // Returns the input of `call`: the request's data, or for a call on
  // shared memory (shared_input and shared_output set) the input in place,
  // after finding its regions and setting call->input_region,
  // output_region and shared_output. Codes, none of which
  // takes a number: FAILED_PRECONDITION for a region the rank does not
  // hold; INVALID_ARGUMENT for only one of the two set, `data` as well, a
  // range past a region's end, or room for less than the output.
  absl::StatusOr<absl::string_view> PrepareInput(
      const v1::LocalCollectiveRequest& request, LocalCall* call) const;

  // Checks what a call of `input_bytes` bytes of input can be checked for
  // before its input arrives: ValidateCall's INVALID_ARGUMENT (the messages
  // Collective gives), then RESOURCE_EXHAUSTED when the input or the output
  // is over max_tensor_bytes. Returns OK otherwise.
  absl::Status CheckSizes(const LocalCall& call, uint64_t input_bytes) const;

  // Runs `call` on `input` with WorkerRuntime::RunAsync (sent from the
  // calling thread, or from a task thread when it may have to wait first),
  // with the time left before `context`'s deadline, writing this
  // rank's output to `output`; then calls `done` with WorkerRuntime::Run()'s
  // result and a KeepOutput, on a thread of the daemon's that must not
  // block. The call first checks its input unless call.checked says that
  // was done (INVALID_ARGUMENT as ValidateCall) and takes its sequence number
  // (CallLedger::Use's codes: a number used twice, skipped or from the future);
  // a failure after that carries an ErrorDetail with number_used set. A retry
  // of a call that took its number gets the first attempt's outcome without
  // running again (and a null KeepOutput). `input` and `output` must stay valid
  // until `done` runs; the caller hands the output to the KeepOutput once
  // the reply is sent. A call on shared memory (call.output_region set)
  // writes its output into call.shared_output once the collective
  // completed and leaves `output` empty; so does a call on its caller's
  // memory (call.in_place), whose `output` may be null.
  void StartCall(LocalCall call, const grpc::CallbackServerContext& context,
                 absl::string_view input, std::string* output, CallDone done);
  // As above, with the call's deadline given.
  void StartCall(LocalCall call, absl::Time deadline, absl::string_view input,
                 std::string* output, CallDone done);

  // How RunCall() ends: the call's status, the response (its data, sequence
  // and plan when OK), and a KeepOutput (may be null) to hand the
  // response's data to once the reply went out.
  using LocalCallDone = std::function<void(
      const absl::Status& status, v1::LocalCollectiveResponse& response,
      KeepOutput keep)>;

  // Runs `request` as Collective does, for a caller that is not gRPC's (the
  // call socket, whose permissions stand for CheckLocalCaller), with
  // `deadline`; `done` runs once, on a thread of the daemon's that must
  // not block, possibly before this returns. Codes as Collective's.
  void RunCall(v1::LocalCollectiveRequest request, absl::Time deadline,
               LocalCallDone done);

  // Runs `request` for a caller in this process (a blocking call of a rank
  // that embeds the runtime) on that caller's own memory, on this thread:
  // returns once the call ended, having waited for its number and a
  // connection to the coordinator first where it must (as
  // LocalCall::wait_here says). The call reads its input from
  // memory.input and writes its output into memory.output, with no copy
  // into a message or a shared region. Returns the plan it ran with, or
  // Collective's codes; besides, before the call takes its number:
  // INVALID_ARGUMENT for a request that carries data or shared buffers or
  // an output too small for the call, RESOURCE_EXHAUSTED for an input or
  // output over --max_tensor_bytes. A retry of its number is refused with
  // FAILED_PRECONDITION: the output is not kept for one.
  absl::StatusOr<RunResult> RunInPlace(
      const v1::LocalCollectiveRequest& request, absl::Time deadline,
      const CallerMemory& memory);

  // How StartInPlace() ends: the plan the call ran with, or its status.
  using InPlaceDone = std::function<void(absl::StatusOr<RunResult> result)>;

  // RunInPlace() without waiting (an asynchronous call of a rank that
  // embeds the runtime): the call runs on the daemon's threads, and `done`
  // runs once with RunInPlace()'s result (same codes), on a thread of the
  // daemon's that must not block, possibly before this returns. `memory`
  // must stay valid, and its output untouched by the caller, until `done`
  // ran.
  void StartInPlace(const v1::LocalCollectiveRequest& request,
                    absl::Time deadline, const CallerMemory& memory,
                    InPlaceDone done);

  // The call socket JoinGroup announces ("" for none, the default).
  void SetCallSocket(std::string path);

 private:
  // A call StartCall() handed to the runtime, until its end.
  struct RunningCall {
    LocalCall call;
    // The output of a call on shared memory, before it goes in place.
    std::string scratch;
    CallDone done;
  };

  WorkerRuntime* runtime() const;
  // PrepareCall(), PrepareInput() and, for a call on shared memory,
  // CheckSizes(): a call whose input comes in its message (or in place),
  // with the input in `input`. Their codes.
  absl::StatusOr<LocalCall> PrepareMessageCall(
      const v1::LocalCollectiveRequest& request,
      absl::string_view* input) const;
  // PrepareCall() and CheckSizes() of a call on `memory` (RunInPlace). Their
  // codes, and INVALID_ARGUMENT for a request with data or shared buffers or an
  // output too small.
  absl::StatusOr<LocalCall> PrepareInPlaceCall(
      const v1::LocalCollectiveRequest& request,
      const CallerMemory& memory) const;
  // RunInPlace() (`wait_here`) and StartInPlace(): `done` runs once with
  // the call's result.
  void InPlace(const v1::LocalCollectiveRequest& request, absl::Time deadline,
               const CallerMemory& memory, bool wait_here, InPlaceDone done);
  // Ends `running` with the runtime's result `ran`: records its outcome
  // for retries (through the KeepOutput) and calls its `done`.
  void EndCall(RunningCall& running, absl::StatusOr<RunResult> ran);

  const uint64_t max_tensor_bytes_;
  mutable absl::Mutex mu_;
  WorkerRuntime* runtime_ ABSL_GUARDED_BY(mu_) = nullptr;  // not owned
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  std::string call_socket_ ABSL_GUARDED_BY(mu_);
  // (group, rank) -> membership.
  absl::flat_hash_map<std::pair<std::string, int>,
                      std::shared_ptr<const Membership>>
      memberships_ ABSL_GUARDED_BY(mu_);
  // The sequence numbers each joined rank has used.
  CallLedger ledger_;
  SharedRegions regions_;
  TaskRunner tasks_;
  // StartCall()s whose `done` has not returned yet.
  absl::Mutex calls_mu_;
  int calls_running_ ABSL_GUARDED_BY(calls_mu_) = 0;
  // Counts the joins and collectives alive, to give the memory of a burst
  // of 1,000 or more back.
  BurstMemory burst_memory_;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_LOCAL_API_SERVICE_H_
