// ChunkedCallReactor: one WorkerLocal.CollectiveChunked stream. It reads the
// header and checks it (LocalApiService::PrepareCall and CheckSizes) before
// it takes any data, collects the input's pieces without holding a thread
// while it waits for them, runs the call once the client half-closed with
// the whole input (LocalApiService::StartCall, on a task thread), then
// writes the result's header and the output in pieces of at most
// kMaxPieceBytes. Any refusal before the run ends the stream with its
// status; the call then took no sequence number.
//
// Lifecycle: made by LocalApiService::CollectiveChunked for each stream;
// gRPC owns it and it deletes itself in OnDone(). The service must outlive
// it. Thread safety: gRPC calls one callback at a time in the order of the
// phases (reads, then the run's completion, then writes); each phase starts
// the next only after it is done with the state, so the state needs no lock.
#ifndef CHORUS_SERVER_WORKER_CHUNKED_CALL_REACTOR_H_
#define CHORUS_SERVER_WORKER_CHUNKED_CALL_REACTOR_H_

#include <grpcpp/support/server_callback.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "chorus/v1/worker.grpc.pb.h"
#include "server/worker/local_api_service.h"

namespace chorus {

class ChunkedCallReactor final
    : public grpc::ServerBidiReactor<v1::LocalChunkedRequest,
                                     v1::LocalChunkedResponse> {
 public:
  // Starts reading the stream of `context` (neither owned).
  ChunkedCallReactor(LocalApiService* service,
                     grpc::CallbackServerContext* context);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override { delete this; }

 private:
  enum class Phase { kHeader, kInput, kRunning, kOutput, kFinished };

  // Checks the header and makes room for the input; Finish()es on refusal.
  void TakeHeader(const v1::LocalChunkedHeader& header);
  // Appends one piece of the input; Finish()es on refusal.
  void TakePiece(const std::string& piece);
  // The client half-closed: runs the call when the whole input is there.
  void EndOfInput();
  // Called on the task thread with the call's result.
  void Ran(absl::StatusOr<RunResult> result);
  // Writes the next piece of the output, or finishes when none is left.
  void WriteNext();
  void End(const absl::Status& status);

  LocalApiService* const service_;
  grpc::CallbackServerContext* const context_;
  Phase phase_ = Phase::kHeader;
  v1::LocalChunkedRequest request_;
  v1::LocalChunkedResponse response_;
  LocalCall call_;
  uint64_t input_bytes_ = 0;
  std::string input_;
  std::string output_;
  uint64_t written_ = 0;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_CHUNKED_CALL_REACTOR_H_
