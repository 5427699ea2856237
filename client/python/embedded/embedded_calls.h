// The Calls channel of chorus._embedded (embedded_calls.cc), as the other
// parts of the extension use it: the type, making a channel, whether a
// channel can run calls, and running one call on the caller's memory on the
// caller's thread.
//
// Lifecycle: a channel is made by Worker.calls() (NewCalls) and holds its
// Worker; it ends with close() or its deallocation, or when its worker
// closes.
// Thread safety: call every function with the GIL held; RunOnCalls()
// releases it while the call runs.
#ifndef CHORUS_CLIENT_PYTHON_EMBEDDED_EMBEDDED_CALLS_H_
#define CHORUS_CLIENT_PYTHON_EMBEDDED_EMBEDDED_CALLS_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/python/embedded/reply_queue.h"
#include "server/worker/local/in_process_door.h"

namespace chorus {

class EmbeddedWorker;

// chorus._embedded.Calls, made by Worker.calls().
extern PyTypeObject kCallsType;

// Readies the Calls type and adds it to `module`. Returns false with a
// Python error when it cannot.
bool AddCallsType(PyObject* module);

// Returns a new Calls channel into `embedded`, the runtime of Worker
// `worker` (which the channel holds a reference to); null with OSError when
// no eventfd can be had or the worker closed (EPIPE).
PyObject* NewCalls(PyObject* worker, EmbeddedWorker* embedded);

// Whether Calls channel `calls` can run calls now: it is open, and its
// worker runs in this process (not in the parent of this fork). Leaves no
// Python error set.
bool CallsOpen(PyObject* calls);

// Runs, on a channel CallsOpen() found open, the LocalCollectiveRequest
// whose bytes are `prefix` (a bytes object:
// no sequence, no data) as number `sequence`, call `call_id`, within
// `timeout_us`, on `memory` (InProcessDoor::RunInPlace) through the
// worker of Calls channel `calls`, on this thread with the GIL released.
// Returns a new reference: True once the call succeeded, else its reply
// tuple (as Calls.run_into returns one); null with ValueError for a prefix
// that does not parse, or the error of making the tuple.
PyObject* RunOnCalls(PyObject* calls, uint64_t call_id, uint64_t timeout_us,
                     PyObject* prefix, uint64_t sequence,
                     const CallerMemory& memory);

// The deadline `timeout_us` from now.
absl::Time DeadlineIn(uint64_t timeout_us);

// The open queue of Calls channel `calls`; null with OSError raised when
// the channel or its worker closed or belongs to the parent of this fork.
std::shared_ptr<ReplyQueue> OpenCallsQueue(PyObject* calls);

// The in-process door of the worker of Calls channel `calls`.
InProcessDoor* CallsDoor(PyObject* calls);

// The reply a Python caller reads for call `call_id` that ended with
// `result`: its status, and when OK its sequence and plan.
QueuedReply ReplyOfResult(uint64_t call_id,
                          const absl::StatusOr<RunResult>& result);

// A new reference to `reply` as the tuple wait() returns; null on a Python
// error.
PyObject* ReplyTupleOf(const QueuedReply& reply);

}  // namespace chorus

#endif  // CHORUS_CLIENT_PYTHON_EMBEDDED_EMBEDDED_CALLS_H_
