// The device entries of chorus._embedded.Calls (embedded_calls.h):
// run_on_device() and start_on_device() run a collective on buffers in a
// GPU's memory (InProcessDoor::RunOnDevice, StartOnDevice), ordered on the
// caller's CUDA stream, for a Python rank that embeds the runtime (the
// communicator's OnDevice route, chorus._embedded_routes).
//
// Thread safety: call with the GIL held; the entries release it while the
// call runs (run_on_device) or starts (start_on_device).
#ifndef CHORUS_CLIENT_PYTHON_EMBEDDED_DEVICE_CALLS_H_
#define CHORUS_CLIENT_PYTHON_EMBEDDED_DEVICE_CALLS_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace chorus {

// Calls.run_on_device(call_id, timeout_us, prefix, sequence, input,
// output, stream) -> True | tuple: runs the request `prefix` as number
// `sequence` on this thread on device memory at the addresses `input` and
// `output` (0: none), after the work on the CUDA stream `stream` (0: none)
// and ordered before what is enqueued there later. Returns True once it
// succeeded, else its reply tuple. Raises OSError once the channel or its
// worker closed, ValueError for call_id 0 or a prefix that does not parse,
// TypeError or OverflowError for other arguments.
PyObject* CallsRunOnDevice(PyObject* self, PyObject* const* args,
                           Py_ssize_t nargs);

// Calls.start_on_device(...) -> None: as run_on_device(), without waiting:
// the call runs on the worker's threads and its reply is queued as
// start_into()'s. The caller keeps the memory alive until that reply came.
PyObject* CallsStartOnDevice(PyObject* self, PyObject* const* args,
                             Py_ssize_t nargs);

}  // namespace chorus

#endif  // CHORUS_CLIENT_PYTHON_EMBEDDED_DEVICE_CALLS_H_
