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
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "chorus/v1/worker.grpc.pb.h"
#include "chorus/v1/worker.pb.h"
#include "client/python/embedded/all_reduce_here.h"
#include "client/python/embedded/embedded_calls.h"
#include "glog/logging.h"
#include "server/common/certificate_check.h"
#include "server/common/device.h"
#include "server/common/transport_security.h"
#include "server/worker/local/in_process_door.h"
#include "server/worker/local/local_worker.h"

namespace chorus {

// Filled in by PyInit__embedded.
PyTypeObject kCallsType = {PyVarObject_HEAD_INIT(nullptr, 0)};

namespace {

// A reply as the Python side reads it (chorus._frames' tuple).
struct QueuedReply {
  uint64_t call_id = 0;
  int code = 0;
  std::string message;
  std::string details;
  std::string data;
  int64_t algorithm = 0;
  uint64_t chunk_bytes = 0;
};

// The replies of one Calls channel, until a Python thread takes them.
// Thread-safe; shared by the channel and the calls it has in flight.
class ReplyQueue {
 public:
  ReplyQueue() : event_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
  ~ReplyQueue() {
    if (event_fd_ >= 0) close(event_fd_);
  }
  ReplyQueue(const ReplyQueue&) = delete;
  ReplyQueue& operator=(const ReplyQueue&) = delete;

  int event_fd() const { return event_fd_; }

  // Queues a reply (dropped once closed).
  void Push(QueuedReply reply) {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    if (replies_.empty()) Signal();
    replies_.push_back(std::move(reply));
  }

  // Moves every queued reply to `out`, waiting until there is one, the
  // queue closed or `deadline` passed. Returns false when it closed and
  // nothing was left.
  bool Take(absl::Time deadline, std::deque<QueuedReply>* out) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithDeadline(absl::Condition(this, &ReplyQueue::Ready), deadline);
    if (replies_.empty()) return !closed_;
    out->swap(replies_);
    replies_.clear();
    Clear();
    return true;
  }

  // Wakes every waiter for good; later replies are dropped. Idempotent.
  void Close() {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    Signal();
  }

  bool closed() const {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

 private:
  bool Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || !replies_.empty();
  }
  // Makes the eventfd readable / not readable.
  void Signal() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t one = 1;
    (void)!write(event_fd_, &one, sizeof(one));
  }
  void Clear() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (closed_) return;  // stays readable: select() sees the end
    uint64_t value;
    (void)!read(event_fd_, &value, sizeof(value));
  }

  const int event_fd_;
  mutable absl::Mutex mu_;
  std::deque<QueuedReply> replies_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

void WorkerGone();

// Forks this process is down from the one that loaded the module: each
// fork's child adds one (pthread_atfork), so that telling a fork apart
// costs no system call per collective.
std::atomic<uint64_t> forks_below{0};

void CountFork() { forks_below.fetch_add(1, std::memory_order_relaxed); }

// The runtime and its local API, with the channels made from them.
struct Embedded {
  // The process that started it, in forks. A child forked from it has none
  // of its threads: there the objects are left alone (closing would wait
  // for threads that do not exist, and the socket is the parent's).
  const uint64_t owner = forks_below.load(std::memory_order_relaxed);
  std::unique_ptr<LocalWorker> worker;
  absl::Mutex mu;
  std::vector<std::weak_ptr<ReplyQueue>> queues ABSL_GUARDED_BY(mu);
  bool closed ABSL_GUARDED_BY(mu) = false;

  bool OwnedHere() const {
    return forks_below.load(std::memory_order_relaxed) == owner;
  }

  void Close() {
    std::vector<std::weak_ptr<ReplyQueue>> queues_now;
    {
      absl::MutexLock lock(&mu);
      if (closed) return;
      closed = true;
      queues_now.swap(queues);
    }
    worker->Shutdown();
    WorkerGone();
    for (const std::weak_ptr<ReplyQueue>& weak : queues_now) {
      if (std::shared_ptr<ReplyQueue> queue = weak.lock()) queue->Close();
    }
  }
};

// The workers of this process. Mutual TLS (EnableTls) is on for every
// channel and server of the process once on, so it goes on only before any
// worker runs, and every later worker uses the same files.
struct LiveWorkers {
  absl::Mutex mu;
  // Workers started and not closed.
  int count ABSL_GUARDED_BY(mu) = 0;
};

LiveWorkers& Live() {
  static LiveWorkers* const live = new LiveWorkers();
  return *live;
}

// The tls_dir TLS is on with in this process; "" while it is off. (TLS
// goes on here only, with TlsFilesInDir().)
std::string ActiveTlsDir() {
  if (!TlsEnabled()) return "";
  return std::filesystem::path(ActiveTlsFiles().cert_path)
      .parent_path()
      .string();
}

