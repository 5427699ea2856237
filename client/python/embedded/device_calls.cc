#include "client/python/embedded/device_calls.h"

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "chorus/v1/worker.pb.h"
#include "client/python/embedded/embedded_calls.h"
#include "client/python/embedded/reply_queue.h"
#include "server/worker/local/in_process_door.h"

namespace chorus {
namespace {

// The arguments of run_on_device() and start_on_device().
struct DeviceArgs {
  unsigned long long call_id = 0;
  unsigned long long timeout_us = 0;
  v1::LocalCollectiveRequest request;  // with its sequence
  const void* input = nullptr;
  void* output = nullptr;
  void* stream = nullptr;
};

// An address given as a Python int (0: none); false with a Python error.
bool AddressOf(PyObject* value, void** address) {
  const unsigned long long raw = PyLong_AsUnsignedLongLong(value);
  if (PyErr_Occurred()) return false;
  *address = reinterpret_cast<void*>(static_cast<uintptr_t>(raw));
  return true;
}

// Reads the arguments of method `name`. Returns false with TypeError,
// ValueError (call_id 0, a prefix that does not parse) or OverflowError.
bool ParseDeviceArgs(const char* name, PyObject* const* args, Py_ssize_t nargs,
                     DeviceArgs* parsed) {
  if (nargs != 7) {
    PyErr_Format(PyExc_TypeError, "%s() takes 7 arguments", name);
    return false;
  }
  parsed->call_id = PyLong_AsUnsignedLongLong(args[0]);
  parsed->timeout_us = PyLong_AsUnsignedLongLong(args[1]);
  const unsigned long long sequence = PyLong_AsUnsignedLongLong(args[3]);
  if (PyErr_Occurred()) return false;
  void* input = nullptr;
  if (!AddressOf(args[4], &input) || !AddressOf(args[5], &parsed->output) ||
      !AddressOf(args[6], &parsed->stream)) {
    return false;
  }
  parsed->input = input;
  if (parsed->call_id == 0) {
    PyErr_Format(PyExc_ValueError, "%s: call_id 0", name);
    return false;
  }
  if (!PyBytes_Check(args[2])) {
    PyErr_Format(PyExc_TypeError, "%s: prefix must be bytes", name);
    return false;
  }
  if (!parsed->request.ParseFromArray(
          PyBytes_AS_STRING(args[2]),
          static_cast<int>(PyBytes_GET_SIZE(args[2])))) {
    PyErr_Format(PyExc_ValueError, "%s: prefix is not a LocalCollectiveRequest",
                 name);
    return false;
  }
  parsed->request.set_sequence(sequence);
  return true;
}

absl::Status NoTimeout() {
  return absl::InvalidArgumentError("a call with timeout_us 0 cannot run");
}

}  // namespace

PyObject* CallsRunOnDevice(PyObject* self, PyObject* const* args,
                           Py_ssize_t nargs) {
  DeviceArgs parsed;
  if (!ParseDeviceArgs("run_on_device", args, nargs, &parsed)) return nullptr;
  if (OpenCallsQueue(self) == nullptr) return nullptr;
  InProcessDoor* door = CallsDoor(self);
  absl::StatusOr<RunResult> ran = NoTimeout();
  Py_BEGIN_ALLOW_THREADS;
  if (parsed.timeout_us != 0) {
    ran = door->RunOnDevice(parsed.request, DeadlineIn(parsed.timeout_us),
                            parsed.input, parsed.output, parsed.stream);
  }
  Py_END_ALLOW_THREADS;
  if (ran.ok()) Py_RETURN_TRUE;
  return ReplyTupleOf(ReplyOfResult(parsed.call_id, ran));
}

PyObject* CallsStartOnDevice(PyObject* self, PyObject* const* args,
                             Py_ssize_t nargs) {
  DeviceArgs parsed;
  if (!ParseDeviceArgs("start_on_device", args, nargs, &parsed)) {
    return nullptr;
  }
  std::shared_ptr<ReplyQueue> queue = OpenCallsQueue(self);
  if (queue == nullptr) return nullptr;
  InProcessDoor* door = CallsDoor(self);
  const uint64_t call_id = parsed.call_id;
  auto end = [queue, call_id](absl::StatusOr<RunResult> result) {
    queue->Push(ReplyOfResult(call_id, result));
  };
  Py_BEGIN_ALLOW_THREADS;
  if (parsed.timeout_us == 0) {
    end(NoTimeout());
  } else {
    door->StartOnDevice(parsed.request, DeadlineIn(parsed.timeout_us),
                        parsed.input, parsed.output, parsed.stream,
                        std::move(end));
  }
  Py_END_ALLOW_THREADS;
  Py_RETURN_NONE;
}

}  // namespace chorus
