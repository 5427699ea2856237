// chorus._embedded.AllReduceHere (all_reduce_here.h).
//
// AllReduceHere(calls, numbering, socket, prepare, empty_like, ndarray,
// not_here, timeout): a Communicator's blocking all_reduce of numpy arrays
// through its embedded worker in one call from Python, doing in C what the
// Python route RunInto (chorus/_routes/in_process.py) does for any call
// (the same checks, numbers and outcome), so that a small call spends
// little time in the interpreter. It takes its numbers through the public
// methods of the communicator's Numbering (chorus/_numbering.py): take()
// once the call passed its checks (it raises InvalidArgument once the
// communicator is closed), done() once the call ended; and it reads its
// CallSocket's public `broken` and `call_ids`. For any call it does not
// take it returns `not_here` having done nothing, and the Python routes run
// the call.
//
// Lifecycle: made by the AllReduceHere route of an embedded rank, which
// holds it; it holds that route (through `prepare`), a cycle the collector
// breaks.
// Thread safety: called with the GIL held, from any thread; it releases
// the GIL while a call runs, and several calls may run at once.
#include "client/python/embedded/all_reduce_here.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "client/python/embedded/embedded_calls.h"
#include "server/worker/local/in_process_door.h"

namespace chorus {
namespace {

struct AllReduceHereObject {
  PyObject ob_base;      // what PyObject_HEAD declares
  PyObject* calls;       // the Calls channel
  PyObject* take;        // numbering.take
  PyObject* done;        // numbering.done
  PyObject* socket;      // the CallSocket (its `broken`)
  PyObject* call_ids;    // socket.call_ids
  PyObject* prepare;     // prepare(x, op) -> (prefix, call)
  PyObject* empty_like;  // numpy.empty_like
  PyObject* ndarray;     // numpy.ndarray
  PyObject* not_here;    // what says "not taken"
  double timeout;        // the communicator's default, in seconds
  // (x.dtype, x's bytes, op) -> (prefix, call); each entry holds a
  // reference to its dtype (so that its address names it) and its value.
  std::map<std::tuple<PyObject*, Py_ssize_t, std::string>, PyObject*>* prefixes;
};

// The attribute names it reads, interned once.
struct HereNames {
  PyObject* dtype;
  PyObject* broken;
};
HereNames kHereNames;

bool InternHereNames() {
  const std::pair<PyObject**, const char*> names[] = {
      {&kHereNames.dtype, "dtype"},
      {&kHereNames.broken, "broken"},
  };
  for (const auto& [slot, text] : names) {
    *slot = PyUnicode_InternFromString(text);
    if (*slot == nullptr) return false;
  }
  return true;
}

// Prefixes kept at most (then forgotten, as the Python side's).
constexpr size_t kMaxHerePrefixes = 64;

PyTypeObject kAllReduceHereType = {PyVarObject_HEAD_INIT(nullptr, 0)};

void ForgetPrefixes(AllReduceHereObject* self) {
  auto prefixes = std::move(*self->prefixes);
  self->prefixes->clear();
  for (auto& [key, value] : prefixes) {
    Py_DECREF(std::get<0>(key));
    Py_DECREF(value);
  }
}

int AllReduceHereTraverse(AllReduceHereObject* self, visitproc visit,
                          void* arg) {
  for (PyObject* held :
       {self->calls, self->take, self->done, self->socket, self->call_ids,
        self->prepare, self->empty_like, self->ndarray, self->not_here}) {
    Py_VISIT(held);
  }
  if (self->prefixes != nullptr) {
    for (auto& [key, value] : *self->prefixes) Py_VISIT(value);
  }
  return 0;
}

int AllReduceHereClear(AllReduceHereObject* self) {
  if (self->prefixes != nullptr) ForgetPrefixes(self);
  Py_CLEAR(self->calls);
  Py_CLEAR(self->take);
  Py_CLEAR(self->done);
  Py_CLEAR(self->socket);
  Py_CLEAR(self->call_ids);
  Py_CLEAR(self->prepare);
  Py_CLEAR(self->empty_like);
  Py_CLEAR(self->ndarray);
  Py_CLEAR(self->not_here);
  return 0;
}

PyObject* AllReduceHereNew(PyTypeObject* type, PyObject* args, PyObject*) {
  PyObject *calls, *numbering, *socket, *prepare, *empty_like, *ndarray,
      *not_here;
  double timeout;
  if (!PyArg_ParseTuple(args, "O!OOOOOOd:AllReduceHere", &kCallsType, &calls,
                        &numbering, &socket, &prepare, &empty_like, &ndarray,
                        &not_here, &timeout)) {
    return nullptr;
  }
  // Looked up once: the bound methods and the iterator are the same for
  // every call.
  PyObject* take = PyObject_GetAttrString(numbering, "take");
  PyObject* done =
      take == nullptr ? nullptr : PyObject_GetAttrString(numbering, "done");
  PyObject* call_ids =
      done == nullptr ? nullptr : PyObject_GetAttrString(socket, "call_ids");
  auto* self =
      call_ids == nullptr
          ? nullptr
          : reinterpret_cast<AllReduceHereObject*>(type->tp_alloc(type, 0));
  if (self == nullptr) {
    Py_XDECREF(take);
    Py_XDECREF(done);
    Py_XDECREF(call_ids);
    return nullptr;
  }
  for (PyObject* held :
       {calls, socket, prepare, empty_like, ndarray, not_here}) {
    Py_INCREF(held);
  }
  self->calls = calls;
  self->take = take;  // the references GetAttr returned
  self->done = done;
  self->socket = socket;
  self->call_ids = call_ids;
  self->prepare = prepare;
  self->empty_like = empty_like;
  self->ndarray = ndarray;
  self->not_here = not_here;
  self->timeout = timeout;
  self->prefixes = new std::remove_pointer_t<decltype(self->prefixes)>();
  return reinterpret_cast<PyObject*>(self);
}

void AllReduceHereDealloc(AllReduceHereObject* self) {
  PyObject_GC_UnTrack(self);
  AllReduceHereClear(self);
  delete self->prefixes;
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

// Takes the next number, through numbering.take(). Returns it, or 0 with
// take()'s error (InvalidArgument once the communicator is closed).
uint64_t TakeNumber(AllReduceHereObject* self) {
  PyObject* number = PyObject_CallNoArgs(self->take);
  if (number == nullptr) return 0;
  const unsigned long long sequence = PyLong_AsUnsignedLongLong(number);
  Py_DECREF(number);
  if (PyErr_Occurred()) return 0;
  return sequence;
}

// Counts a call as out of flight, through numbering.done(). Returns false
// with a Python error.
bool LeftFlight(AllReduceHereObject* self) {
  PyObject* left = PyObject_CallNoArgs(self->done);
  Py_XDECREF(left);
  return left != nullptr;
}

// The call's timeout in microseconds: `timeout` (None: the communicator's),
// or 0 when it is not a plain finite number > 0 (the Python path says what
// is wrong with it).
uint64_t TimeoutMicros(AllReduceHereObject* self, PyObject* timeout) {
  double seconds;
  if (timeout == Py_None) {
    seconds = self->timeout;
  } else if (PyFloat_CheckExact(timeout)) {
    seconds = PyFloat_AS_DOUBLE(timeout);
  } else if (PyLong_CheckExact(timeout)) {
    seconds = PyLong_AsDouble(timeout);
    if (PyErr_Occurred()) {
      PyErr_Clear();
      return 0;
    }
  } else {
    return 0;
  }
  if (!(seconds > 0) || std::isinf(seconds)) return 0;
  return static_cast<uint64_t>(std::max(1.0, std::min(seconds * 1e6, 1e18)));
}

// A Py_buffer released when it goes.
struct HeldBuffer {
  Py_buffer view;
  bool held = false;
  bool Get(PyObject* object, int flags) {
    held = PyObject_GetBuffer(object, &view, flags) == 0;
    if (!held) PyErr_Clear();
    return held;
  }
  ~HeldBuffer() {
    if (held) PyBuffer_Release(&view);
  }
};

// The (prefix, call) of an all_reduce of `bytes` bytes of `dtype` (x's)
// with `op`: cached, else from prepare(x, op). A new reference, or null
// with prepare's error.
PyObject* PrefixFor(AllReduceHereObject* self, PyObject* x, PyObject* dtype,
                    Py_ssize_t bytes, PyObject* op) {
  Py_ssize_t op_bytes;
  const char* op_text = PyUnicode_AsUTF8AndSize(op, &op_bytes);
  if (op_text == nullptr) return nullptr;
  auto key = std::make_tuple(dtype, bytes, std::string(op_text, op_bytes));
  auto it = self->prefixes->find(key);
  if (it != self->prefixes->end()) {
    Py_INCREF(it->second);
    return it->second;
  }
  PyObject* prepared =
      PyObject_CallFunctionObjArgs(self->prepare, x, op, nullptr);
  if (prepared == nullptr) return nullptr;
  if (!PyTuple_CheckExact(prepared) || PyTuple_GET_SIZE(prepared) != 2 ||
      !PyBytes_CheckExact(PyTuple_GET_ITEM(prepared, 0))) {
    Py_DECREF(prepared);
    PyErr_SetString(PyExc_TypeError, "prepare() must return (bytes, call)");
    return nullptr;
  }
  // prepare() ran Python code: another thread may have cached it since.
  if (self->prefixes->find(key) == self->prefixes->end()) {
    if (self->prefixes->size() >= kMaxHerePrefixes) ForgetPrefixes(self);
    Py_INCREF(dtype);
    Py_INCREF(prepared);
    (*self->prefixes)[key] = prepared;  // the map holds both references
  }
  return prepared;
}

// The array a call on x (of dtype `dtype`, `bytes` long) writes: `out`, or a
// new one shaped as x, held writable in `place`. A new reference; null
// with *python_way set where the call is not for here (out of another
// dtype object, not C-contiguous and writable, or of another size: the
// Python side says what is wrong), or null with empty_like's error.
PyObject* OutputFor(AllReduceHereObject* self, PyObject* x, PyObject* out,
                    PyObject* dtype, Py_ssize_t bytes, HeldBuffer* place,
                    bool* python_way) {
  PyObject* result = out;
  if (result == Py_None) {
    result = PyObject_CallOneArg(self->empty_like, x);
    if (result == nullptr) return nullptr;
  } else {
    Py_INCREF(result);
  }
  // The same dtype object (numpy's builtin dtypes are singletons; any
  // other out goes the Python way, which compares them).
  PyObject* out_dtype = PyObject_GetAttr(result, kHereNames.dtype);
  const bool same_dtype = out_dtype == dtype;
  Py_XDECREF(out_dtype);
  PyErr_Clear();
  if (!same_dtype || !place->Get(result, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) ||
      place->view.len != bytes) {
    Py_DECREF(result);
    *python_way = true;
    return nullptr;
  }
  return result;
}

// The id of the next call on the channel, as CallSocket.run_in_place()
// takes one; 0 where the channel cannot take it (broken, closed).
unsigned long long NextCallId(AllReduceHereObject* self) {
  PyObject* broken = PyObject_GetAttr(self->socket, kHereNames.broken);
  const bool usable = broken == Py_None && CallsOpen(self->calls);
  Py_XDECREF(broken);
  PyObject* id_object = usable ? PyIter_Next(self->call_ids) : nullptr;
  const unsigned long long call_id =
      id_object == nullptr ? 0 : PyLong_AsUnsignedLongLong(id_object);
  Py_XDECREF(id_object);
  PyErr_Clear();
  return call_id == static_cast<unsigned long long>(-1) ? 0 : call_id;
}

// Runs call `sequence` (its id `call_id`, its (prefix, call) `prepared`)
// on `data` into `place`, whose array is `result` (a reference this
// takes). Returns what __call__ returns: `result`, or (call, sequence,
// reply) for a failure.
PyObject* RunHere(AllReduceHereObject* self, unsigned long long call_id,
                  uint64_t timeout_us, PyObject* prepared, uint64_t sequence,
                  const HeldBuffer& data, const HeldBuffer& place,
                  PyObject* result) {
  const CallerMemory memory{
      absl::string_view(static_cast<const char*>(data.view.buf),
                        static_cast<size_t>(data.view.len)),
      absl::Span<char>(static_cast<char*>(place.view.buf),
                       static_cast<size_t>(place.view.len))};
  PyObject* ran = RunOnCalls(self->calls, call_id, timeout_us,
                             PyTuple_GET_ITEM(prepared, 0), sequence, memory);
  PyObject* answer = nullptr;
  if (ran == Py_True) {
    answer = LeftFlight(self) ? result : nullptr;
    if (answer == nullptr) Py_DECREF(result);
  } else {
    Py_DECREF(result);
    answer =
        ran == nullptr
            ? nullptr
            : Py_BuildValue("(OKO)", PyTuple_GET_ITEM(prepared, 1),
                            static_cast<unsigned long long>(sequence), ran);
    if (answer == nullptr) {
      // Not handed to the Python side, which would count it out.
      PyObject* error_type;
      PyObject* error;
      PyObject* trace;
      PyErr_Fetch(&error_type, &error, &trace);
      LeftFlight(self);
      PyErr_Restore(error_type, error, trace);
    }
  }
  Py_XDECREF(ran);
  return answer;
}

// __call__(x, op, out, timeout): the output array (out, or a new one
// shaped as x) once the call succeeded; (call, sequence, reply) when it
// failed, reply being the failure's reply tuple, for the Python side to
// settle (the call is still in flight then); not_here when it did not take
// the call. Raises as prepare() does for an x or op the call cannot take.
PyObject* AllReduceHereCall(AllReduceHereObject* self, PyObject* args,
                            PyObject* kwargs) {
  PyObject *x, *op, *out, *timeout;
  if (kwargs != nullptr || !PyArg_UnpackTuple(args, "AllReduceHere", 4, 4, &x,
                                              &op, &out, &timeout)) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_TypeError, "AllReduceHere takes 4 arguments");
    }
    return nullptr;
  }
  if (self->calls == nullptr) {  // cleared by the cycle collector
    PyErr_SetString(PyExc_RuntimeError, "this AllReduceHere was cleared");
    return nullptr;
  }
  const auto not_here = [self] {
    Py_INCREF(self->not_here);
    return self->not_here;
  };
  if (reinterpret_cast<PyObject*>(Py_TYPE(x)) != self->ndarray ||
      !PyUnicode_CheckExact(op) ||
      (out != Py_None &&
       reinterpret_cast<PyObject*>(Py_TYPE(out)) != self->ndarray)) {
    return not_here();
  }
  const uint64_t timeout_us = TimeoutMicros(self, timeout);
  if (timeout_us == 0) return not_here();
  HeldBuffer data;
  if (!data.Get(x, PyBUF_C_CONTIGUOUS)) return not_here();
  PyObject* dtype = PyObject_GetAttr(x, kHereNames.dtype);
  if (dtype == nullptr) return nullptr;
  PyObject* prepared = PrefixFor(self, x, dtype, data.view.len, op);
  bool python_way = false;
  HeldBuffer place;
  PyObject* result =
      prepared == nullptr
          ? nullptr
          : OutputFor(self, x, out, dtype, data.view.len, &place, &python_way);
  Py_DECREF(dtype);
  const unsigned long long call_id = result == nullptr ? 0 : NextCallId(self);
  if (result == nullptr || call_id == 0) {
    Py_XDECREF(result);
    Py_XDECREF(prepared);
    return python_way || (result != nullptr && call_id == 0) ? not_here()
                                                             : nullptr;
  }
  const uint64_t sequence = TakeNumber(self);
  if (sequence == 0) {  // closed: take()'s InvalidArgument
    Py_DECREF(result);
    Py_DECREF(prepared);
    return nullptr;
  }
  PyObject* answer = RunHere(self, call_id, timeout_us, prepared, sequence,
                             data, place, result);
  Py_DECREF(prepared);
  return answer;
}

}  // namespace