// Checks that the certificate of `files` is a worker's, before TLS goes on
// with it (which cannot be undone). Leaves other problems of the files to
// EnableTls, which names them.
absl::Status CheckWorkerCertificate(const TlsFiles& files) {
  absl::StatusOr<std::vector<std::string>> uris =
      CheckCertificateFiles(files.ca_path, files.cert_path, files.key_path);
  if (!uris.ok()) return absl::OkStatus();
  std::vector<Identity> identities;
  for (const std::string& uri : *uris) {
    absl::StatusOr<Identity> identity = ParseIdentityUri(uri);
    if (identity.ok()) identities.push_back(*identity);
  }
  if (identities.size() == 1 && identities[0].role != Role::kWorker) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the TLS certificate ", files.cert_path, " names ", identities[0].Uri(),
        "; a worker needs chorus://worker/NAME"));
  }
  return absl::OkStatus();
}

// Admits a new worker of this process with `tls_dir` ("" for plaintext):
// turns TLS on with its files if it is the first with one, and checks
// `*name` against the certificate (taking the certificate's name when
// empty). On OK the worker counts as live until WorkerGone(). Returns
// FAILED_PRECONDITION when the process's TLS cannot be what is asked (TLS
// is on with other files, or off with a worker running), INVALID_ARGUMENT
// for files that are not a worker's valid certificate and key.
absl::Status AdmitWorker(const std::string& tls_dir, std::string* name) {
  LiveWorkers& live = Live();
  absl::MutexLock lock(&live.mu);
  const std::string active = ActiveTlsDir();
  if (tls_dir.empty() && !active.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "TLS is on in this process (an embedded worker started with "
        "tls_dir=",
        active, "); every embedded worker of a process passes that tls_dir"));
  }
  if (!tls_dir.empty()) {
    if (active.empty()) {
      if (live.count > 0) {
        return absl::FailedPreconditionError(
            "an embedded worker without TLS runs in this process; TLS goes "
            "on for the whole process, so close it first");
      }
      const TlsFiles files = TlsFilesInDir(tls_dir);
      absl::Status checked = CheckWorkerCertificate(files);
      if (!checked.ok()) return checked;
      absl::StatusOr<Identity> enabled = EnableTls(files);
      if (!enabled.ok()) return enabled.status();
    } else if (active != tls_dir) {
      return absl::FailedPreconditionError(absl::StrCat(
          "TLS is on in this process with tls_dir=", active,
          "; every embedded worker of a process passes that tls_dir, not ",
          tls_dir));
    }
    // A worker's: CheckWorkerCertificate let no other identity in.
    const Identity& identity = OwnIdentity();
    if (name->empty()) *name = identity.name;
    if (*name != identity.name) {
      return absl::InvalidArgumentError(absl::StrCat(
          "name ", *name, " but the TLS certificate names ", identity.Uri(),
          "; the coordinator would refuse the registration"));
    }
  }
  ++live.count;
  return absl::OkStatus();
}

// A worker AdmitWorker() let in stopped.
void WorkerGone() {
  LiveWorkers& live = Live();
  absl::MutexLock lock(&live.mu);
  --live.count;
}

// Raises RuntimeError((code, message)), which chorus.embedded turns into
// the chorus.Error of that code.
PyObject* RaiseStatus(const absl::Status& status) {
  PyObject* error = Py_BuildValue(
      "(is#)", static_cast<int>(status.code()), status.message().data(),
      static_cast<Py_ssize_t>(status.message().size()));
  if (error != nullptr) {
    PyErr_SetObject(PyExc_RuntimeError, error);
    Py_DECREF(error);
  }
  return nullptr;
}

// ---- Worker ---------------------------------------------------------------

struct WorkerObject {
  PyObject ob_base;  // what PyObject_HEAD declares
  Embedded* embedded;
};

PyObject* WorkerNew(PyTypeObject* type, PyObject*, PyObject*) {
  auto* self = reinterpret_cast<WorkerObject*>(type->tp_alloc(type, 0));
  if (self != nullptr) self->embedded = nullptr;
  return reinterpret_cast<PyObject*>(self);
}

