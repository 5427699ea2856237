// chorus._embedded.Calls (embedded_calls.h): a channel that hands
// LocalCallFrames straight to its worker's in-process door, with no socket
// in between. It has the methods of the call socket's connection that
// chorus._call_socket drives (send_call, wait, drain, fileno, shutdown,
// close); replies wait in the channel's ReplyQueue until a Python thread
// takes them. run_into() and start_into() run a call on the caller's own
// buffers; run_on_device() and start_on_device() (device_calls.h) on its GPU
// memory.
#include "client/python/embedded/embedded_calls.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "chorus/v1/worker.pb.h"
#include "client/python/embedded/device_calls.h"
#include "client/python/embedded/embedded_worker.h"
#include "client/python/embedded/reply_queue.h"
#include "server/worker/local/in_process_door.h"

namespace chorus {

// Filled in by AddCallsType().
PyTypeObject kCallsType = {PyVarObject_HEAD_INIT(nullptr, 0)};

namespace {

// The buffers of an asynchronous call on its caller's memory
// (Calls.start_into), held until its reply was taken (with the GIL).
struct HeldCall {
  Py_buffer data;
  Py_buffer out;
  // The call ended (set on a worker thread before its reply is queued):
  // nothing writes to `out` any more.
  std::atomic<bool> ended{false};
};

struct CallsObject {
  PyObject ob_base;  // what PyObject_HEAD declares
  // A reference, so that the runtime outlives the channel.
  PyObject* worker;
  // The worker's runtime; owned by `worker`.
  EmbeddedWorker* embedded;
  std::shared_ptr<ReplyQueue>* queue;
  // The held buffers of asynchronous calls on their callers' memory, by
  // call id; used with the GIL held only.
  std::map<uint64_t, std::shared_ptr<HeldCall>>* held;
};

// Releases the buffers `held` holds (with the GIL).
void ReleaseBuffers(HeldCall& held) {
  PyBuffer_Release(&held.out);
  PyBuffer_Release(&held.data);
}

// Whether the channel's worker runs in this process (not in the parent of
// a fork); raises OSError when not.
bool CallsOwnedHere(CallsObject* self) {
  if (self->embedded->OwnedHere()) return true;
  PyErr_SetString(PyExc_OSError,
                  "this embedded worker runs in the process that started "
                  "it, of which this one is a fork");
  return false;
}

void CallsDealloc(CallsObject* self) {
  // In a fork, left alone as its worker is.
  if (self->queue != nullptr && self->embedded->OwnedHere()) {
    (*self->queue)->Close();
    delete self->queue;
    // The buffers of calls that ended go; those of a call still running
    // (its reply never taken) stay held for good, as it may still write.
    for (auto& [call_id, held] : *self->held) {
      if (held->ended.load()) ReleaseBuffers(*held);
    }
    delete self->held;
  }
  Py_XDECREF(self->worker);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyObject* CallsFileno(CallsObject* self, PyObject*) {
  return PyLong_FromLong((*self->queue)->event_fd());
}

PyObject* CallsClose(CallsObject* self, PyObject*) {
  if (!self->embedded->OwnedHere()) Py_RETURN_NONE;
  (*self->queue)->Close();
  // Replies are dropped from now on: the buffers of calls that ended go
  // now, the others when the channel goes.
  for (auto it = self->held->begin(); it != self->held->end();) {
    if (it->second->ended.load()) {
      ReleaseBuffers(*it->second);
      it = self->held->erase(it);
    } else {
      ++it;
    }
  }
  Py_RETURN_NONE;
}

constexpr Py_ssize_t kMaxParts = 8;

PyObject* ReplyTuple(const QueuedReply& reply);

// Runs `frame` into the channel's worker; the GIL must be released. Its
// reply goes to the queue.
void RunFrame(InProcessDoor* door, v1::LocalCallFrame frame,
              const std::shared_ptr<ReplyQueue>& queue) {
  door->RunFrame(std::move(frame), [queue](v1::LocalCallReply& answer) {
    QueuedReply reply = QueueableReply(answer);
    // A copy: the ledger keeps the data for retries.
    reply.data = answer.response().data();
    queue->Push(std::move(reply));
  });
}

// Runs call `call_id`, `request` with `timeout_us`, on `memory` on this
// thread (InProcessDoor::RunInPlace; a sync: SyncInPlace) and waits for
// its end; the GIL must be released. Returns whether it ended with no
// reply to hand back (it succeeded and has no outcome); else `*reply` is
// its reply: a failure's, or a sync's with its outcome as its data.
bool RunHere(InProcessDoor* door, uint64_t call_id,
             const v1::LocalCollectiveRequest& request, uint64_t timeout_us,
             const CallerMemory& memory, QueuedReply* reply) {
  absl::Status status;
  if (timeout_us == 0) {
    status = absl::InvalidArgumentError("a call with timeout_us 0 cannot run");
  } else if (request.spec().kind() == v1::COLLECTIVE_KIND_SYNC) {
    absl::StatusOr<std::string> outcome =
        door->SyncInPlace(request, DeadlineIn(timeout_us));
    if (outcome.ok()) {
      reply->call_id = call_id;
      reply->data = *std::move(outcome);
      return false;
    }
    status = outcome.status();
  } else {
    status = door->RunInPlace(request, DeadlineIn(timeout_us), memory).status();
  }
  if (status.ok()) return true;
  v1::LocalCallReply answer = LocalCallReplyFor(call_id, status);
  *reply = QueueableReply(answer);
  return false;
}

// The channel's queue, open; null with OSError raised when the channel or
// its worker closed or belongs to the parent of this fork.
std::shared_ptr<ReplyQueue> OpenQueue(CallsObject* self) {
  if (!CallsOwnedHere(self)) return nullptr;
  std::shared_ptr<ReplyQueue> queue = *self->queue;
  if (queue->closed()) {
    errno = EPIPE;
    PyErr_SetFromErrno(PyExc_OSError);
    return nullptr;
  }
  return queue;
}

}  // namespace

absl::Time DeadlineIn(uint64_t timeout_us) {
  return absl::Now() + absl::Microseconds(static_cast<int64_t>(
                           std::min<uint64_t>(timeout_us, INT64_MAX)));
}

std::shared_ptr<ReplyQueue> OpenCallsQueue(PyObject* calls) {
  return OpenQueue(reinterpret_cast<CallsObject*>(calls));
}

InProcessDoor* CallsDoor(PyObject* calls) {
  return reinterpret_cast<CallsObject*>(calls)->embedded->worker().door();
}

QueuedReply ReplyOfResult(uint64_t call_id,
                          const absl::StatusOr<RunResult>& result) {
  v1::LocalCallReply answer = LocalCallReplyFor(call_id, result.status());
  if (result.ok()) {
    answer.mutable_response()->set_sequence(result->sequence);
    ToPlanProto(*result, answer.mutable_response()->mutable_plan());
  }
  return QueueableReply(answer);
}

PyObject* ReplyTupleOf(const QueuedReply& reply) { return ReplyTuple(reply); }

bool CallsOpen(PyObject* calls) {
  const bool open = OpenQueue(reinterpret_cast<CallsObject*>(calls)) != nullptr;
  PyErr_Clear();
  return open;
}

PyObject* RunOnCalls(PyObject* calls, uint64_t call_id, uint64_t timeout_us,
                     PyObject* prefix, uint64_t sequence,
                     const CallerMemory& memory) {
  InProcessDoor* door =
      reinterpret_cast<CallsObject*>(calls)->embedded->worker().door();
  const char* bytes = PyBytes_AS_STRING(prefix);
  const Py_ssize_t size = PyBytes_GET_SIZE(prefix);
  bool parsed = false;
  bool succeeded = false;
  QueuedReply reply;
  Py_BEGIN_ALLOW_THREADS;
  v1::LocalCollectiveRequest request;
  parsed = request.ParseFromArray(bytes, static_cast<int>(size));
  if (parsed) {
    request.set_sequence(sequence);
    succeeded = RunHere(door, call_id, request, timeout_us, memory, &reply);
  }
  Py_END_ALLOW_THREADS;
  if (!parsed) {
    PyErr_SetString(PyExc_ValueError,
                    "run_into: prefix is not a LocalCollectiveRequest");
    return nullptr;
  }
  if (succeeded) Py_RETURN_TRUE;
  return ReplyTuple(reply);
}

namespace {

PyObject* CallsSend(CallsObject* self, PyObject* args) {
  unsigned long long call_id, timeout_us;
  PyObject* parts;
  if (!PyArg_ParseTuple(args, "KKO!:send_call", &call_id, &timeout_us,
                        &PyTuple_Type, &parts)) {
    return nullptr;
  }
  const Py_ssize_t count = PyTuple_GET_SIZE(parts);
  if (count > kMaxParts) {
    PyErr_SetString(PyExc_ValueError, "send_call: too many parts");
    return nullptr;
  }
  std::shared_ptr<ReplyQueue> queue = OpenQueue(self);
  if (queue == nullptr) return nullptr;
  // The request's bytes, as a frame would carry them.
  std::string request;
  for (Py_ssize_t i = 0; i < count; ++i) {
    Py_buffer view;
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(parts, i), &view,
                           PyBUF_C_CONTIGUOUS) < 0) {
      return nullptr;
    }
    request.append(static_cast<const char*>(view.buf),
                   static_cast<size_t>(view.len));
    PyBuffer_Release(&view);
  }
  if (call_id == 0) {
    PyErr_SetString(PyExc_ValueError, "send_call: call_id 0");
    return nullptr;
  }
  InProcessDoor* door = self->embedded->worker().door();
  bool parsed = false;
  Py_BEGIN_ALLOW_THREADS;
  v1::LocalCallFrame frame;
  parsed = frame.mutable_call()->ParseFromString(request);
  if (parsed) {
    frame.set_call_id(call_id);
    frame.set_timeout_us(timeout_us);
    RunFrame(door, std::move(frame), queue);
  }
  Py_END_ALLOW_THREADS;
  if (!parsed) {
    PyErr_SetString(PyExc_ValueError,
                    "send_call: the parts are not a LocalCollectiveRequest");
    return nullptr;
  }
  Py_RETURN_NONE;
}

// The arguments of run_into() and start_into(): (call_id, timeout_us,
// prefix, sequence, data, out).
struct IntoArgs {
  unsigned long long call_id = 0;
  unsigned long long timeout_us = 0;
  PyObject* prefix = nullptr;  // bytes
  unsigned long long sequence = 0;
  PyObject* data = nullptr;
  PyObject* out = nullptr;
};

// Reads the arguments of method `name`. Returns false with TypeError,
// ValueError (call_id 0) or OverflowError.
bool ParseIntoArgs(const char* name, PyObject* const* args, Py_ssize_t nargs,
                   IntoArgs* into) {
  if (nargs != 6) {
    PyErr_Format(PyExc_TypeError, "%s() takes 6 arguments", name);
    return false;
  }
  into->call_id = PyLong_AsUnsignedLongLong(args[0]);
  into->timeout_us = PyLong_AsUnsignedLongLong(args[1]);
  into->sequence = PyLong_AsUnsignedLongLong(args[3]);
  if (PyErr_Occurred()) return false;
  if (!PyBytes_Check(args[2])) {
    PyErr_Format(PyExc_TypeError, "%s: prefix must be bytes", name);
    return false;
  }
  if (into->call_id == 0) {
    PyErr_Format(PyExc_ValueError, "%s: call_id 0", name);
    return false;
  }
  into->prefix = args[2];
  into->data = args[4];
  into->out = args[5];
  return true;
}

// Takes the buffers of `into`: its data C-contiguous, its out writable too.
// Returns false, holding neither, with the buffers' error.
bool GetIntoBuffers(const IntoArgs& into, Py_buffer* data, Py_buffer* out) {
  if (PyObject_GetBuffer(into.data, data, PyBUF_C_CONTIGUOUS) < 0) {
    return false;
  }
  if (PyObject_GetBuffer(into.out, out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) <
      0) {
    PyBuffer_Release(data);
    return false;
  }
  return true;
}

// The caller's memory a call reads `data` from and writes `out` into.
CallerMemory MemoryOf(const Py_buffer& data, const Py_buffer& out) {
  return CallerMemory{absl::string_view(static_cast<const char*>(data.buf),
                                        static_cast<size_t>(data.len)),
                      absl::Span<char>(static_cast<char*>(out.buf),
                                       static_cast<size_t>(out.len))};
}

// run_into(): the request `prefix` with `sequence`, run on this thread on
// the buffers `data` and `out` themselves.
PyObject* CallsRunInto(CallsObject* self, PyObject* const* args,
                       Py_ssize_t nargs) {
  IntoArgs into;
  if (!ParseIntoArgs("run_into", args, nargs, &into)) return nullptr;
  std::shared_ptr<ReplyQueue> queue = OpenQueue(self);
  if (queue == nullptr) return nullptr;
  Py_buffer data, out;
  if (!GetIntoBuffers(into, &data, &out)) return nullptr;
  PyObject* ran = RunOnCalls(reinterpret_cast<PyObject*>(self), into.call_id,
                             into.timeout_us, into.prefix, into.sequence,
                             MemoryOf(data, out));
  PyBuffer_Release(&out);
  PyBuffer_Release(&data);
  return ran;
}

// start_into(): as run_into(), but the call runs on the worker's threads
// and its reply is queued; the buffers stay held until it was taken.
PyObject* CallsStartInto(CallsObject* self, PyObject* const* args,
                         Py_ssize_t nargs) {
  IntoArgs into;
  if (!ParseIntoArgs("start_into", args, nargs, &into)) return nullptr;
  if (self->held->count(into.call_id) != 0) {
    PyErr_SetString(PyExc_ValueError, "start_into: call_id still running");
    return nullptr;
  }
  std::shared_ptr<ReplyQueue> queue = OpenQueue(self);
  if (queue == nullptr) return nullptr;
  v1::LocalCollectiveRequest request;
  if (!request.ParseFromArray(
          PyBytes_AS_STRING(into.prefix),
          static_cast<int>(PyBytes_GET_SIZE(into.prefix)))) {
    PyErr_SetString(PyExc_ValueError,
                    "start_into: prefix is not a LocalCollectiveRequest");
    return nullptr;
  }
  request.set_sequence(into.sequence);
  auto held = std::make_shared<HeldCall>();
  if (!GetIntoBuffers(into, &held->data, &held->out)) return nullptr;
  const uint64_t call_id = into.call_id;
  (*self->held)[call_id] = held;
  const CallerMemory memory = MemoryOf(held->data, held->out);
  InProcessDoor* door = self->embedded->worker().door();
  // Queues the call's reply once it ended, its buffers then free to go.
  auto end = [queue, held, call_id](absl::StatusOr<RunResult> result) {
    QueuedReply reply = ReplyOfResult(call_id, result);
    held->ended.store(true);
    queue->Push(std::move(reply));
  };
  const unsigned long long timeout_us = into.timeout_us;
  Py_BEGIN_ALLOW_THREADS;
  if (timeout_us == 0) {
    end(absl::InvalidArgumentError("a call with timeout_us 0 cannot run"));
  } else {
    door->StartInPlace(request, DeadlineIn(timeout_us), memory, std::move(end));
  }
  Py_END_ALLOW_THREADS;
  Py_RETURN_NONE;
}

PyObject* ReplyTuple(const QueuedReply& reply) {
  return Py_BuildValue(
      "(KiNy#y#LK)", static_cast<unsigned long long>(reply.call_id), reply.code,
      PyUnicode_DecodeUTF8(reply.message.data(),
                           static_cast<Py_ssize_t>(reply.message.size()),
                           "replace"),
      reply.details.data(), static_cast<Py_ssize_t>(reply.details.size()),
      reply.data.data(), static_cast<Py_ssize_t>(reply.data.size()),
      static_cast<long long>(reply.algorithm),
      static_cast<unsigned long long>(reply.chunk_bytes));
}

// Hands the replies in `taken` to on_reply, except the one to `wanted`
// (0: none), which goes to `*mine`. Returns -1 on a Python error, 0 when
// on_reply said stop, else 1. Replies after a stop are dropped, as a
// socket's connection would close then.
int Dispatch(CallsObject* self, std::deque<QueuedReply>& taken, uint64_t wanted,
             PyObject* on_reply, PyObject** mine) {
  // The buffers of calls that replied go first, whatever happens next.
  for (const QueuedReply& reply : taken) {
    auto it = self->held->find(reply.call_id);
    if (it != self->held->end() && it->second->ended.load()) {
      ReleaseBuffers(*it->second);
      self->held->erase(it);
    }
  }
  int outcome = 1;
  for (QueuedReply& reply : taken) {
    if (outcome != 1) break;
    PyObject* tuple = ReplyTuple(reply);
    if (tuple == nullptr) return -1;
    if (wanted != 0 && reply.call_id == wanted && *mine == nullptr) {
      *mine = tuple;
      continue;
    }
    PyObject* go_on = PyObject_CallOneArg(on_reply, tuple);
    Py_DECREF(tuple);
    if (go_on == nullptr) return -1;
    const int truth = PyObject_IsTrue(go_on);
    Py_DECREF(go_on);
    if (truth < 0) return -1;
    if (!truth) outcome = 0;
  }
  return outcome;
}

PyObject* CallsWait(CallsObject* self, PyObject* args) {
  unsigned long long wanted;
  double seconds;
  PyObject* on_reply;
  if (!PyArg_ParseTuple(args, "KdO:wait", &wanted, &seconds, &on_reply)) {
    return nullptr;
  }
  const absl::Time deadline =
      absl::Now() + (std::isfinite(seconds) ? absl::Seconds(seconds)
                                            : absl::InfiniteDuration());
  if (!CallsOwnedHere(self)) return nullptr;
  std::shared_ptr<ReplyQueue> queue = *self->queue;
  for (;;) {
    std::deque<QueuedReply> taken;
    bool open = true;
    Py_BEGIN_ALLOW_THREADS;
    open = queue->Take(deadline, &taken);
    Py_END_ALLOW_THREADS;
    if (!open) Py_RETURN_FALSE;
    if (taken.empty()) Py_RETURN_NONE;  // the deadline passed
    PyObject* mine = nullptr;
    const int dispatched = Dispatch(self, taken, wanted, on_reply, &mine);
    if (dispatched < 0) {
      Py_XDECREF(mine);
      return nullptr;
    }
    if (mine != nullptr) return mine;
    if (dispatched == 0) Py_RETURN_FALSE;
    if (PyErr_CheckSignals() < 0) return nullptr;
  }
}

PyObject* CallsDrain(CallsObject* self, PyObject* on_reply) {
  if (!CallsOwnedHere(self)) return nullptr;
  std::shared_ptr<ReplyQueue> queue = *self->queue;
  std::deque<QueuedReply> taken;
  if (!queue->Take(absl::InfinitePast(), &taken)) Py_RETURN_FALSE;
  PyObject* mine = nullptr;
  const int dispatched = Dispatch(self, taken, 0, on_reply, &mine);
  if (dispatched < 0) return nullptr;
  return PyBool_FromLong(dispatched);
}

PyMethodDef kCallsMethods[] = {
    {"send_call", reinterpret_cast<PyCFunction>(CallsSend), METH_VARARGS,
     "send_call(call_id, timeout_us, parts) -> None\n\nRuns the "
     "LocalCollectiveRequest whose bytes are `parts` (at most 8 buffers) "
     "as call `call_id`. Raises OSError once the channel or its worker "
     "closed, ValueError for parts that do not parse."},
    {"start_into",
     reinterpret_cast<PyCFunction>(
         reinterpret_cast<void (*)()>(CallsStartInto)),
     METH_FASTCALL,
     "start_into(call_id, timeout_us, prefix, sequence, data, out) -> None\n\n"
     "As run_into(), without waiting: the call runs on the worker's "
     "threads, reading `data` and writing `out` in place, and its reply "
     "comes as a send_call() call's does (wait(), drain()). The buffers "
     "stay held until that reply was taken; the caller leaves `out` alone "
     "until then. Raises OSError once the channel or its worker closed, "
     "ValueError for a call_id in use or a prefix that does not parse, and "
     "as the buffers do."},
    {"run_into",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(CallsRunInto)),
     METH_FASTCALL,
     "run_into(call_id, timeout_us, prefix, sequence, data, out) -> True | "
     "tuple\n\nRuns the LocalCollectiveRequest whose bytes are `prefix` (no "
     "sequence, no data) as number `sequence` on this thread, on the "
     "buffers themselves: the call reads its input from `data` and writes "
     "its output into the writable buffer `out` (which may be larger), "
     "with no copy; no copy of the output is kept, so a retry of the "
     "number is refused. Returns True once the call succeeded, else its "
     "reply (as wait() returns one), by its deadline at the latest. The GIL "
     "is released meanwhile; a signal is seen only after. Raises OSError "
     "once the channel or its worker closed, ValueError for a prefix that "
     "does not parse, and as the buffers do for one that is not "
     "C-contiguous or an `out` that is not writable (numpy: ValueError)."},
    {"run_on_device",
     reinterpret_cast<PyCFunction>(
         reinterpret_cast<void (*)()>(CallsRunOnDevice)),
     METH_FASTCALL,
     "run_on_device(call_id, timeout_us, prefix, sequence, input, output, "
     "stream) -> True | tuple\n\nAs run_into(), on memory of the call's GPU "
     "at the addresses `input` and `output` (ints; 0: none), ordered on the "
     "CUDA stream `stream` (0: none; see device_calls.h)."},
    {"start_on_device",
     reinterpret_cast<PyCFunction>(
         reinterpret_cast<void (*)()>(CallsStartOnDevice)),
     METH_FASTCALL,
     "start_on_device(call_id, timeout_us, prefix, sequence, input, output, "
     "stream) -> None\n\nAs run_on_device(), without waiting: the reply "
     "comes as start_into()'s does. The memory stays valid until then."},
    {"wait", reinterpret_cast<PyCFunction>(CallsWait), METH_VARARGS,
     "wait(call_id, seconds, on_reply) -> tuple | None | False\n\nWaits "
     "until the reply to `call_id` came and returns it; every other reply "
     "goes to on_reply(reply), which returns whether to go on. Returns "
     "None when `seconds` passed first, False when the channel closed or "
     "on_reply said stop."},
    {"drain", reinterpret_cast<PyCFunction>(CallsDrain), METH_O,
     "drain(on_reply) -> bool\n\nPasses every reply waiting to "
     "on_reply(reply). Returns False when the channel closed or on_reply "
     "said stop."},
    {"fileno", reinterpret_cast<PyCFunction>(CallsFileno), METH_NOARGS,
     "fileno() -> int\n\nA descriptor readable while replies wait, or once "
     "the channel closed."},
    {"shutdown", reinterpret_cast<PyCFunction>(CallsClose), METH_NOARGS,
     "shutdown() -> None\n\nEnds the channel: waiters return False, "
     "replies still due are dropped. Idempotent."},
    {"close", reinterpret_cast<PyCFunction>(CallsClose), METH_NOARGS,
     "close() -> None\n\nAs shutdown()."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

PyObject* NewCalls(PyObject* worker, EmbeddedWorker* embedded) {
  auto queue = std::make_shared<ReplyQueue>();
  if (queue->event_fd() < 0) return PyErr_SetFromErrno(PyExc_OSError);
  if (!embedded->AddQueue(queue)) {
    errno = EPIPE;
    return PyErr_SetFromErrno(PyExc_OSError);
  }
  auto* calls =
      reinterpret_cast<CallsObject*>(kCallsType.tp_alloc(&kCallsType, 0));
  if (calls == nullptr) return nullptr;
  Py_INCREF(worker);
  calls->worker = worker;
  calls->embedded = embedded;
  calls->queue = new std::shared_ptr<ReplyQueue>(std::move(queue));
  calls->held = new std::map<uint64_t, std::shared_ptr<HeldCall>>();
  return reinterpret_cast<PyObject*>(calls);
}

bool AddCallsType(PyObject* module) {
  kCallsType.tp_name = "chorus._embedded.Calls";
  kCallsType.tp_basicsize = sizeof(CallsObject);
  kCallsType.tp_dealloc = reinterpret_cast<destructor>(CallsDealloc);
  kCallsType.tp_flags = Py_TPFLAGS_DEFAULT;
  kCallsType.tp_doc =
      "A channel for collective frames into a Worker of this process; made "
      "by Worker.calls().";
  kCallsType.tp_methods = kCallsMethods;
  if (PyType_Ready(&kCallsType) < 0) return false;
  Py_INCREF(&kCallsType);
  if (PyModule_AddObject(module, "Calls",
                         reinterpret_cast<PyObject*>(&kCallsType)) < 0) {
    Py_DECREF(&kCallsType);
    return false;
  }
  return true;
}

}  // namespace chorus
