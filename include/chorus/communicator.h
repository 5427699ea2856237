// Communicator: one rank of a Chorus group, as an application sees it. Join
// a group (through a worker daemon's local API, or through a worker
// embedded in this process, server/worker/local/local_worker.h), then run
// collectives on host buffers, blocking or asynchronously. Both paths share the
// same code below this API.
//
// Collectives are numbered in the order this rank issues them (Run() or
// RunAsync()); the n-th call of each rank is matched with the n-th of the
// others, so every rank must issue the same collectives in the same order.
//
// Lifecycle: Join*() returns a communicator of a formed group; destroying it
// waits for its asynchronous calls.
// Thread safety: all methods are thread-safe; calls issued from several
// threads are numbered in the order they enter Run()/RunAsync().
#ifndef CHORUS_INCLUDE_CHORUS_COMMUNICATOR_H_
#define CHORUS_INCLUDE_CHORUS_COMMUNICATOR_H_

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/types.h"

namespace chorus {

class LocalWorker;

struct JoinOptions {
  // The device this rank reduces on.
  Device device = CpuDevice();
  absl::Duration timeout = absl::Minutes(1);
  // An elastic group (every rank passes the same): it goes on without lost
  // members while it keeps min_world_size ranks, and admits newcomers at
  // Sync() up to max_world_size (0: the coordinator's limit). 0 and 0: not
  // elastic.
  int min_world_size = 0;
  int max_world_size = 0;

  static Device CpuDevice() {
    Device d;
    d.kind = DeviceKind::kCpu;
    return d;
  }
};

struct CallOptions {
  // Forces a plan; kUnspecified lets the coordinator choose.
  Algorithm algorithm = Algorithm::kUnspecified;
  absl::Duration timeout = absl::Minutes(1);
  // The device this call's buffers live on; the rank's device when unset.
  std::optional<Device> device;
  // RunOnDevice() on Cuda tensors: the CUDA stream (a cudaStream_t) the
  // input was written on and the output is read on. The GPU reads the input
  // only after the work enqueued there before the call (a wait on the GPU:
  // the calling thread does not wait for it, and the call's timeout counts
  // from the call, as for any rank); the output's last copy is enqueued
  // before the call returns, and the work enqueued on the stream afterwards
  // runs after it (as with NCCL, the output is complete in the stream's
  // order, not when the call returns). Null: whatever wrote the input is
  // complete (the caller synchronised), and the output is complete when the
  // call returns.
  void* stream = nullptr;
};

// A buffer in a device's memory: `count` elements of `dtype` at `data`,
// which is host memory for Cpu and GPU memory for Cuda(n).
struct DeviceTensor {
  Device device = JoinOptions::CpuDevice();
  void* data = nullptr;
  uint64_t count = 0;
  DType dtype = DType::kUnspecified;
};

// A rank's membership of an elastic group, as Sync() returns it.
struct GroupMembership {
  uint64_t epoch = 0;
  int world_size = 0;
  int rank = 0;
  // The ranks that joined since the previous epoch, and those (of the
  // previous epoch) that left.
  std::vector<int> joined;
  std::vector<int> left;
};

struct CallResult {
  uint64_t sequence = 0;
  // The plan the coordinator chose.
  Algorithm algorithm = Algorithm::kUnspecified;
  // An elastic group: the newcomers waiting, and the membership a sync
  // moved this rank to (unset: none).
  int joiners_waiting = 0;
  std::optional<GroupMembership> next;
};

// An asynchronous collective. Wait() blocks until it ended.
class CollectiveHandle {
 public:
  explicit CollectiveHandle(std::future<absl::StatusOr<CallResult>> future)
      : future_(std::move(future)) {}
  // Returns the call's result (see Communicator::Run); once only.
  absl::StatusOr<CallResult> Wait() { return future_.get(); }
  // True when Wait() would not block.
  bool Ready() const {
    return future_.wait_for(std::chrono::seconds(0)) ==
           std::future_status::ready;
  }

 private:
  std::future<absl::StatusOr<CallResult>> future_;
};

class Communicator {
 public:
  // The rank a newcomer passes to join a formed elastic group: it waits
  // until a Sync() of the members admits it (world_size is not read) and
  // its rank and world size are then those of the new epoch.
  static constexpr int kNewcomer = -1;

