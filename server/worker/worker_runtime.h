// WorkerRuntime: a Chorus worker as a library. It serves the peer data plane,
// registers its devices with the coordinator (CoordinatorSession), joins
// groups and runs collectives: it asks the coordinator to match each call
// and plan it, then takes the inline result or runs the planned algorithm
// with its peers. `chorus-worker` is a thin main around it; a program that
// cannot afford the hop to a daemon embeds it and is a worker itself.
//
// Lifecycle: Start() returns a registered runtime; Shutdown() (or the
// destructor) deregisters and stops serving.
// Thread safety: Join(), JoinAsync(), Run() and RunAsync() may be called
// concurrently from any threads; Join() and Run() block their caller until
// the call ends, JoinAsync() holds no thread while the group assembles and
// RunAsync() none while the coordinator matches the call.
#ifndef CHORUS_SERVER_WORKER_WORKER_RUNTIME_H_
#define CHORUS_SERVER_WORKER_WORKER_RUNTIME_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "common/adaptive_spin.h"
#include "common/collective.h"
#include "common/device.h"
#include "common/net.h"
#include "server/worker/algorithms/same_host_binding.h"
#include "server/worker/answered_calls.h"
#include "server/worker/call_port_client.h"
#include "server/worker/coordinator_session.h"
#include "server/worker/dataplane/inbox.h"
#include "server/worker/dataplane/peer_sender.h"
#include "server/worker/dataplane/peer_service.h"
#include "server/worker/dataplane/tcp_listener.h"
#include "server/worker/device_discovery.h"
#include "server/worker/gpu/device_buffers.h"
#include "server/worker/gpu/nccl_calls.h"
#include "server/worker/local/call_runtime.h"
#include "server/worker/membership.h"
#include "server/worker/repeat_asks.h"
#include "server/worker/task_runner.h"

namespace grpc {
class Service;
}  // namespace grpc

namespace chorus {

struct AlgorithmArgs;
struct PeerTransportOptions;

struct RuntimeOptions {
  // Coordinator address, "host:port".
  std::string coordinator;
  // Where the peer data plane (and any extra services) listen. A loopback
  // address with the coordinator on another host is refused (peers there
  // could not reach this worker).
  std::string listen = "127.0.0.1:0";
  // Address peers use, "host:port" or just "host" (then with the bound
  // port); default: the listen host and the bound port, or, listening on
  // every interface (0.0.0.0, ::), the local address of this host's route
  // to the coordinator (this machine's hostname when the coordinator is on
  // a loopback address). The choice is logged at startup.
  std::string advertise_address;
  // Port of the TCP data-plane listener on the listen host; 0 picks one.
  int data_port = 0;
  // Stable worker name; default: the advertised address.
  std::string name;
  // Devices to register; empty registers every discovered device.
  std::vector<Device> devices;
  // Collective calls, commits and failure reports go to the coordinator's
  // call port (plain TCP frames, CallPortClient) when it has one and it can
  // be reached; otherwise, or when false, as one unary gRPC call each.
  bool call_port = true;
  // Each rank hashes the output of all_reduce, all_gather and broadcast
  // under data-plane plans as it writes it, and the coordinator compares the
  // hashes at the commit: a difference is DATA_LOSS on every rank. Off by
  // default: it costs a pass over the output (see --check_results).
  bool check_results = false;
  absl::Duration rpc_timeout = absl::Seconds(5);
  absl::Duration register_timeout = absl::Seconds(30);
  // Extra services served next to the data plane (not owned; must outlive
  // the runtime), e.g. the daemon's local API.
  std::vector<grpc::Service*> extra_services;
  // Their full names, which the health service reports SERVING.
  std::vector<std::string> extra_service_names;
  // When set, the server also listens on this Unix domain socket (its owner
  // readies it and keeps it private: local/local_worker.h).
  std::string unix_socket_path;
  // Where GPU memory, streams and kernels come from (not owned; must
  // outlive the runtime); null: this build's (CUDA's, or none). Tests pass
  // an EmulatedDeviceRuntime, whose GPUs are then the ones discovered.
  DeviceRuntime* device_runtime = nullptr;
  // How long a thread waiting for a peer's data, or for the coordinator's
  // reply, polls before it blocks (AdaptiveSpin; zero: never).
  absl::Duration spin = kDefaultSpin;
  // A same-host all-reduce of a shape the coordinator already planned
  // same_host in the group epoch runs again on the segments kept from that
  // call, the ranks agreeing through shared memory without asking the
  // coordinator (algorithms/same_host_binding.h). Not with check_results.
  bool bound_same_host = true;
};

class WorkerRuntime final : public CallRuntime {
 public:
  // Starts serving and registers. Returns UNIMPLEMENTED (the device refusal
  // message) for a device this worker cannot serve, INVALID_ARGUMENT for a
  // bad option, UNAVAILABLE when the address cannot be bound, and
  // DEADLINE_EXCEEDED when the coordinator could not be reached within
  // register_timeout.
  static absl::StatusOr<std::unique_ptr<WorkerRuntime>> Start(
      RuntimeOptions options);

