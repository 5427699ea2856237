// chorus._embedded: a Chorus worker runtime inside a Python process, for
// ranks that cannot afford the hop to a worker daemon (DESIGN.md: "a program
// that cannot afford the extra hop to a daemon embeds the runtime").
//
// Worker(...) starts a LocalWorker (a worker runtime with its local calls)
// serving its local API on a Unix socket of the caller's choosing, and
// registers it with the coordinator: to a client it is a worker daemon that
// lives in this process. Joins and every other local API call go over that
// socket as they would to a daemon. Collectives take a shorter way:
// Worker.calls() returns a Calls channel that hands LocalCallFrames straight
// to the worker's in-process door (InProcessDoor::RunFrame, which runs them
// as the daemon's call socket does),
// with no socket in between; its replies wait in a queue until a Python
// thread takes them. So every check, code and error detail is the daemon's.
//
// Calls has the methods of the call socket's connection that
// chorus._call_socket drives (its Connection: send_call, wait, drain, fileno,
// shutdown, close): fileno() is an eventfd that is readable while replies
// wait, for select(). run_into() is for a blocking call: the caller's own
// thread runs it (InProcessDoor::RunInPlace, which reads the
// coordinator's reply itself) on the caller's buffers (CallerMemory: the
// runtime reads the input and writes the output there) and gets its
// outcome back directly.
//
// The parts: the Worker type (worker_type.h) and the runtime it holds
// (embedded_worker.h), admitted with the process's TLS (tls_admission.h);
// the Calls type (embedded_calls.h) and its ReplyQueue (reply_queue.h);
// AllReduceHere (all_reduce_here.h). This file makes the module of them.
//
// Lifecycle: a Worker serves until close() (or its deallocation), which
// deregisters, stops serving and closes every Calls made from it (their
// waiters return False, and send_call raises OSError). In a fork of the
// process that started it (which has none of its threads) close and
// deallocation leave it alone and its channels raise OSError.
// Thread safety: every method may be called from any Python thread; waits
// release the GIL.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>

#include "absl/synchronization/mutex.h"
#include "client/python/embedded/all_reduce_here.h"
#include "client/python/embedded/embedded_calls.h"
#include "client/python/embedded/embedded_worker.h"
#include "client/python/embedded/emulated_memory.h"
#include "client/python/embedded/worker_type.h"
#include "glog/logging.h"

namespace {

PyModuleDef kModule = {PyModuleDef_HEAD_INIT};

}  // namespace

PyMODINIT_FUNC PyInit__embedded() {
  // As in the daemons: absl's deadlock detection (on in Debian's build)
  // would cost every lock a graph lookup.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (pthread_atfork(nullptr, nullptr, chorus::CountFork) != 0) {
    PyErr_SetString(PyExc_OSError, "pthread_atfork failed");
    return nullptr;
  }
  if (!google::IsGoogleLoggingInitialized()) {
    // Warnings and errors only, on stderr: this is someone else's process.
    FLAGS_logtostderr = true;
    FLAGS_minloglevel = google::GLOG_WARNING;
    google::InitGoogleLogging("chorus-embedded");
  }
  kModule.m_name = "chorus._embedded";
  kModule.m_doc = "A Chorus worker runtime inside this process.";
  kModule.m_size = -1;
  PyObject* module = PyModule_Create(&kModule);
  if (module == nullptr) return nullptr;
  if (!chorus::AddWorkerType(module) || !chorus::AddCallsType(module) ||
      !chorus::AddAllReduceHere(module) ||
      !chorus::AddEmulatedMemoryType(module)) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