// Starts a worker of `options` into `embedded` and registers it. Returns
// LocalWorker::Start's errors.
absl::Status StartEmbedded(RuntimeOptions* options, uint64_t max_tensor_bytes,
                           uint64_t max_shared_bytes, Embedded* embedded) {
  LocalWorkerOptions worker;
  worker.runtime = *options;
  worker.max_tensor_bytes = max_tensor_bytes;
  worker.max_shared_bytes = max_shared_bytes;
  absl::StatusOr<std::unique_ptr<LocalWorker>> started =
      LocalWorker::Start(std::move(worker));
  if (!started.ok()) return started.status();
  embedded->worker = *std::move(started);
  return absl::OkStatus();
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
  if (!PyArg_ParseTupleAndKeywords(
          args, kwargs, "ss|sssdKKs:Worker", const_cast<char**>(kKeywords),
          &coordinator, &local_socket, &listen, &advertise, &name,
          &register_timeout, &max_tensor_bytes, &max_shared_bytes, &tls_dir)) {
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
  RuntimeOptions options;
  options.coordinator = coordinator;
  options.unix_socket_path = local_socket;
  options.listen = listen;
  options.advertise_address = advertise;
  options.name = name;
  options.register_timeout = absl::Seconds(register_timeout);
  auto embedded = std::make_unique<Embedded>();
  absl::Status status;
  Py_BEGIN_ALLOW_THREADS;
  status = AdmitWorker(tls_dir, &options.name);
  if (status.ok()) {
    status = StartEmbedded(&options, max_tensor_bytes, max_shared_bytes,
                           embedded.get());
    if (!status.ok()) WorkerGone();
  }
  Py_END_ALLOW_THREADS;
  if (!status.ok()) {
    RaiseStatus(status);
    return -1;
  }
  self->embedded = embedded.release();
  return 0;
}

void WorkerClose(WorkerObject* self) {
  if (self->embedded == nullptr || !self->embedded->OwnedHere()) return;
  Embedded* embedded = self->embedded;
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

Embedded* Started(WorkerObject* self) {
  if (self->embedded == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "Worker: not started");
  }
  return self->embedded;
}

PyObject* WorkerAddress(WorkerObject* self, void*) {
  Embedded* embedded = Started(self);
  if (embedded == nullptr) return nullptr;
  return PyUnicode_FromString(embedded->worker->runtime().address().c_str());
}

PyObject* WorkerName(WorkerObject* self, void*) {
  Embedded* embedded = Started(self);
  if (embedded == nullptr) return nullptr;
  return PyUnicode_FromString(embedded->worker->runtime().name().c_str());
}

PyObject* WorkerCalls(WorkerObject* self, PyObject*);

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
    {"close", reinterpret_cast<PyCFunction>(WorkerCloseMethod), METH_NOARGS,
     "close() -> None\n\nDeregisters and stops serving; calls still waiting "
     "end. Idempotent."},
    {nullptr, nullptr, 0, nullptr},
};

PyTypeObject kWorkerType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// ---- Calls ----------------------------------------------------------------

// The buffers of an asynchronous call on its caller's memory
// (Calls.start_into), held until its reply was taken (with the GIL).
struct HeldCall {
  Py_buffer data;
  Py_buffer out;
  // The call ended (set on a worker thread before its reply is queued):
  // nothing writes to `out` any more.
  std::atomic<bool> ended{false};
};

struct CallsObject {
  PyObject ob_base;  // what PyObject_HEAD declares
  // A reference, so that the runtime outlives the channel.
  PyObject* worker;
  std::shared_ptr<ReplyQueue>* queue;
  // The held buffers of asynchronous calls on their callers' memory, by
  // call id; used with the GIL held only.
  std::map<uint64_t, std::shared_ptr<HeldCall>>* held;
};

// Releases the buffers `held` holds (with the GIL).
void ReleaseBuffers(HeldCall& held) {
  PyBuffer_Release(&held.out);
  PyBuffer_Release(&held.data);
}

PyObject* WorkerCalls(WorkerObject* self, PyObject*) {
  Embedded* embedded = Started(self);
  if (embedded == nullptr) return nullptr;
  auto queue = std::make_shared<ReplyQueue>();
  if (queue->event_fd() < 0) return PyErr_SetFromErrno(PyExc_OSError);
  {
    absl::MutexLock lock(&embedded->mu);
    if (embedded->closed) {
      errno = EPIPE;
      return PyErr_SetFromErrno(PyExc_OSError);
    }
    embedded->queues.push_back(queue);
  }
  auto* calls =
      reinterpret_cast<CallsObject*>(kCallsType.tp_alloc(&kCallsType, 0));
  if (calls == nullptr) return nullptr;
  Py_INCREF(self);
  calls->worker = reinterpret_cast<PyObject*>(self);
  calls->queue = new std::shared_ptr<ReplyQueue>(std::move(queue));
  calls->held = new std::map<uint64_t, std::shared_ptr<HeldCall>>();
  return reinterpret_cast<PyObject*>(calls);
}

Embedded* CallsEmbedded(CallsObject* self) {
  return reinterpret_cast<WorkerObject*>(self->worker)->embedded;
}