  // Joins `group` as `rank` of `world_size` through the worker daemon at
  // `worker_address` (rank kNewcomer: as a newcomer). Returns once every
  // rank joined (a newcomer: once admitted); codes: INVALID_ARGUMENT (bad
  // world size or rank), UNIMPLEMENTED (device refused), DEADLINE_EXCEEDED
  // naming the ranks that did not join (a newcomer: no sync admitted it),
  // FAILED_PRECONDITION (a newcomer to a group that is not elastic),
  // PERMISSION_DENIED (a "unix:" socket served by another user than this
  // one or root), UNAVAILABLE.
  static absl::StatusOr<std::unique_ptr<Communicator>> JoinThroughDaemon(
      const std::string& worker_address, const std::string& group,
      int world_size, int rank, const JoinOptions& options = {});

  // Same, with `worker` (not owned; must outlive the communicator) as this
  // process's worker: calls run on this process's memory, through the
  // worker's in-process door, with the checks of a daemon's local API.
  static absl::StatusOr<std::unique_ptr<Communicator>> JoinEmbedded(
      LocalWorker* worker, const std::string& group, int world_size, int rank,
      const JoinOptions& options = {});

  // Waits for this communicator's asynchronous calls to end. Subclasses
  // call WaitForAsyncCalls() first in their destructors.
  virtual ~Communicator();

  // This rank, the group's size and its epoch: an elastic group's current
  // ones.
  int rank() const;
  int world_size() const;
  uint64_t epoch() const;
  const std::string& group() const { return group_; }

  // Runs one collective on `input` (sized as CollectiveSpec's comment says)
  // and writes this rank's output. Returns INVALID_ARGUMENT for a malformed
  // spec or input size (nothing is sent then) or a mismatch between ranks
  // (the message says what each rank asked for); UNIMPLEMENTED when this
  // rank's device cannot take part; FAILED_PRECONDITION when another rank's
  // cannot; DEADLINE_EXCEEDED naming the ranks that did not arrive.
  absl::StatusOr<CallResult> Run(const CollectiveSpec& spec,
                                 absl::string_view input, std::string* output,
                                 const CallOptions& options = {});

  // Runs one collective on tensors in device memory; the call's device is
  // theirs (CallOptions.device, when set, must name it too). Cuda(n)
  // tensors are read and written in GPU memory by pointer, which needs a
  // communicator joined with JoinEmbedded: a daemon cannot reach this
  // process's GPU memory, so through a daemon send host bytes with Run()
  // and name the device in CallOptions.device instead. Cpu tensors work on
  // both paths. With CallOptions.stream, the call is ordered on that stream
  // (see there): the input is read after the work enqueued on it before the
  // call, and `output` is complete for the work enqueued on it after the
  // call returned; without one, whatever wrote `input` must be complete and
  // `output` is complete when this returns. Returns
  // INVALID_ARGUMENT when the tensors' devices differ from each other or
  // from CallOptions.device, their dtype is not spec.dtype, or their counts
  // are not the spec's input and output sizes (an off-root rank of
  // broadcast or scatter may pass an empty or a full-size input, as with
  // Run(); the call ignores it); FAILED_PRECONDITION for
  // Cuda tensors on a daemon communicator; UNIMPLEMENTED for a device the
  // embedded worker did not register; INVALID_ARGUMENT for a pointer that
  // is not memory of that GPU (all before the call takes a sequence
  // number); otherwise as Run().
  absl::StatusOr<CallResult> RunOnDevice(const CollectiveSpec& spec,
                                         const DeviceTensor& input,
                                         const DeviceTensor& output,
                                         const CallOptions& options = {});

  // Issues the collective now (it takes the next sequence number) and runs
  // it in the background. `output` must stay valid until Wait() returned.
  CollectiveHandle RunAsync(const CollectiveSpec& spec, std::string input,
                            std::string* output,
                            const CallOptions& options = {});

  // RunOnDevice() issued now and run in the background: returns once the
  // call is checked (its refusals are the handle's result) and took its
  // sequence number, without waiting for CallOptions.stream or any peer.
  // The tensors' memory must stay valid until Wait() returned. With a
  // stream, work enqueued there after Wait() returned runs after the
  // output was written.
  CollectiveHandle RunOnDeviceAsync(const CollectiveSpec& spec,
                                    const DeviceTensor& input,
                                    const DeviceTensor& output,
                                    const CallOptions& options = {});

  // Typed conveniences over Run() for arithmetic element types.
  template <typename T>
  absl::Status AllReduce(const std::vector<T>& input, std::vector<T>* output,
                         ReduceOp op, const CallOptions& options = {});
  absl::Status Barrier(const CallOptions& options = {});

