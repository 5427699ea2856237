#include "client/python/embedded/worker_type.h"

#include <cmath>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/python/embedded/embedded_calls.h"
#include "client/python/embedded/embedded_worker.h"
#include "client/python/embedded/emulated_memory.h"
#include "common/grpc_status.h"
#include "server/worker/local/local_worker.h"

namespace chorus {
namespace {

// The most GPUs a Worker emulates (each one a stream thread per stream).
constexpr int kMaxEmulatedGpus = 16;

// Raises RuntimeError((code, message, details)), which chorus.embedded
// turns into the chorus.Error of that code; `details` is the serialized
// google.rpc.Status with the status's ErrorDetail (empty without one).
PyObject* RaiseStatus(const absl::Status& status) {
  const std::string details = ToGrpcStatus(status).error_details();
  PyObject* error = Py_BuildValue(
      "(is#y#)", static_cast<int>(status.code()), status.message().data(),
      static_cast<Py_ssize_t>(status.message().size()), details.data(),
      static_cast<Py_ssize_t>(details.size()));
  if (error != nullptr) {
    PyErr_SetObject(PyExc_RuntimeError, error);
    Py_DECREF(error);
  }
  return nullptr;
}

struct WorkerObject {
  PyObject ob_base;  // what PyObject_HEAD declares
  // Owned; left behind in a fork (EmbeddedWorker::OwnedHere).
  EmbeddedWorker* embedded;
};

PyObject* WorkerNew(PyTypeObject* type, PyObject*, PyObject*) {
  auto* self = reinterpret_cast<WorkerObject*>(type->tp_alloc(type, 0));
  if (self != nullptr) self->embedded = nullptr;
  return reinterpret_cast<PyObject*>(self);
}

int WorkerInit(WorkerObject* self, PyObject* args, PyObject* kwargs) {
  static const char* kKeywords[] = {"coordinator",
                                    "local_socket",
                                    "listen",
                                    "advertise_address",
                                    "name",
                                    "register_timeout",
                                    "max_tensor_bytes",
                                    "max_shared_bytes",
                                    "tls_dir",
                                    "emulated_gpus",
                                    nullptr};
  const char* coordinator;
  const char* local_socket;
  const char* listen = "127.0.0.1:0";
  const char* advertise = "";
  const char* name = "";
  double register_timeout = 30;
  unsigned long long max_tensor_bytes = kDefaultMaxTensorBytes;
  unsigned long long max_shared_bytes = kDefaultMaxSharedBytes;
  const char* tls_dir = "";
  int emulated_gpus = 0;
  if (!PyArg_ParseTupleAndKeywords(
          args, kwargs, "ss|sssdKKsi:Worker", const_cast<char**>(kKeywords),
          &coordinator, &local_socket, &listen, &advertise, &name,
          &register_timeout, &max_tensor_bytes, &max_shared_bytes, &tls_dir,
          &emulated_gpus)) {
    return -1;
  }
  if (emulated_gpus < 0 || emulated_gpus > kMaxEmulatedGpus) {
    PyErr_Format(PyExc_ValueError, "Worker: emulated_gpus must be 0 to %d",
                 kMaxEmulatedGpus);
    return -1;
  }
  if (self->embedded != nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "Worker: started already");
    return -1;
  }
  if (!(register_timeout > 0) || !std::isfinite(register_timeout)) {
    PyErr_SetString(PyExc_ValueError,
                    "Worker: register_timeout must be a positive number");
    return -1;
  }
  LocalWorkerOptions options;
  options.runtime.coordinator = coordinator;
  options.runtime.unix_socket_path = local_socket;
  options.runtime.listen = listen;
  options.runtime.advertise_address = advertise;
  options.runtime.name = name;
  options.runtime.register_timeout = absl::Seconds(register_timeout);
  options.max_tensor_bytes = max_tensor_bytes;
  options.max_shared_bytes = max_shared_bytes;
  const std::string tls = tls_dir;
  absl::StatusOr<std::unique_ptr<EmbeddedWorker>> started;
  Py_BEGIN_ALLOW_THREADS;
  started = EmbeddedWorker::Start(std::move(options), tls, emulated_gpus);
  Py_END_ALLOW_THREADS;
  if (!started.ok()) {
    RaiseStatus(started.status());
    return -1;
  }
  self->embedded = started->release();
  return 0;
}

void WorkerClose(WorkerObject* self) {
  if (self->embedded == nullptr || !self->embedded->OwnedHere()) return;
  EmbeddedWorker* embedded = self->embedded;
  Py_BEGIN_ALLOW_THREADS;
  embedded->Close();
  Py_END_ALLOW_THREADS;
}

void WorkerDealloc(WorkerObject* self) {
  WorkerClose(self);
  if (self->embedded == nullptr || self->embedded->OwnedHere()) {
    delete self->embedded;
  }
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyObject* WorkerCloseMethod(WorkerObject* self, PyObject*) {
  WorkerClose(self);
  Py_RETURN_NONE;
}

EmbeddedWorker* Started(WorkerObject* self) {
  if (self->embedded == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "Worker: not started");
  }
  return self->embedded;
}

PyObject* WorkerAddress(WorkerObject* self, void*) {
  EmbeddedWorker* embedded = Started(self);
  if (embedded == nullptr) return nullptr;
  return PyUnicode_FromString(embedded->worker().runtime().address().c_str());
}

PyObject* WorkerName(WorkerObject* self, void*) {
  EmbeddedWorker* embedded = Started(self);
  if (embedded == nullptr) return nullptr;
  return PyUnicode_FromString(embedded->worker().runtime().name().c_str());
}

PyObject* WorkerCalls(WorkerObject* self, PyObject*) {
  EmbeddedWorker* embedded = Started(self);
  if (embedded == nullptr) return nullptr;
  return NewCalls(reinterpret_cast<PyObject*>(self), embedded);
}

PyObject* WorkerEmulatedMemory(WorkerObject* self, PyObject* args) {
  int device = 0;
  unsigned long long bytes = 0;
  if (!PyArg_ParseTuple(args, "iK:emulated_memory", &device, &bytes)) {
    return nullptr;
  }
  EmbeddedWorker* embedded = Started(self);
  if (embedded == nullptr) return nullptr;
  if (embedded->emulated() == nullptr) {
    PyErr_SetString(PyExc_ValueError,
                    "emulated_memory: this Worker has no emulated GPUs "
                    "(start it with emulated_gpus=N)");
    return nullptr;
  }
  return NewEmulatedMemory(embedded->emulated(), device, bytes);
}

PyGetSetDef kWorkerGetSet[] = {
    {"address", reinterpret_cast<getter>(WorkerAddress), nullptr,
     "The address its peers reach its data plane at.", nullptr},
    {"name", reinterpret_cast<getter>(WorkerName), nullptr,
     "The name it registered under.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyMethodDef kWorkerMethods[] = {
    {"calls", reinterpret_cast<PyCFunction>(WorkerCalls), METH_NOARGS,
     "calls() -> Calls\n\nA new channel for collective frames."},
    {"emulated_memory", reinterpret_cast<PyCFunction>(WorkerEmulatedMemory),
     METH_VARARGS,
     "emulated_memory(device, nbytes) -> EmulatedMemory\n\n`nbytes` of the "
     "memory of emulated GPU Cuda(device) (a Worker started with "
     "emulated_gpus). Raises ValueError without such a GPU, MemoryError "
     "when its memory (1 GiB) is used up."},
    {"close", reinterpret_cast<PyCFunction>(WorkerCloseMethod), METH_NOARGS,
     "close() -> None\n\nDeregisters and stops serving; calls still waiting "
     "end. Idempotent."},
    {nullptr, nullptr, 0, nullptr},
};

PyTypeObject kWorkerType = {PyVarObject_HEAD_INIT(nullptr, 0)};

}  // namespace

bool AddWorkerType(PyObject* module) {
  kWorkerType.tp_name = "chorus._embedded.Worker";
  kWorkerType.tp_basicsize = sizeof(WorkerObject);
  kWorkerType.tp_dealloc = reinterpret_cast<destructor>(WorkerDealloc);
  kWorkerType.tp_flags = Py_TPFLAGS_DEFAULT;
  kWorkerType.tp_doc =
      "Worker(coordinator, local_socket, listen='127.0.0.1:0', "
      "advertise_address='', name='', register_timeout=30, "
      "max_tensor_bytes=..., max_shared_bytes=..., tls_dir='', "
      "emulated_gpus=0)\n\nA worker "
      "runtime in this process, registered with `coordinator`, serving its "
      "local API on the Unix socket `local_socket`; with tls_dir (ca.pem, "
      "cert.pem and key.pem of a chorus://worker/NAME certificate) over "
      "mutual TLS, which is then on for every worker of the process. With "
      "emulated_gpus=N it registers N GPUs emulated in host memory instead "
      "of this machine's (for tests of device code without a GPU; "
      "emulated_memory() allocates their memory). Raises "
      "RuntimeError with (code, message) when it cannot start.";
  kWorkerType.tp_methods = kWorkerMethods;
  kWorkerType.tp_getset = kWorkerGetSet;
  kWorkerType.tp_init = reinterpret_cast<initproc>(WorkerInit);
  kWorkerType.tp_new = WorkerNew;
  if (PyType_Ready(&kWorkerType) < 0) return false;
  Py_INCREF(&kWorkerType);
  if (PyModule_AddObject(module, "Worker",
                         reinterpret_cast<PyObject*>(&kWorkerType)) < 0) {
    Py_DECREF(&kWorkerType);
    return false;
  }
  return true;
}

}  // namespace chorus