// Whether the channel's worker runs in this process (not in the parent of
// a fork); raises OSError when not.
bool CallsOwnedHere(CallsObject* self) {
  if (CallsEmbedded(self)->OwnedHere()) return true;
  PyErr_SetString(PyExc_OSError,
                  "this embedded worker runs in the process that started "
                  "it, of which this one is a fork");
  return false;
}

void CallsDealloc(CallsObject* self) {
  // In a fork, left alone as its worker is.
  if (self->queue != nullptr && CallsEmbedded(self)->OwnedHere()) {
    (*self->queue)->Close();
    delete self->queue;
    // The buffers of calls that ended go; those of a call still running
    // (its reply never taken) stay held for good, as it may still write.
    for (auto& [call_id, held] : *self->held) {
      if (held->ended.load()) ReleaseBuffers(*held);
    }
    delete self->held;
  }
  Py_XDECREF(self->worker);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyObject* CallsFileno(CallsObject* self, PyObject*) {
  return PyLong_FromLong((*self->queue)->event_fd());
}

PyObject* CallsClose(CallsObject* self, PyObject*) {
  if (!CallsEmbedded(self)->OwnedHere()) Py_RETURN_NONE;
  (*self->queue)->Close();
  // Replies are dropped from now on: the buffers of calls that ended go
  // now, the others when the channel goes.
  for (auto it = self->held->begin(); it != self->held->end();) {
    if (it->second->ended.load()) {
      ReleaseBuffers(*it->second);
      it = self->held->erase(it);
    } else {
      ++it;
    }
  }
  Py_RETURN_NONE;
}

constexpr Py_ssize_t kMaxParts = 8;

PyObject* ReplyTuple(const QueuedReply& reply);

// The reply as the Python side reads it, less its data.
QueuedReply QueueableReply(v1::LocalCallReply& answer) {
  QueuedReply reply;
  reply.call_id = answer.call_id();
  reply.code = answer.code();
  reply.message = std::move(*answer.mutable_message());
  reply.details = std::move(*answer.mutable_status_details());
  reply.algorithm = answer.response().plan().algorithm();
  reply.chunk_bytes = answer.response().plan().chunk_bytes();
  return reply;
}

// Runs `frame` into the channel's worker; the GIL must be released. Its
// reply goes to the queue.
void RunFrame(InProcessDoor* door, v1::LocalCallFrame frame,
              const std::shared_ptr<ReplyQueue>& queue) {
  door->RunFrame(std::move(frame), [queue](v1::LocalCallReply& answer) {
    QueuedReply reply = QueueableReply(answer);
    // A copy: the ledger keeps the data for retries.
    reply.data = answer.response().data();
    queue->Push(std::move(reply));
  });
}

// The deadline `timeout_us` from now.
absl::Time DeadlineIn(uint64_t timeout_us) {
  return absl::Now() + absl::Microseconds(static_cast<int64_t>(
                           std::min<uint64_t>(timeout_us, INT64_MAX)));
}

// Runs call `call_id`, `request` with `timeout_us`, on `memory` on this
// thread (LocalApiService::RunInPlace) and waits for its end; the GIL must
// be released. Returns whether it succeeded; else `*failure` is its reply.
bool RunHere(InProcessDoor* door, uint64_t call_id,
             const v1::LocalCollectiveRequest& request, uint64_t timeout_us,
             const CallerMemory& memory, QueuedReply* failure) {
  absl::Status status;
  if (timeout_us == 0) {
    status = absl::InvalidArgumentError("a call with timeout_us 0 cannot run");
  } else {
    status = door->RunInPlace(request, DeadlineIn(timeout_us), memory).status();
  }
  if (status.ok()) return true;
  v1::LocalCallReply answer = LocalCallReplyFor(call_id, status);
  *failure = QueueableReply(answer);
  return false;
}

// The channel's queue, open; null with OSError raised when the channel or
// its worker closed or belongs to the parent of this fork.
std::shared_ptr<ReplyQueue> OpenQueue(CallsObject* self) {
  if (!CallsOwnedHere(self)) return nullptr;
  std::shared_ptr<ReplyQueue> queue = *self->queue;
  if (queue->closed()) {
    errno = EPIPE;
    PyErr_SetFromErrno(PyExc_OSError);
    return nullptr;
  }
  return queue;
}

}  // namespace

bool CallsOpen(PyObject* calls) {
  const bool open = OpenQueue(reinterpret_cast<CallsObject*>(calls)) != nullptr;
  PyErr_Clear();
  return open;
}

