// The call socket's frames (worker.proto, LocalCallFrame and LocalCallReply)
// to and from the local-call core: what the call socket and the in-process
// door share. A frame runs as WorkerLocal.Collective does (LocalCalls::Run),
// so checks, sequence numbers, retries, codes and ErrorDetails are its.
//
// Thread safety: pure functions, and RunLocalCallFrame is as thread-safe as
// the core.
#ifndef CHORUS_SERVER_WORKER_LOCAL_CALL_FRAMES_H_
#define CHORUS_SERVER_WORKER_LOCAL_CALL_FRAMES_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "chorus/v1/worker.pb.h"
#include "server/worker/local/local_calls.h"

namespace chorus {

// The reply to call `call_id` that ended with `status`: its code and message
// and, when not OK, the google.rpc.Status with its ErrorDetail as gRPC would
// send it.
v1::LocalCallReply LocalCallReplyFor(uint64_t call_id,
                                     const absl::Status& status);

// Takes the reply of a frame: may move what it needs out of it (but not its
// response's data, which goes to the call's ledger after it returns). Runs
// once, on a thread of the worker's that must not block.
using LocalReplySink = std::function<void(v1::LocalCallReply& reply)>;

// Runs one frame (call_id nonzero) with the frame's timeout through `calls`;
// timeout_us 0 is answered with INVALID_ARGUMENT. `send` gets the reply,
// possibly before this returns.
void RunLocalCallFrame(LocalCalls* calls, v1::LocalCallFrame frame,
                       LocalReplySink send);

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_LOCAL_CALL_FRAMES_H_