  // An elastic group's step boundary: every member calls it, as any
  // collective; it admits the newcomers waiting (up to max_world_size),
  // after the members, and returns the membership this rank goes on with
  // (the same one when none waited). Returns the errors of Run().
  //
  // In an elastic group, a call that fails because a member was lost (or
  // left, or newcomers came) returns ABORTED whose StatusFacts reason is
  // MEMBERSHIP_CHANGED (next_epoch, next_world_size, next_ranks say what
  // changed); by then this communicator has moved to the new epoch, so
  // rank(), world_size() and epoch() are current and the next call runs
  // there. A rank the change dropped gets FAILED_PRECONDITION with reason
  // RANK_EXCLUDED instead.
  absl::StatusOr<GroupMembership> Sync(const CallOptions& options = {});

 protected:
  Communicator(std::string group, int world_size, int rank, uint64_t epoch)
      : group_(std::move(group)),
        world_size_(world_size),
        rank_(rank),
        epoch_(epoch) {}

  // The rank's membership of the group's epoch after `epoch`, where it was
  // rank `rank` (an elastic group's revoked epoch); implemented per path.
  // Returns FAILED_PRECONDITION (RANK_EXCLUDED) for a rank that was
  // dropped.
  virtual absl::StatusOr<GroupMembership> FollowEpoch(uint64_t epoch,
                                                      int rank) = 0;
  // Moves this communicator to `membership`: calls carry its epoch and
  // rank, numbered from 1 again.
  void MoveTo(const GroupMembership& membership);

  void WaitForAsyncCalls();

  // Hands back number `sequence`, whose call was refused without taking it
  // (the daemon's refusals before a number is taken), so the next call
  // takes it again and leaves no gap; does nothing once a later call has
  // taken a number.
  void GiveBackSequence(uint64_t sequence);

  // Runs the `sequence`-th collective; implemented per path.
  virtual absl::StatusOr<CallResult> RunSequenced(
      uint64_t sequence, const CollectiveSpec& spec, absl::string_view input,
      std::string* output, const CallOptions& options) = 0;
  // Returns OK when RunSequencedOnDevice can run `spec` on `input` and
  // `output` in memory of `device`, else why not (checked before the call
  // takes a sequence number).
  virtual absl::Status CheckDeviceMemory(const CollectiveSpec& spec,
                                         const Device& device,
                                         const void* input,
                                         const void* output) const;
  // Runs the `sequence`-th collective on memory of options.device (set);
  // only called when CheckDeviceMemory() allowed it.
  virtual absl::StatusOr<CallResult> RunSequencedOnDevice(
      uint64_t sequence, const CollectiveSpec& spec, const void* input,
      void* output, const CallOptions& options);

 private:
  // A RunOnDevice() call checked before it takes a sequence number
  // (communicator.cc).
  struct DeviceCall;

  // Everything this rank can refuse before taking a sequence number.
  absl::Status CheckCall(const CollectiveSpec& spec, uint64_t input_bytes,
                         const CallOptions& options) const;
  // RunOnDevice()'s checks; returns the call to run, or its refusal.
  absl::StatusOr<DeviceCall> CheckDeviceCall(const CollectiveSpec& spec,
                                             const DeviceTensor& input,
                                             const DeviceTensor& output,
                                             const CallOptions& options) const;
  // Runs a checked device call as the `sequence`-th collective.
  absl::StatusOr<CallResult> RunDeviceCall(uint64_t sequence,
                                           const CollectiveSpec& spec,
                                           const DeviceCall& call);
  // Takes the next sequence number and runs `run` with it in the
  // background; the handle's result is `run`'s, settled.
  CollectiveHandle InBackground(
      std::function<absl::StatusOr<CallResult>(uint64_t)> run);
  uint64_t NextSequence();

  // A call that ended with `result`: follows an elastic group's change
  // first. Returns `result`, or the refusal of the move.
  absl::StatusOr<CallResult> Settled(absl::StatusOr<CallResult> result);

  const std::string group_;
  mutable absl::Mutex mu_;
  int world_size_ ABSL_GUARDED_BY(mu_);
  int rank_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_);
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

// Returns the DType of a C++ element type (float -> kF32, ...).
template <typename T>
constexpr DType DTypeOf();

}  // namespace chorus

#include "chorus/communicator_inl.h"

#endif  // CHORUS_INCLUDE_CHORUS_COMMUNICATOR_H_