  // The two halves of Start(), for a daemon that must be able to stop while
  // it still waits for the coordinator: Create() starts serving (codes as
  // Start() but DEADLINE_EXCEEDED), Register() registers (codes as
  // CoordinatorSession::Start(): CANCELLED after RequestStop()).
  static absl::StatusOr<std::unique_ptr<WorkerRuntime>> Create(
      RuntimeOptions options);
  absl::Status Register();

  ~WorkerRuntime();
  WorkerRuntime(const WorkerRuntime&) = delete;
  WorkerRuntime& operator=(const WorkerRuntime&) = delete;

  // Joins `group` as `rank` on `device`; returns once every rank joined.
  // Codes as Coordinator.JoinGroup (INVALID_ARGUMENT, UNIMPLEMENTED,
  // DEADLINE_EXCEEDED naming missing ranks, UNAVAILABLE). A join whose
  // connection to the coordinator broke before an answer, or that the
  // coordinator refused for a worker id it does not know (it restarted), is
  // sent once more after a heartbeat checked the registration (registering
  // again if need be), under the id the worker holds then and the same
  // request id, so it is not counted twice.
  absl::StatusOr<Membership> Join(const std::string& group, int world_size,
                                  int rank, const Device& device,
                                  absl::Duration timeout);

  // Join() without blocking: returns at once and runs `done` once with
  // Join()'s result, on a gRPC thread or the coordinator session's heartbeat
  // thread (on the caller's when the worker is shutting down: UNAVAILABLE).
  // `done` must not block. No thread waits while the group assembles, so any
  // number of joins may be pending.
  void JoinAsync(const std::string& group, int world_size, int rank,
                 const Device& device, absl::Duration timeout,
                 std::function<void(absl::StatusOr<Membership>)> done);
  // As above, for any join (elastic bounds, a newcomer, a follower).
  void JoinAsync(const JoinArgs& args, absl::Duration timeout,
                 std::function<void(absl::StatusOr<Membership>)> done) override;

  // Reports that `membership`'s rank is gone (its client process went
  // away, `why`) so that the coordinator aborts the group epoch at once.
  // Returns the group's verdict (ABORTED); `why` with the reason appended
  // when the coordinator could not be told (within the RPC timeout); the
  // coordinator's NOT_FOUND / FAILED_PRECONDITION for a group or epoch it
  // no longer has.
  absl::Status ReportRankGone(const Membership& membership,
                              const absl::Status& why,
                              bool leaving = false) override;
  // Frees the rank's NCCL communicator, if it has one.
  void RankEnded(const Membership& membership) override;