bool AddAllReduceHere(PyObject* module) {
  kAllReduceHereType.tp_name = "chorus._embedded.AllReduceHere";
  kAllReduceHereType.tp_basicsize = sizeof(AllReduceHereObject);
  kAllReduceHereType.tp_dealloc =
      reinterpret_cast<destructor>(AllReduceHereDealloc);
  kAllReduceHereType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  kAllReduceHereType.tp_traverse =
      reinterpret_cast<traverseproc>(AllReduceHereTraverse);
  kAllReduceHereType.tp_clear = reinterpret_cast<inquiry>(AllReduceHereClear);
  kAllReduceHereType.tp_doc =
      "AllReduceHere(calls, numbering, socket, prepare, empty_like, ndarray, "
      "not_here, timeout): a Communicator's blocking all_reduce of numpy "
      "arrays through the embedded worker of `calls`, called as (x, op, out, "
      "timeout), numbered by numbering.take() and done(). Returns the output "
      "array once the call succeeded; (call, sequence, reply) when it "
      "failed, for the communicator to settle; not_here, having done "
      "nothing, for a call it does not take. Raises as prepare(x, op) and "
      "numbering.take() do.";
  kAllReduceHereType.tp_new = AllReduceHereNew;
  kAllReduceHereType.tp_call = reinterpret_cast<ternaryfunc>(AllReduceHereCall);
  if (!InternHereNames() || PyType_Ready(&kAllReduceHereType) < 0) {
    return false;
  }
  Py_INCREF(&kAllReduceHereType);
  if (PyModule_AddObject(module, "AllReduceHere",
                         reinterpret_cast<PyObject*>(&kAllReduceHereType)) <
      0) {
    Py_DECREF(&kAllReduceHereType);
    return false;
  }
  return true;
}

}  // namespace chorus
