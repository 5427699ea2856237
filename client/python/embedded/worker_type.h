// chorus._embedded.Worker: the Python type of a worker runtime in this
// process (EmbeddedWorker). Worker(...) admits and starts one, calls()
// makes a Calls channel into it (embedded_calls.h), close() ends it.
//
// Lifecycle: a Worker serves until close() or its deallocation, which
// deregisters, stops serving and closes every Calls made from it. In a
// fork of the process that started it, close and deallocation leave it
// alone.
// Thread safety: call with the GIL held; the methods that wait release it.
#ifndef CHORUS_CLIENT_PYTHON_EMBEDDED_WORKER_TYPE_H_
#define CHORUS_CLIENT_PYTHON_EMBEDDED_WORKER_TYPE_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace chorus {

// Readies the Worker type and adds it to `module`. Returns false with a
// Python error when it cannot.
bool AddWorkerType(PyObject* module);

}  // namespace chorus

#endif  // CHORUS_CLIENT_PYTHON_EMBEDDED_WORKER_TYPE_H_