PyObject* RunOnCalls(PyObject* calls, uint64_t call_id, uint64_t timeout_us,
                     PyObject* prefix, uint64_t sequence,
                     const CallerMemory& memory) {
  InProcessDoor* door =
      CallsEmbedded(reinterpret_cast<CallsObject*>(calls))->worker->door();
  const char* bytes = PyBytes_AS_STRING(prefix);
  const Py_ssize_t size = PyBytes_GET_SIZE(prefix);
  bool parsed = false;
  bool succeeded = false;
  QueuedReply failure;
  Py_BEGIN_ALLOW_THREADS;
  v1::LocalCollectiveRequest request;
  parsed = request.ParseFromArray(bytes, static_cast<int>(size));
  if (parsed) {
    request.set_sequence(sequence);
    succeeded = RunHere(door, call_id, request, timeout_us, memory, &failure);
  }
  Py_END_ALLOW_THREADS;
  if (!parsed) {
    PyErr_SetString(PyExc_ValueError,
                    "run_into: prefix is not a LocalCollectiveRequest");
    return nullptr;
  }
  if (succeeded) Py_RETURN_TRUE;
  return ReplyTuple(failure);
}

namespace {

PyObject* CallsSend(CallsObject* self, PyObject* args) {
  unsigned long long call_id, timeout_us;
  PyObject* parts;
  if (!PyArg_ParseTuple(args, "KKO!:send_call", &call_id, &timeout_us,
                        &PyTuple_Type, &parts)) {
    return nullptr;
  }
  const Py_ssize_t count = PyTuple_GET_SIZE(parts);
  if (count > kMaxParts) {
    PyErr_SetString(PyExc_ValueError, "send_call: too many parts");
    return nullptr;
  }
  std::shared_ptr<ReplyQueue> queue = OpenQueue(self);
  if (queue == nullptr) return nullptr;
  // The request's bytes, as a frame would carry them.
  std::string request;
  for (Py_ssize_t i = 0; i < count; ++i) {
    Py_buffer view;
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(parts, i), &view,
                           PyBUF_C_CONTIGUOUS) < 0) {
      return nullptr;
    }
    request.append(static_cast<const char*>(view.buf),
                   static_cast<size_t>(view.len));
    PyBuffer_Release(&view);
  }
  if (call_id == 0) {
    PyErr_SetString(PyExc_ValueError, "send_call: call_id 0");
    return nullptr;
  }
  InProcessDoor* door = CallsEmbedded(self)->worker->door();
  bool parsed = false;
  Py_BEGIN_ALLOW_THREADS;
  v1::LocalCallFrame frame;
  parsed = frame.mutable_call()->ParseFromString(request);
  if (parsed) {
    frame.set_call_id(call_id);
    frame.set_timeout_us(timeout_us);
    RunFrame(door, std::move(frame), queue);
  }
  Py_END_ALLOW_THREADS;
  if (!parsed) {
    PyErr_SetString(PyExc_ValueError,
                    "send_call: the parts are not a LocalCollectiveRequest");
    return nullptr;
  }
  Py_RETURN_NONE;
}

// The arguments of run_into() and start_into(): (call_id, timeout_us,
// prefix, sequence, data, out).
struct IntoArgs {
  unsigned long long call_id = 0;
  unsigned long long timeout_us = 0;
  PyObject* prefix = nullptr;  // bytes
  unsigned long long sequence = 0;
  PyObject* data = nullptr;
  PyObject* out = nullptr;
};

// Reads the arguments of method `name`. Returns false with TypeError,
// ValueError (call_id 0) or OverflowError.
bool ParseIntoArgs(const char* name, PyObject* const* args, Py_ssize_t nargs,
                   IntoArgs* into) {
  if (nargs != 6) {
    PyErr_Format(PyExc_TypeError, "%s() takes 6 arguments", name);
    return false;
  }
  into->call_id = PyLong_AsUnsignedLongLong(args[0]);
  into->timeout_us = PyLong_AsUnsignedLongLong(args[1]);
  into->sequence = PyLong_AsUnsignedLongLong(args[3]);
  if (PyErr_Occurred()) return false;
  if (!PyBytes_Check(args[2])) {
    PyErr_Format(PyExc_TypeError, "%s: prefix must be bytes", name);
    return false;
  }
  if (into->call_id == 0) {
    PyErr_Format(PyExc_ValueError, "%s: call_id 0", name);
    return false;
  }
  into->prefix = args[2];
  into->data = args[4];
  into->out = args[5];
  return true;
}

// Takes the buffers of `into`: its data C-contiguous, its out writable too.
// Returns false, holding neither, with the buffers' error.
bool GetIntoBuffers(const IntoArgs& into, Py_buffer* data, Py_buffer* out) {
  if (PyObject_GetBuffer(into.data, data, PyBUF_C_CONTIGUOUS) < 0) {
    return false;
  }
  if (PyObject_GetBuffer(into.out, out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) <
      0) {
    PyBuffer_Release(data);
    return false;
  }
  return true;
}

