// chorus._embedded.AllReduceHere: a Communicator's blocking all_reduce of
// numpy arrays through its embedded worker in one call from Python
// (all_reduce_here.cc says what it takes and returns).
#ifndef CHORUS_CLIENT_PYTHON_EMBEDDED_ALL_REDUCE_HERE_H_
#define CHORUS_CLIENT_PYTHON_EMBEDDED_ALL_REDUCE_HERE_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace chorus {

// Readies the AllReduceHere type and adds it to `module`. Returns false
// with a Python error when it cannot.
bool AddAllReduceHere(PyObject* module);

}  // namespace chorus

#endif  // CHORUS_CLIENT_PYTHON_EMBEDDED_ALL_REDUCE_HERE_H_
