#include "client/python/embedded/emulated_memory.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace chorus {
namespace {

struct MemoryObject {
  PyObject ob_base;  // what PyObject_HEAD declares
  std::shared_ptr<EmulatedDeviceRuntime>* runtime;
  int device;
  void* memory;
  uint64_t bytes;
};

PyTypeObject kMemoryType = {PyVarObject_HEAD_INIT(nullptr, 0)};

void MemoryDealloc(MemoryObject* self) {
  if (self->runtime != nullptr) {
    if (self->memory != nullptr) {
      (*self->runtime)->FreeDevice(self->device, self->memory);
    }
    delete self->runtime;
  }
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

int MemoryGetBuffer(MemoryObject* self, Py_buffer* view, int flags) {
  return PyBuffer_FillInfo(view, reinterpret_cast<PyObject*>(self),
                           self->memory, static_cast<Py_ssize_t>(self->bytes),
                           /*readonly=*/0, flags);
}

PyObject* MemoryPointer(MemoryObject* self, void*) {
  return PyLong_FromUnsignedLongLong(static_cast<unsigned long long>(
      reinterpret_cast<uintptr_t>(self->memory)));
}

PyObject* MemoryDevice(MemoryObject* self, void*) {
  return PyLong_FromLong(self->device);
}

PyObject* MemoryBytes(MemoryObject* self, void*) {
  return PyLong_FromUnsignedLongLong(self->bytes);
}

PyGetSetDef kMemoryGetSet[] = {
    {"pointer", reinterpret_cast<getter>(MemoryPointer), nullptr,
     "Its device address, as a call takes it.", nullptr},
    {"device", reinterpret_cast<getter>(MemoryDevice), nullptr,
     "The index n of the emulated GPU Cuda(n) it is on.", nullptr},
    {"nbytes", reinterpret_cast<getter>(MemoryBytes), nullptr,
     "Its size in bytes.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyBufferProcs kMemoryBuffer = {reinterpret_cast<getbufferproc>(MemoryGetBuffer),
                               nullptr};

}  // namespace

PyObject* NewEmulatedMemory(std::shared_ptr<EmulatedDeviceRuntime> runtime,
                            int device, uint64_t bytes) {
  const std::optional<std::vector<Device>> gpus = runtime->Gpus();
  if (device < 0 || !gpus.has_value() ||
      device >= static_cast<int>(gpus->size())) {
    PyErr_Format(PyExc_ValueError, "emulated_memory: no emulated GPU %d",
                 device);
    return nullptr;
  }
  absl::StatusOr<void*> memory = runtime->AllocDevice(device, bytes);
  if (!memory.ok()) {
    const std::string why(memory.status().message());
    PyErr_SetString(PyExc_MemoryError, why.c_str());
    return nullptr;
  }
  auto* self =
      reinterpret_cast<MemoryObject*>(kMemoryType.tp_alloc(&kMemoryType, 0));
  if (self == nullptr) {
    runtime->FreeDevice(device, *memory);
    return nullptr;
  }
  self->runtime =
      new std::shared_ptr<EmulatedDeviceRuntime>(std::move(runtime));
  self->device = device;
  self->memory = *memory;
  self->bytes = bytes;
  return reinterpret_cast<PyObject*>(self);
}

bool AddEmulatedMemoryType(PyObject* module) {
  kMemoryType.tp_name = "chorus._embedded.EmulatedMemory";
  kMemoryType.tp_basicsize = sizeof(MemoryObject);
  kMemoryType.tp_dealloc = reinterpret_cast<destructor>(MemoryDealloc);
  kMemoryType.tp_flags = Py_TPFLAGS_DEFAULT;
  kMemoryType.tp_doc =
      "Memory of an emulated GPU, made by Worker.emulated_memory(): "
      "`pointer` is its device address, its buffer the same bytes.";
  kMemoryType.tp_getset = kMemoryGetSet;
  kMemoryType.tp_as_buffer = &kMemoryBuffer;
  if (PyType_Ready(&kMemoryType) < 0) return false;
  Py_INCREF(&kMemoryType);
  if (PyModule_AddObject(module, "EmulatedMemory",
                         reinterpret_cast<PyObject*>(&kMemoryType)) < 0) {
    Py_DECREF(&kMemoryType);
    return false;
  }
  return true;
}

}  // namespace chorus