  // Runs the `sequence`-th collective of `membership` (numbered from 1 in
  // the order the rank issues them) on `input`, writing this rank's output.
  // Returns INVALID_ARGUMENT for a malformed spec or input size (checked
  // before anything is sent), or the coordinator's verdict
  // (INVALID_ARGUMENT mismatch, UNIMPLEMENTED / FAILED_PRECONDITION refusal,
  // DEADLINE_EXCEEDED, ABORTED), or a data-plane error.
  absl::StatusOr<RunResult> Run(const Membership& membership, uint64_t sequence,
                                const CollectiveSpec& spec,
                                absl::string_view input, std::string* output,
                                const RunOptions& options) override;

  // Run() without blocking: returns at once and runs `done` once with Run()'s
  // result (same codes). `input`, `output` and the options' output_place
  // must stay valid until then. No thread waits while the coordinator
  // matches the call (any number may wait for other ranks); a planned call
  // then runs its data plane on a thread of the runtime's. `done` runs on a
  // thread of the runtime (or the caller's, for a call refused before it
  // was sent) and must not block.
  void RunAsync(const Membership& membership, uint64_t sequence,
                const CollectiveSpec& spec, absl::string_view input,
                std::string* output, const RunOptions& options,
                std::function<void(absl::StatusOr<RunResult>)> done) override;

  // Whether RunAsync() sends a call without first waiting to connect to the
  // coordinator's call port (it is connected, or not used).
  bool SendsWithoutWaiting() override;

  // Returns OK when RunOnDevice() can run `spec` of `membership` on
  // `input` and `output` in memory of `device`: INVALID_ARGUMENT for a
  // device other than Cuda(n), a malformed spec, or a pointer that is not
  // memory of that GPU (null is allowed only for an empty buffer);
  // UNIMPLEMENTED (the device refusal) for a device this worker did not
  // register. Reads no memory.
  absl::Status CheckDeviceMemory(const Membership& membership,
                                 const CollectiveSpec& spec,
                                 const Device& device, const void* input,
                                 const void* output) const override;

  // Like Run(), on buffers in the memory of the call's device (the
  // options' device, else the member's), which must be a Cuda(n) device
  // this worker registered: `input` holds InputBytes() and `output` gets
  // OutputBytes() of the spec (either may be null when its size is 0).
  // Whatever wrote `input` must be complete (synchronise its stream
  // first); the output is complete when this returns. all_reduce, reduce
  // and reduce_scatter reduce on that GPU; the data leaves it only to cross
  // to a peer (and, under the inline plan, to ride with the call). Codes as
  // Run(), plus INVALID_ARGUMENT for a Cpu device or a null pointer,
  // UNIMPLEMENTED for a device this worker did not register or without
  // CUDA, and the device's CUDA errors (see gpu/device_buffers.h).
  absl::StatusOr<RunResult> RunOnDevice(const Membership& membership,
                                        uint64_t sequence,
                                        const CollectiveSpec& spec,
                                        const void* input, void* output,
                                        const RunOptions& options) override;

  // Deregisters and stops serving; idempotent.
  void Shutdown();

  // Blocks until Shutdown() is requested through RequestStop().
  void WaitForStopRequest() { session_->WaitForStopRequest(); }
  void RequestStop() { session_->RequestStop(); }

  const std::string& address() const { return address_; }
  // The name this worker registered under.
  const std::string& name() const override { return name_; }
  int port() const { return port_; }
  uint64_t worker_id() const { return session_->worker_id(); }
  const std::vector<Device>& devices() const { return devices_; }

  // Test only: while set, every data-plane all_reduce, all_gather and
  // broadcast of this worker flips one bit of its result (in a piece it
  // takes from a peer and passes on to no one) before hashing it, as a
  // corrupted transfer would.
  void set_corrupt_results_for_testing(bool corrupt) {
    corrupt_results_for_testing_ = corrupt;
  }

 private:
  WorkerRuntime() = default;