// The caller's memory a call reads `data` from and writes `out` into.
CallerMemory MemoryOf(const Py_buffer& data, const Py_buffer& out) {
  return CallerMemory{absl::string_view(static_cast<const char*>(data.buf),
                                        static_cast<size_t>(data.len)),
                      absl::Span<char>(static_cast<char*>(out.buf),
                                       static_cast<size_t>(out.len))};
}

// run_into(): the request `prefix` with `sequence`, run on this thread on
// the buffers `data` and `out` themselves.
PyObject* CallsRunInto(CallsObject* self, PyObject* const* args,
                       Py_ssize_t nargs) {
  IntoArgs into;
  if (!ParseIntoArgs("run_into", args, nargs, &into)) return nullptr;
  std::shared_ptr<ReplyQueue> queue = OpenQueue(self);
  if (queue == nullptr) return nullptr;
  Py_buffer data, out;
  if (!GetIntoBuffers(into, &data, &out)) return nullptr;
  PyObject* ran = RunOnCalls(reinterpret_cast<PyObject*>(self), into.call_id,
                             into.timeout_us, into.prefix, into.sequence,
                             MemoryOf(data, out));
  PyBuffer_Release(&out);
  PyBuffer_Release(&data);
  return ran;
}

// start_into(): as run_into(), but the call runs on the worker's threads
// and its reply is queued; the buffers stay held until it was taken.
PyObject* CallsStartInto(CallsObject* self, PyObject* const* args,
                         Py_ssize_t nargs) {
  IntoArgs into;
  if (!ParseIntoArgs("start_into", args, nargs, &into)) return nullptr;
  if (self->held->count(into.call_id) != 0) {
    PyErr_SetString(PyExc_ValueError, "start_into: call_id still running");
    return nullptr;
  }
  std::shared_ptr<ReplyQueue> queue = OpenQueue(self);
  if (queue == nullptr) return nullptr;
  v1::LocalCollectiveRequest request;
  if (!request.ParseFromArray(
          PyBytes_AS_STRING(into.prefix),
          static_cast<int>(PyBytes_GET_SIZE(into.prefix)))) {
    PyErr_SetString(PyExc_ValueError,
                    "start_into: prefix is not a LocalCollectiveRequest");
    return nullptr;
  }
  request.set_sequence(into.sequence);
  auto held = std::make_shared<HeldCall>();
  if (!GetIntoBuffers(into, &held->data, &held->out)) return nullptr;
  const uint64_t call_id = into.call_id;
  (*self->held)[call_id] = held;
  const CallerMemory memory = MemoryOf(held->data, held->out);
  InProcessDoor* door = CallsEmbedded(self)->worker->door();
  // Queues the call's reply once it ended, its buffers then free to go.
  auto end = [queue, held, call_id](absl::StatusOr<RunResult> result) {
    v1::LocalCallReply answer = LocalCallReplyFor(call_id, result.status());
    if (result.ok()) {
      answer.mutable_response()->set_sequence(result->sequence);
      ToPlanProto(*result, answer.mutable_response()->mutable_plan());
    }
    QueuedReply reply = QueueableReply(answer);
    held->ended.store(true);
    queue->Push(std::move(reply));
  };
  const unsigned long long timeout_us = into.timeout_us;
  Py_BEGIN_ALLOW_THREADS;
  if (timeout_us == 0) {
    end(absl::InvalidArgumentError("a call with timeout_us 0 cannot run"));
  } else {
    door->StartInPlace(request, DeadlineIn(timeout_us), memory, std::move(end));
  }
  Py_END_ALLOW_THREADS;
  Py_RETURN_NONE;
}

PyObject* ReplyTuple(const QueuedReply& reply) {
  return Py_BuildValue(
      "(KiNy#y#LK)", static_cast<unsigned long long>(reply.call_id), reply.code,
      PyUnicode_DecodeUTF8(reply.message.data(),
                           static_cast<Py_ssize_t>(reply.message.size()),
                           "replace"),
      reply.details.data(), static_cast<Py_ssize_t>(reply.details.size()),
      reply.data.data(), static_cast<Py_ssize_t>(reply.data.size()),
      static_cast<long long>(reply.algorithm),
      static_cast<unsigned long long>(reply.chunk_bytes));
}

