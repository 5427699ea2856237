// Admission of chorus._embedded's workers into this process, and the
// process's TLS that goes with it. Mutual TLS (EnableTls) is on for every
// channel and server of a process once it is on, and cannot be turned off:
// so it goes on only before any embedded worker runs, with the tls_dir of
// the first worker that names one, and every later worker must name the
// same directory (or none while TLS is off).
//
// Lifecycle: one count of live workers for the process; AdmitWorker() adds
// a worker and WorkerGone() takes it away.
// Thread safety: thread-safe; neither needs the GIL (and AdmitWorker() may
// wait on a lock, so call it without).
#ifndef CHORUS_CLIENT_PYTHON_EMBEDDED_TLS_ADMISSION_H_
#define CHORUS_CLIENT_PYTHON_EMBEDDED_TLS_ADMISSION_H_

#include <string>

#include "absl/status/status.h"

namespace chorus {

// Admits a new worker of this process with `tls_dir` ("" for plaintext):
// turns TLS on with its files if it is the first with one, and checks
// `*name` against the certificate (taking the certificate's name when
// empty). On OK the worker counts as live until WorkerGone(). Returns
// FAILED_PRECONDITION when the process's TLS cannot be what is asked (TLS
// is on with other files, or off with a worker running), INVALID_ARGUMENT
// for files that are not a worker's valid certificate and key.
absl::Status AdmitWorker(const std::string& tls_dir, std::string* name);

// A worker AdmitWorker() let in stopped.
void WorkerGone();

}  // namespace chorus

#endif  // CHORUS_CLIENT_PYTHON_EMBEDDED_TLS_ADMISSION_H_