  // Where a call's data is: host bytes, or memory of `device` (Cuda(n)).
  struct CallBuffers {
    absl::string_view host_input;
    std::string* host_output = nullptr;
    // RunOptions::output_place, for a host call.
    char* host_output_place = nullptr;
    const void* device_input = nullptr;
    void* device_output = nullptr;
    bool on_device = false;
    // The caller's stream for device buffers (RunOptions::stream): the
    // input is read after it, and it is ordered after the output's copy.
    void* stream = nullptr;
  };
  // A call's request to the coordinator, checked and built by PrepareCall().
  struct PreparedCall {
    absl::Time start;
    absl::Time deadline;
    Device device;
    // The input: the host bytes, or staged_input (a device input that rides
    // with the call, copied to the host).
    absl::string_view host_input;
    std::string staged_input;
    v1::CollectiveRequest request;
    // Held while the request asks for a same_host plan to repeat
    // (AskToRepeat()).
    std::shared_ptr<const void> repeat_ask;
  };
  // A JoinAsync() waiting for the coordinator's answer.
  struct PendingJoin;
  // A RunAsync() from its request until its callback returned.
  struct PendingRun;
  // The parts of Create(): the data plane (its TCP listener and sender),
  // the gRPC server, and the session with the coordinator. Return Create()'s
  // codes.
  absl::Status StartDataPlane(const RuntimeOptions& options);
  absl::Status StartServing(const RuntimeOptions& options);
  void StartSession(const RuntimeOptions& options, bool cuda_built);
  // Sends `join`'s JoinGroup (again, on a retry), or ends it with
  // UNAVAILABLE once joins are closed.
  void SendJoin(PendingJoin* join);
  // Takes the coordinator's answer to `join`: retries it once on
  // UNAVAILABLE (see Join()), else ends it.
  void OnJoinAnswered(PendingJoin* join, const grpc::Status& answer);
  // Runs `join`'s callback with `result`, forgets and deletes it.
  void EndJoin(PendingJoin* join, absl::StatusOr<Membership> result);
  // The membership of `rank` on `device` that the coordinator's `response`
  // describes, whose peers it learns. `expected_world` 0: a join that named
  // no rank, answered with the rank and the world; else the world size the
  // join named. INTERNAL for a partial group.
  absl::StatusOr<Membership> LearnMembership(
      const std::string& group, int rank, int expected_world,
      const Device& device, const v1::JoinGroupResponse& response);
  // Ends every pending join with UNAVAILABLE, refuses new ones, and waits
  // until each callback has returned.
  void CloseJoins();

  // (runtime_members.cc) Tells the sender who `member`'s worker is.
  void LearnPeerOf(const v1::GroupMember& member);
  // Asks the coordinator, as `self_rank`, for `ranks` of `group` at `epoch`
  // and learns them (peer directory and sender); returns them in that order,
  // or the coordinator's refusal (FAILED_PRECONDITION for a stale epoch) or
  // UNAVAILABLE / DEADLINE_EXCEEDED by `deadline` or the RPC timeout.
  absl::StatusOr<std::vector<PeerDirectory::RankPeer>> FetchMembers(
      const std::string& group, uint64_t epoch, int self_rank,
      const std::vector<int>& ranks, absl::Time deadline);
  // Rank `rank` of `membership`'s group: learned before, or fetched
  // (FetchMembers' codes; with several coordinators an unreachable leader
  // is asked again after the next heartbeat, until `deadline`).
  absl::StatusOr<PeerDirectory::RankPeer> ResolvePeer(
      const Membership& membership, int rank, absl::Time deadline);
  // Has the peer directory fetch the ranks of chunks that arrive from
  // members not learned yet.
  void ResolveArrivals();