// Hands the replies in `taken` to on_reply, except the one to `wanted`
// (0: none), which goes to `*mine`. Returns -1 on a Python error, 0 when
// on_reply said stop, else 1. Replies after a stop are dropped, as a
// socket's connection would close then.
int Dispatch(CallsObject* self, std::deque<QueuedReply>& taken, uint64_t wanted,
             PyObject* on_reply, PyObject** mine) {
  // The buffers of calls that replied go first, whatever happens next.
  for (const QueuedReply& reply : taken) {
    auto it = self->held->find(reply.call_id);
    if (it != self->held->end() && it->second->ended.load()) {
      ReleaseBuffers(*it->second);
      self->held->erase(it);
    }
  }
  int outcome = 1;
  for (QueuedReply& reply : taken) {
    if (outcome != 1) break;
    PyObject* tuple = ReplyTuple(reply);
    if (tuple == nullptr) return -1;
    if (wanted != 0 && reply.call_id == wanted && *mine == nullptr) {
      *mine = tuple;
      continue;
    }
    PyObject* go_on = PyObject_CallOneArg(on_reply, tuple);
    Py_DECREF(tuple);
    if (go_on == nullptr) return -1;
    const int truth = PyObject_IsTrue(go_on);
    Py_DECREF(go_on);
    if (truth < 0) return -1;
    if (!truth) outcome = 0;
  }
  return outcome;
}

PyObject* CallsWait(CallsObject* self, PyObject* args) {
  unsigned long long wanted;
  double seconds;
  PyObject* on_reply;
  if (!PyArg_ParseTuple(args, "KdO:wait", &wanted, &seconds, &on_reply)) {
    return nullptr;
  }
  const absl::Time deadline =
      absl::Now() + (std::isfinite(seconds) ? absl::Seconds(seconds)
                                            : absl::InfiniteDuration());
  if (!CallsOwnedHere(self)) return nullptr;
  std::shared_ptr<ReplyQueue> queue = *self->queue;
  for (;;) {
    std::deque<QueuedReply> taken;
    bool open = true;
    Py_BEGIN_ALLOW_THREADS;
    open = queue->Take(deadline, &taken);
    Py_END_ALLOW_THREADS;
    if (!open) Py_RETURN_FALSE;
    if (taken.empty()) Py_RETURN_NONE;  // the deadline passed
    PyObject* mine = nullptr;
    const int dispatched = Dispatch(self, taken, wanted, on_reply, &mine);
    if (dispatched < 0) {
      Py_XDECREF(mine);
      return nullptr;
    }
    if (mine != nullptr) return mine;
    if (dispatched == 0) Py_RETURN_FALSE;
    if (PyErr_CheckSignals() < 0) return nullptr;
  }
}

PyObject* CallsDrain(CallsObject* self, PyObject* on_reply) {
  if (!CallsOwnedHere(self)) return nullptr;
  std::shared_ptr<ReplyQueue> queue = *self->queue;
  std::deque<QueuedReply> taken;
  if (!queue->Take(absl::InfinitePast(), &taken)) Py_RETURN_FALSE;
  PyObject* mine = nullptr;
  const int dispatched = Dispatch(self, taken, 0, on_reply, &mine);
  if (dispatched < 0) return nullptr;
  return PyBool_FromLong(dispatched);
}

PyMethodDef kCallsMethods[] = {
    {"send_call", reinterpret_cast<PyCFunction>(CallsSend), METH_VARARGS,
     "send_call(call_id, timeout_us, parts) -> None\n\nRuns the "
     "LocalCollectiveRequest whose bytes are `parts` (at most 8 buffers) "
     "as call `call_id`. Raises OSError once the channel or its worker "
     "closed, ValueError for parts that do not parse."},
    {"start_into",
     reinterpret_cast<PyCFunction>(
         reinterpret_cast<void (*)()>(CallsStartInto)),
     METH_FASTCALL,
     "start_into(call_id, timeout_us, prefix, sequence, data, out) -> None\n\n"
     "As run_into(), without waiting: the call runs on the worker's "
     "threads, reading `data` and writing `out` in place, and its reply "
     "comes as a send_call() call's does (wait(), drain()). The buffers "
     "stay held until that reply was taken; the caller leaves `out` alone "
     "until then. Raises OSError once the channel or its worker closed, "
     "ValueError for a call_id in use or a prefix that does not parse, and "
     "as the buffers do."},
    {"run_into",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(CallsRunInto)),
     METH_FASTCALL,
     "run_into(call_id, timeout_us, prefix, sequence, data, out) -> True | "
     "tuple\n\nRuns the LocalCollectiveRequest whose bytes are `prefix` (no "
     "sequence, no data) as number `sequence` on this thread, on the "
     "buffers themselves: the call reads its input from `data` and writes "
     "its output into the writable buffer `out` (which may be larger), "
     "with no copy; no copy of the output is kept, so a retry of the "
     "number is refused. Returns True once the call succeeded, else its "
     "reply (as wait() returns one), by its deadline at the latest. The GIL "
     "is released meanwhile; a signal is seen only after. Raises OSError "
     "once the channel or its worker closed, ValueError for a prefix that "
     "does not parse, and as the buffers do for one that is not "
     "C-contiguous or an `out` that is not writable (numpy: ValueError)."},
    {"wait", reinterpret_cast<PyCFunction>(CallsWait), METH_VARARGS,
     "wait(call_id, seconds, on_reply) -> tuple | None | False\n\nWaits "
     "until the reply to `call_id` came and returns it; every other reply "
     "goes to on_reply(reply), which returns whether to go on. Returns "
     "None when `seconds` passed first, False when the channel closed or "
     "on_reply said stop."},
    {"drain", reinterpret_cast<PyCFunction>(CallsDrain), METH_O,
     "drain(on_reply) -> bool\n\nPasses every reply waiting to "
     "on_reply(reply). Returns False when the channel closed or on_reply "
     "said stop."},
    {"fileno", reinterpret_cast<PyCFunction>(CallsFileno), METH_NOARGS,
     "fileno() -> int\n\nA descriptor readable while replies wait, or once "
     "the channel closed."},
    {"shutdown", reinterpret_cast<PyCFunction>(CallsClose), METH_NOARGS,
     "shutdown() -> None\n\nEnds the channel: waiters return False, "
     "replies still due are dropped. Idempotent."},
    {"close", reinterpret_cast<PyCFunction>(CallsClose), METH_NOARGS,
     "close() -> None\n\nAs shutdown()."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT};

}  // namespace
}  // namespace chorus

