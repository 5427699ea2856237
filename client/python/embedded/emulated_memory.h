// chorus._embedded.EmulatedMemory: a block of an emulated GPU's memory
// (EmulatedDeviceRuntime) that Worker.emulated_memory() allocates, so that
// Python tests run device calls on machines without a GPU. Its `pointer` is
// the device address a call takes; its buffer (the buffer protocol, bytes)
// is the same memory seen from the host, which is what an emulated GPU's
// memory is.
//
// Lifecycle: freed when the object goes; it holds the emulated runtime, so
// it may outlive its Worker.
// Thread safety: call with the GIL held.
#ifndef CHORUS_CLIENT_PYTHON_EMBEDDED_EMULATED_MEMORY_H_
#define CHORUS_CLIENT_PYTHON_EMBEDDED_EMULATED_MEMORY_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <memory>

#include "server/worker/gpu/emulated_device_runtime.h"

namespace chorus {

// Readies the EmulatedMemory type and adds it to `module`. Returns false
// with a Python error when it cannot.
bool AddEmulatedMemoryType(PyObject* module);

// Returns a new EmulatedMemory of `bytes` bytes on GPU `device` of
// `runtime`; null with ValueError for a device it does not have, or
// MemoryError when the device's memory is used up.
PyObject* NewEmulatedMemory(std::shared_ptr<EmulatedDeviceRuntime> runtime,
                            int device, uint64_t bytes);

}  // namespace chorus

#endif  // CHORUS_CLIENT_PYTHON_EMBEDDED_EMULATED_MEMORY_H_