  // The buffers of a host call (Run(), RunAsync()).
  static CallBuffers HostBuffers(absl::string_view input, std::string* output,
                                 const RunOptions& options);
  // Bytes of `input` for a device call: 0 when it is null and may be empty.
  static uint64_t DeviceInputBytes(const Membership& membership,
                                   const CollectiveSpec& spec,
                                   const void* input);
  absl::StatusOr<RunResult> RunCall(const Membership& membership,
                                    uint64_t sequence,
                                    const CollectiveSpec& spec,
                                    const CallBuffers& buffers,
                                    const RunOptions& options);
  // RunCall() at the coordinator: prepares the call, asks the coordinator
  // and finishes it.
  absl::StatusOr<RunResult> AskAndFinish(const Membership& membership,
                                         uint64_t sequence,
                                         const CollectiveSpec& spec,
                                         const CallBuffers& buffers,
                                         const RunOptions& options);
  // Checks the call and builds its request into `*call` (which must not
  // move afterwards). Returns INVALID_ARGUMENT before anything is sent, or
  // the verdict of a device input that could not be staged.
  absl::Status PrepareCall(const Membership& membership, uint64_t sequence,
                           const CollectiveSpec& spec,
                           const CallBuffers& buffers,
                           const RunOptions& options, PreparedCall* call);
  // Ends a call the coordinator answered with `response`: takes the inline
  // result, or runs the planned algorithm (blocking until it ends).
  absl::StatusOr<RunResult> FinishCall(const Membership& membership,
                                       uint64_t sequence,
                                       const CollectiveSpec& spec,
                                       const CallBuffers& buffers,
                                       const PreparedCall& call,
                                       v1::CollectiveResponse& response);
  // Sends `run`'s call to the coordinator (with its replays after a
  // failover); through the call port when `call_port`.
  void SendRun(PendingRun* run, bool call_port);
  // Sends `run` again after a failover, or ends it when shutting down.
  void ResendRun(PendingRun* run);
  // Takes the coordinator's `answer` to `run` (its response in
  // run->response), sent when the session had `registrations`: sends it
  // again after a failover, ends it here, or runs its plan on a task
  // thread.
  void OnRunAnswered(PendingRun* run, absl::Status answer,
                     uint64_t registrations);
  // ---- The leader plan (runtime_leader.cc) ----
  // Whether the call runs under the leader plan: its group has leader
  // calls, and the call is unforced, on host memory, and would be inline (or
  // is a barrier).
  static bool RunsAtLeader(const Membership& membership,
                           const CollectiveSpec& spec,
                           const CallBuffers& buffers,
                           const RunOptions& options);
  // Runs a call under the leader plan, or at the coordinator when the
  // leader sends it there. Returns Run()'s codes: the coordinator's verdict,
  // or a failure's (ReportFailure()).
  absl::StatusOr<RunResult> RunAtLeader(const Membership& membership,
                                        uint64_t sequence,
                                        const CollectiveSpec& spec,
                                        const CallBuffers& buffers,
                                        const RunOptions& options);
  // ValidateCall() for a call of `membership`'s rank: INVALID_ARGUMENT for
  // bad input, else OK.
  static absl::Status ValidateRankCall(const Membership& membership,
                                       const CollectiveSpec& spec,
                                       const CallBuffers& buffers,
                                       const RunOptions& options);
  // How long the ranks of a call that agree among themselves (the leader
  // plan, a same_host binding) wait for each other before they ask the
  // coordinator: the group's patience, at most a quarter of the timeout.
  static absl::Duration Patience(const Membership& membership,
                                 const RunOptions& options);
  // Keeps `sequence` for the rank's next call to the coordinator.
  void NoteLeaderRan(const Membership& membership, uint64_t sequence);
  // Moves the sequences kept for `membership`'s rank into `request`.
  void AttachLeaderRan(const Membership& membership,
                       v1::CollectiveRequest* request);
  // RunAtLeader() or RunOnBinding() (`body`) for RunAsync(), on a task
  // thread; `run` was not sent. When `body` gives no result the call goes
  // on at the coordinator (SendToCoordinatorAsync()) with the rest of its
  // time.
  void RunOffCoordinatorAsync(
      std::unique_ptr<PendingRun> run, const RunOptions& options,
      absl::Time start,
      std::function<std::optional<absl::StatusOr<RunResult>>(PendingRun&)>
          body);
  // RunAsync()'s call to the coordinator: sends it and returns; the answer
  // ends it, or runs its plan on a task thread.
  void SendToCoordinatorAsync(std::unique_ptr<PendingRun> run,
                              const RunOptions& options, absl::Time start);
  // ---- Same-host calls on kept segments (runtime_bound.cc) ----
  // Whether a call like this may run on, or make, a same_host binding: an
  // unforced all-reduce on host memory, without checked results.
  bool MayBindSameHost(const CollectiveSpec& spec, const CallBuffers& buffers,
                       bool forced) const;
  // The rank's binding the call runs on, claimed for it (RunOnBinding()
  // unclaims it), or null.
  std::shared_ptr<SameHostBinding> ClaimBinding(
      const Membership& membership, const CollectiveSpec& spec,
      const CallBuffers& buffers, const RunOptions& options) const;
  // A token held while `spec`, which rides with the call, asks the
  // coordinator for a same_host plan to repeat (repeat_asks.h), or null.
  std::shared_ptr<const void> AskToRepeat(const Membership& membership,
                                          const CollectiveSpec& spec,
                                          const CallBuffers& buffers,
                                          const RunOptions& options);
  // Tells the rank's bound peers that call `sequence` goes to the
  // coordinator.
  void WithdrawFromBinding(const Membership& membership, uint64_t sequence);
  // Keeps `binding`, made by a same_host call of `spec`, for the rank.
  void KeepBinding(const Membership& membership, const CollectiveSpec& spec,
                   std::shared_ptr<SameHostBinding> binding);
  // Runs a call on `binding` (claimed), or at the coordinator when a rank
  // withdrew.
  // Returns Run()'s codes: the coordinator's verdict, or a failure's
  // (ReportFailure()).
  absl::StatusOr<RunResult> RunBound(SameHostBinding& binding,
                                     const Membership& membership,
                                     uint64_t sequence,
                                     const CollectiveSpec& spec,
                                     const CallBuffers& buffers,
                                     const RunOptions& options);
  // RunBound()'s part on the binding, which it unclaims: the call's
  // result, or nullopt when the call goes to the coordinator (nothing
  // written).
  std::optional<absl::StatusOr<RunResult>> RunOnBinding(
      SameHostBinding& binding, const Membership& membership, uint64_t sequence,
      const CollectiveSpec& spec, const CallBuffers& buffers,
      const RunOptions& options);
  // ---- Failover (runtime_failover.cc) ----
  // Sends `call` to the coordinator and returns its answer; with several
  // coordinators, sends it again (with its replays) after a failover until
  // its deadline.
  absl::StatusOr<v1::CollectiveResponse> AskCoordinator(
      const Membership& membership, uint64_t sequence, PreparedCall* call);
  // Whether a call that failed with `status` goes again: the cluster has
  // several coordinators, the coordinator could not be reached or was not
  // the leader (UNAVAILABLE), `deadline` has not passed and this worker is
  // not shutting down.
  bool RetriesAfterFailover(const absl::Status& status,
                            absl::Time deadline) const;
  // Blocks until the session's next heartbeat ended (it follows the
  // leader), or until `deadline`.
  void WaitForNextBeat(absl::Time deadline);
  // RunPlanned, with `call` kept as running from then until the commit's
  // verdict (AnsweredCalls::Running; the caller ends it with
  // answered_calls_.Ran) when there are several coordinators.
  absl::Status RunPlannedKept(const Membership& membership, uint64_t sequence,
                              const CollectiveSpec& spec, RunResult* result,
                              const PreparedCall& call,
                              const CallBuffers& buffers,
                              std::string* host_output,
                              v1::CommitRequest* commit);
  // After the session registered with a coordinator that kept it (a new
  // leader): sends every running call there, once, from a task thread.
  void ResendRunningCalls();
  // A call's plan, if it had one, no longer runs: its commit has its
  // verdict, or it ended before one.
  void RunEnded(const std::string& group, uint64_t sequence);
  // Sends `call` to the coordinator now as a running call; waits for its
  // answer (logged, not returned).
  void SendRunningCall(const AnsweredCalls::RunningCall& call);
  // Runs `run`'s callback with `result`, forgets and deletes it.
  void EndRun(PendingRun* run, absl::StatusOr<RunResult> result);
  // Cancels the gRPC calls of pending runs, refuses new ones, and waits
  // until every run has ended.
  void CloseRuns();
  // Runs the data-plane half of `run` on its task thread, then commits it:
  // through the call port without waiting (the verdict ends the run on
  // its completion thread), else here.
  void RunPlannedAsync(PendingRun* run);
  // Runs the planned data-plane algorithm; `host_input` is the input when
  // it is on the host (or was copied there). Sets plan->algorithm to the
  // algorithm that ran. Returns OK with the output in place and `commit`
  // filled in, for Commit() to end the call; or the failure's verdict
  // (ReportFailure()). With `may_bind`, a same_host run keeps its segments
  // for the rank's later calls of the shape (KeepBinding()).
  absl::Status RunPlanned(const Membership& membership, uint64_t sequence,
                          const CollectiveSpec& spec, RunResult* plan,
                          const Device& device, const CallBuffers& buffers,
                          absl::string_view host_input,
                          std::string* host_output, absl::Time deadline,
                          bool may_bind, v1::CommitRequest* commit);
  // The transport options of `membership`'s rank in call `sequence`, whose
  // waits end at `deadline` (peers of a large group resolved as needed;
  // `membership` must outlive the transport).
  PeerTransportOptions TransportOptions(const Membership& membership,
                                        uint64_t sequence, absl::Time deadline);
  // A planned call on the data plane's algorithms (`args` without its
  // input, work buffer and output place, which staging sets) or on NCCL
  // (its waits end at `deadline`). Return the algorithm's, the transport's,
  // the GPU's and NCCL's errors; RunOnDataPlane sets *algorithm to the one
  // that ran.
  absl::Status RunOnDataPlane(const Device& device, const CallBuffers& buffers,
                              absl::string_view host_input, AlgorithmArgs& args,
                              Algorithm* algorithm);
  absl::Status RunOnNccl(const Membership& membership, uint64_t sequence,
                         const Device& device, const CallBuffers& buffers,
                         absl::string_view host_input, absl::Time deadline,
                         const AlgorithmArgs& args);
  // What a planned call works on besides the caller's buffers.
  struct StagedInput;
  // Readies the input of a planned call (`host_input` when it is on the
  // host) for `algorithm`: a GPU buffer for a rank that reduces on its GPU,
  // or a host copy of a device input; the device's errors otherwise.
  absl::Status StageInput(const CollectiveSpec& spec, Algorithm algorithm,
                          const Device& device, const CallBuffers& buffers,
                          absl::string_view host_input, StagedInput* staged);
  // Runs the planned algorithm; sets *algorithm to the one that ran.
  // INTERNAL for a plan this worker does not run.
  static absl::Status RunAlgorithm(const AlgorithmArgs& args,
                                   Algorithm* algorithm);
  // Moves a device call's output (in the GPU buffer or on the host) to its
  // place in device memory, or the GPU buffer's result to the host.
  absl::Status DeliverOutput(const CollectiveSpec& spec, const Device& device,
                             const CallBuffers& buffers,
                             const StagedInput& staged,
                             std::string* host_output);
  // The RunResult of the coordinator's plan in `response`.
  static RunResult PlanOf(uint64_t sequence,
                          const v1::CollectiveResponse& response);
  // Copies an output that a plan left in *host_output into the caller's
  // place, when it gave one, and clears the string.
  static void PlaceOutput(const CallBuffers& buffers, std::string* host_output);
  // A call's end: `result` when `status` is OK (the output placed), else
  // `status` with the output cleared.
  static absl::StatusOr<RunResult> EndCall(const absl::Status& status,
                                           const CallBuffers& buffers,
                                           std::string* host_output,
                                           const RunResult& result);