PyMODINIT_FUNC PyInit__embedded() {
  using namespace chorus;  // NOLINT: the module's own types
  // As in the daemons: absl's deadlock detection (on in Debian's build)
  // would cost every lock a graph lookup.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (pthread_atfork(nullptr, nullptr, CountFork) != 0) {
    PyErr_SetString(PyExc_OSError, "pthread_atfork failed");
    return nullptr;
  }
  if (!google::IsGoogleLoggingInitialized()) {
    // Warnings and errors only, on stderr: this is someone else's process.
    FLAGS_logtostderr = true;
    FLAGS_minloglevel = google::GLOG_WARNING;
    google::InitGoogleLogging("chorus-embedded");
  }
  kWorkerType.tp_name = "chorus._embedded.Worker";
  kWorkerType.tp_basicsize = sizeof(WorkerObject);
  kWorkerType.tp_dealloc = reinterpret_cast<destructor>(WorkerDealloc);
  kWorkerType.tp_flags = Py_TPFLAGS_DEFAULT;
  kWorkerType.tp_doc =
      "Worker(coordinator, local_socket, listen='127.0.0.1:0', "
      "advertise_address='', name='', register_timeout=30, "
      "max_tensor_bytes=..., max_shared_bytes=..., tls_dir='')\n\nA worker "
      "runtime in this process, registered with `coordinator`, serving its "
      "local API on the Unix socket `local_socket`; with tls_dir (ca.pem, "
      "cert.pem and key.pem of a chorus://worker/NAME certificate) over "
      "mutual TLS, which is then on for every worker of the process. Raises "
      "RuntimeError with (code, message) when it cannot start.";
  kWorkerType.tp_methods = kWorkerMethods;
  kWorkerType.tp_getset = kWorkerGetSet;
  kWorkerType.tp_init = reinterpret_cast<initproc>(WorkerInit);
  kWorkerType.tp_new = WorkerNew;
  kCallsType.tp_name = "chorus._embedded.Calls";
  kCallsType.tp_basicsize = sizeof(CallsObject);
  kCallsType.tp_dealloc = reinterpret_cast<destructor>(CallsDealloc);
  kCallsType.tp_flags = Py_TPFLAGS_DEFAULT;
  kCallsType.tp_doc =
      "A channel for collective frames into a Worker of this process; made "
      "by Worker.calls().";
  kCallsType.tp_methods = kCallsMethods;
  kModule.m_name = "chorus._embedded";
  kModule.m_doc = "A Chorus worker runtime inside this process.";
  kModule.m_size = -1;
  if (PyType_Ready(&kWorkerType) < 0 || PyType_Ready(&kCallsType) < 0) {
    return nullptr;
  }
  PyObject* module = PyModule_Create(&kModule);
  if (module == nullptr) return nullptr;
  Py_INCREF(&kWorkerType);
  Py_INCREF(&kCallsType);
  if (PyModule_AddObject(module, "Worker",
                         reinterpret_cast<PyObject*>(&kWorkerType)) < 0 ||
      PyModule_AddObject(module, "Calls",
                         reinterpret_cast<PyObject*>(&kCallsType)) < 0 ||
      !AddAllReduceHere(module)) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
