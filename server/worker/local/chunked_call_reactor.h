// ChunkedCallReactor: one WorkerLocal.CollectiveChunked stream, part of the
// gRPC door (LocalApiService). It reads the header and has the core check it
// (LocalCalls::PrepareStreamed) before it takes any data, collects the
// input's pieces without holding a thread while it waits for them, runs the
// call once the client half-closed with the whole input
// (LocalCalls::RunPrepared), then writes the result's header and the output
// in pieces of at most kMaxPieceBytes; once done, it hands the output to the
// ledger for retries. Any refusal before the run ends the stream with its
// status; the call then took no sequence number.
//
// Exists because: a client that shares no memory with the worker (on another
// host, with a client certificate, or a worker with --max_shared_bytes=0)
// cannot send a tensor over the 64 MiB gRPC message limit in one
// Collective call.
//
// Lifecycle: made by LocalApiService::CollectiveChunked for each stream;
// gRPC owns it and it deletes itself in OnDone(). The core must outlive it.
// Thread safety: gRPC's callbacks and the run's completion (on a task thread)
// come one at a time, in the order of the phases, but on different threads;
// each decides what to do next under mu_ and starts the next operation (a read,
// the run, a write, Finish) after releasing it, since gRPC may run a callback
// on the thread that starts an operation.
#ifndef CHORUS_SERVER_WORKER_LOCAL_CHUNKED_CALL_REACTOR_H_
#define CHORUS_SERVER_WORKER_LOCAL_CHUNKED_CALL_REACTOR_H_

#include <grpcpp/support/server_callback.h>

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "chorus/v1/worker.grpc.pb.h"
#include "server/worker/local/local_calls.h"

namespace chorus {

class ChunkedCallReactor final
    : public grpc::ServerBidiReactor<v1::LocalChunkedRequest,
                                     v1::LocalChunkedResponse> {
 public:
  // Starts reading the stream of `context` (neither owned).
  ChunkedCallReactor(LocalCalls* calls, grpc::CallbackServerContext* context);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  // Hands the output of a call that ran to the ledger (its retries), then
  // deletes the reactor.
  void OnDone() override;

 private:
  enum class Phase { kHeader, kInput, kRunning, kOutput, kFinished };

  // Checks the header and makes room for the input. Returns OK, or the
  // status to end the stream with.
  absl::Status TakeHeader(const v1::LocalChunkedHeader& header)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends one piece of the input. Returns OK or the status to end with.
  absl::Status TakePiece(const std::string& piece)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The client half-closed: OK when the whole input is there.
  absl::Status InputComplete() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands the call to the core.
  void StartRun();
  // Called on the task thread with the call's result.
  void Ran(absl::StatusOr<RunResult> result, KeepOutput keep);
  // Puts the next piece of the output in response_. Returns false when none
  // is left.
  bool NextPiece() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks the stream finished and frees its buffers. Returns false when it
  // already was (Finish() must then not be called again).
  bool MarkFinished() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  LocalCalls* const calls_;
  grpc::CallbackServerContext* const context_;
  // Owned by gRPC while a read or a write is in flight.
  v1::LocalChunkedRequest request_;
  v1::LocalChunkedResponse response_;

  absl::Mutex mu_;
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kHeader;
  LocalCall call_ ABSL_GUARDED_BY(mu_);
  uint64_t input_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // While the call runs (kRunning), the task reads input_ and writes
  // output_ without mu_; nothing else touches them then.
  std::string input_ ABSL_GUARDED_BY(mu_);
  std::string output_ ABSL_GUARDED_BY(mu_);
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;
  // Takes output_ in OnDone() when the call ran here.
  KeepOutput keep_ ABSL_GUARDED_BY(mu_);
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_LOCAL_CHUNKED_CALL_REACTOR_H_