  // Ends this worker's waits and sends of `group` at `epoch`, which the
  // coordinator aborted with `verdict`.
  void AbortLocally(const std::string& group, uint64_t epoch,
                    const absl::Status& verdict);
  // Whether calls can go to the coordinator's call port now (connecting
  // when needed).
  bool CallPortReady(absl::Time deadline);
  // Ends a data-plane collective: sends `request` (its result hash, when
  // set, is checked against the other ranks') and waits until every rank
  // committed it. Returns the group's verdict, or UNAVAILABLE /
  // DEADLINE_EXCEEDED when the coordinator did not give one.
  absl::Status Commit(const v1::CommitRequest& request, absl::Time deadline);
  // One attempt of Commit(); after a failover Commit() first sends the
  // call's running call again (the new leader needs the call before the
  // commit to plan it for ranks that lost the plan).
  absl::Status CommitOnce(const v1::CommitRequest& request,
                          absl::Time deadline);
  // Reports a data-plane failure and returns the group's verdict (ABORTED),
  // or `failure` itself when it already is a verdict or cannot be reported
  // (the report waits until about `answer_by`, the call's deadline). The
  // ranks the failure names as gone go with it; `leaving` (sequence 0)
  // reports a clean leave.
  absl::Status ReportFailure(const Membership& membership, uint64_t sequence,
                             const absl::Status& failure, absl::Time answer_by,
                             bool leaving = false);

  RuntimeOptions options_;
  std::vector<Device> devices_;
  DeviceSupport support_;
  std::string address_;
  std::string name_;
  int port_ = 0;
  Inbox inbox_;
  // Who holds each rank of this worker's groups (for the peer service).
  PeerDirectory peers_;
  // Sends this worker's data-plane messages to its peers.
  std::unique_ptr<PeerSender> sender_;
  // GPU memory for calls of Cuda(n) ranks.
  std::unique_ptr<DeviceBuffers> device_buffers_;
  // Collectives planned nccl, on the same GPUs.
  std::unique_ptr<NcclCalls> nccl_calls_;
  std::unique_ptr<TcpListener> tcp_listener_;
  std::unique_ptr<PeerService> peer_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<CoordinatorSession> session_;
  // Carries Run()'s collective calls, commits and failure reports when the
  // coordinator has a call port; null when options_.call_port is false.
  std::unique_ptr<CallPortClient> call_port_;
  absl::Mutex joins_mu_;
  absl::flat_hash_set<PendingJoin*> joins_ ABSL_GUARDED_BY(joins_mu_);
  bool joins_closed_ ABSL_GUARDED_BY(joins_mu_) = false;
  absl::Mutex runs_mu_;
  absl::flat_hash_set<PendingRun*> runs_ ABSL_GUARDED_BY(runs_mu_);
  bool runs_closed_ ABSL_GUARDED_BY(runs_mu_) = false;
  bool shut_down_ = false;
  // Set when Shutdown() starts: calls no longer wait for a failover.
  std::atomic<bool> closing_{false};
  // Per "group/epoch/rank": sequences that ran under the leader plan since
  // the rank's last call to the coordinator, as (first, last) ranges.
  absl::Mutex leader_ran_mu_;
  absl::flat_hash_map<std::string, std::vector<std::pair<uint64_t, uint64_t>>>
      leader_ran_ ABSL_GUARDED_BY(leader_ran_mu_);
  // Segments kept from same_host calls, per group epoch and rank.
  SameHostBindings same_host_bindings_;
  // Small all-reduces that ask for a same_host plan to repeat.
  RepeatAsks repeat_asks_;
  // Calls answered lately, for replays after a failover.
  AnsweredCalls answered_calls_;
  std::atomic<bool> corrupt_results_for_testing_{false};
  // Data-plane halves of RunAsync() calls. Last: it is destroyed first,
  // waiting for them while the rest of the runtime is still whole.
  TaskRunner planned_runs_;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_WORKER_RUNTIME_H_
