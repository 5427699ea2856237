/*
 * chorus._frames: the frames of a worker daemon's call socket, written and
 * read without the interpreter.
 *
 * A small collective through the call socket is one LocalCallFrame written
 * and one LocalCallReply read (worker.proto). Building, sending, receiving
 * and parsing those in Python took most of a small call's CPU in the client;
 * here they take a few system calls and no Python objects beyond the reply's
 * fields.
 *
 * send_call() writes one frame around a request whose bytes the caller
 * made: chorus/_wire.py, beside this file, is the one Python copy of the
 * request's encoding (varints, tags, the prefix+sequence+data parts), and
 * this file writes only the frame's own fields (call id, timeout, the
 * request's tag and length) and parses the replies: the fast path.
 *
 * send_call() writes one frame. A Reader owns the receiving end's buffer:
 * wait() reads until the reply to one call arrives (or a deadline passes),
 * handing every other reply it reads to a callback; drain() reads what is
 * there without waiting. A reply is a tuple
 * (call_id, code, message, status_details, data, algorithm, chunk_bytes):
 * LocalCallReply's fields, its response's data and its plan's two fields.
 *
 * Thread safety: send_call() may run on any thread, but frames must not
 * interleave: callers hold their socket's lock around it. One thread at a
 * time may use a Reader (the one that reads the socket). Both release the
 * interpreter lock while they block in the kernel.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>

/* What one receive asks for at least: a reply of that size needs one read. */
#define MIN_READ ((Py_ssize_t)1 << 20)
/* Request parts send_call() takes: its prefix, number and data. */
#define MAX_PARTS 8
/* Sends over this many bytes release the interpreter lock. */
#define RELEASE_AT ((Py_ssize_t)64 << 10)
#define LENGTH_BYTES 4

/* ---- protobuf wire format -------------------------------------------- */

static size_t PutVarint(uint8_t* out, uint64_t value) {
  size_t n = 0;
  while (value >= 0x80) {
    out[n++] = (uint8_t)(value | 0x80);
    value >>= 7;
  }
  out[n++] = (uint8_t)value;
  return n;
}

/* Reads a varint at *at (advancing it); returns 0 when it runs past end. */
static int GetVarint(const uint8_t** at, const uint8_t* end, uint64_t* value) {
  uint64_t result = 0;
  for (int shift = 0; shift < 64 && *at < end; shift += 7) {
    uint8_t byte = *(*at)++;
    result |= (uint64_t)(byte & 0x7F) << shift;
    if (!(byte & 0x80)) {
      *value = result;
      return 1;
    }
  }
  return 0;
}

/* One field of a message: its number and wire type; a varint's value, or a
 * length-delimited field's bytes. */
typedef struct {
  uint32_t number;
  uint32_t type;
  uint64_t value;
  const uint8_t* bytes;
  Py_ssize_t size;
} Field;

/* Reads the field at *at; returns 0 at a malformed one. */
static int GetField(const uint8_t** at, const uint8_t* end, Field* field) {
  uint64_t tag;
  if (!GetVarint(at, end, &tag)) return 0;
  field->number = (uint32_t)(tag >> 3);
  field->type = (uint32_t)(tag & 7);
  field->bytes = NULL;
  field->size = 0;
  switch (field->type) {
    case 0:
      return GetVarint(at, end, &field->value);
    case 1:
      if (end - *at < 8) return 0;
      *at += 8;
      return 1;
    case 2: {
      uint64_t size;
      if (!GetVarint(at, end, &size) || size > (uint64_t)(end - *at)) {
        return 0;
      }
      field->bytes = *at;
      field->size = (Py_ssize_t)size;
      *at += size;
      return 1;
    }
    case 5:
      if (end - *at < 4) return 0;
      *at += 4;
      return 1;
    default:
      return 0;
  }
}

/* The parts of a LocalCallReply a caller reads. */
typedef struct {
  uint64_t call_id;
  int32_t code;
  const uint8_t* message;
  Py_ssize_t message_size;
  const uint8_t* details;
  Py_ssize_t details_size;
  const uint8_t* data;
  Py_ssize_t data_size;
  int64_t algorithm;
  uint64_t chunk_bytes;
} Reply;

static int ParsePlan(const uint8_t* at, const uint8_t* end, Reply* reply) {
  Field field;
  while (at < end) {
    if (!GetField(&at, end, &field)) return 0;
    if (field.number == 1 && field.type == 0) {
      reply->algorithm = (int32_t)field.value;
    } else if (field.number == 2 && field.type == 0) {
      reply->chunk_bytes = field.value;
    }
  }
  return 1;
}

static int ParseResponse(const uint8_t* at, const uint8_t* end, Reply* reply) {
  Field field;
  while (at < end) {
    if (!GetField(&at, end, &field)) return 0;
    if (field.number == 1 && field.type == 2) {
      reply->data = field.bytes;
      reply->data_size = field.size;
    } else if (field.number == 3 && field.type == 2) {
      if (!ParsePlan(field.bytes, field.bytes + field.size, reply)) return 0;
    }
  }
  return 1;
}

static int ParseReply(const uint8_t* at, const uint8_t* end, Reply* reply) {
  memset(reply, 0, sizeof(*reply));
  Field field;
  while (at < end) {
    if (!GetField(&at, end, &field)) return 0;
    switch (field.number) {
      case 1:
        if (field.type == 0) reply->call_id = field.value;
        break;
      case 2:
        if (field.type == 0) reply->code = (int32_t)field.value;
        break;
      case 3:
        if (field.type == 2) {
          reply->message = field.bytes;
          reply->message_size = field.size;
        }
        break;
      case 4:
        if (field.type == 2) {
          reply->details = field.bytes;
          reply->details_size = field.size;
        }
        break;
      case 5:
        if (field.type == 2 &&
            !ParseResponse(field.bytes, field.bytes + field.size, reply)) {
          return 0;
        }
        break;
    }
  }
  return 1;
}

static PyObject* ReplyTuple(const Reply* reply) {
  return Py_BuildValue(
      "(KiNy#y#LK)", (unsigned long long)reply->call_id, (int)reply->code,
      PyUnicode_DecodeUTF8((const char*)reply->message, reply->message_size,
                           "replace"),
      (const char*)(reply->details ? reply->details : (const uint8_t*)""),
      reply->details_size,
      (const char*)(reply->data ? reply->data : (const uint8_t*)""),
      reply->data_size, (long long)reply->algorithm,
      (unsigned long long)reply->chunk_bytes);
}

/* ---- send_call --------------------------------------------------------- */

PyDoc_STRVAR(send_call_doc,
             "send_call(fd, call_id, timeout_us, parts) -> None\n\n"
             "Writes one LocalCallFrame on the socket `fd`: `call_id`, "
             "`timeout_us`, and as its call the bytes of `parts` (a tuple of "
             "at most 8 buffers) one after the other. Raises OSError when "
             "the socket fails; then part of the frame may have gone out.");

/* Writes the `pieces` buffers of `iov` (which it may change) on `fd`, whole;
   returns 0, or the errno of the write that failed. */
static int WriteAll(int fd, struct iovec* iov, int pieces) {
  int first = 0;
  while (first < pieces) {
    struct msghdr message;
    memset(&message, 0, sizeof(message));
    message.msg_iov = iov + first;
    message.msg_iovlen = (size_t)(pieces - first);
    ssize_t sent = sendmsg(fd, &message, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    /* A partial write: skip what went out. */
    while (first < pieces && (size_t)sent >= iov[first].iov_len) {
      sent -= (ssize_t)iov[first].iov_len;
      ++first;
    }
    if (first < pieces) {
      iov[first].iov_base = (char*)iov[first].iov_base + sent;
      iov[first].iov_len -= (size_t)sent;
    }
  }
  return 0;
}

static PyObject* SendCall(PyObject* self, PyObject* args) {
  (void)self;
  int fd;
  unsigned long long call_id, timeout_us;
  PyObject* parts;
  if (!PyArg_ParseTuple(args, "iKKO!:send_call", &fd, &call_id, &timeout_us,
                        &PyTuple_Type, &parts)) {
    return NULL;
  }
  Py_ssize_t count = PyTuple_GET_SIZE(parts);
  if (count > MAX_PARTS) {
    PyErr_SetString(PyExc_ValueError, "send_call: too many parts");
    return NULL;
  }
  Py_buffer views[MAX_PARTS];
  Py_ssize_t taken = 0;
  Py_ssize_t request_size = 0;
  PyObject* result = NULL;
  for (; taken < count; ++taken) {
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(parts, taken), &views[taken],
                           PyBUF_C_CONTIGUOUS) < 0) {
      goto done;
    }
    request_size += views[taken].len;
  }
  /* length, then fields 1 (call_id), 2 (timeout_us) and 3's tag and size. */
  uint8_t head[LENGTH_BYTES + 4 * 11];
  size_t size = LENGTH_BYTES;
  head[size++] = 0x08;
  size += PutVarint(head + size, call_id);
  head[size++] = 0x10;
  size += PutVarint(head + size, timeout_us);
  head[size++] = 0x1a;
  size += PutVarint(head + size, (uint64_t)request_size);
  uint64_t frame_size = size - LENGTH_BYTES + (uint64_t)request_size;
  if (frame_size > UINT32_MAX) {
    PyErr_SetString(PyExc_ValueError, "send_call: the frame is over 4 GiB");
    goto done;
  }
  uint32_t length = (uint32_t)frame_size;
  memcpy(head, &length, LENGTH_BYTES); /* little-endian, as x86 and arm */

  struct iovec iov[MAX_PARTS + 1];
  int pieces = 0;
  iov[pieces].iov_base = head;
  iov[pieces++].iov_len = size;
  for (Py_ssize_t i = 0; i < count; ++i) {
    if (views[i].len == 0) continue;
    iov[pieces].iov_base = views[i].buf;
    iov[pieces++].iov_len = (size_t)views[i].len;
  }
  /* A large frame is written without the GIL. */
  int release = request_size > RELEASE_AT;
  PyThreadState* saved = NULL;
  if (release) saved = PyEval_SaveThread();
  int error = WriteAll(fd, iov, pieces);
  if (release) PyEval_RestoreThread(saved);
  if (error) {
    errno = error;
    PyErr_SetFromErrno(PyExc_OSError);
    goto done;
  }
  result = Py_None;
  Py_INCREF(result);
done:
  for (Py_ssize_t i = 0; i < taken; ++i) PyBuffer_Release(&views[i]);
  return result;
}

/* ---- Reader ------------------------------------------------------------ */

typedef struct {
  PyObject ob_base; /* PyObject_HEAD */
  int fd;
  uint8_t* buffer;
  Py_ssize_t capacity;
  /* Unparsed bytes are buffer[start, end). */
  Py_ssize_t start;
  Py_ssize_t end;
  /* The socket's SO_RCVTIMEO in seconds; INFINITY when none is set. */
  double receive_timeout;
} Reader;

static double Now(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

static int ReaderInit(Reader* self, PyObject* args, PyObject* kwargs) {
  int fd;
  static char* keywords[] = {"fd", NULL};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "i:Reader", keywords, &fd)) {
    return -1;
  }
  self->fd = fd;
  self->start = self->end = 0;
  self->receive_timeout = INFINITY;
  if (self->buffer == NULL) {
    self->buffer = PyMem_RawMalloc((size_t)MIN_READ);
    if (self->buffer == NULL) {
      PyErr_NoMemory();
      return -1;
    }
    self->capacity = MIN_READ;
  }
  return 0;
}

static void ReaderDealloc(Reader* self) {
  PyMem_RawFree(self->buffer);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

/* Makes room for the next receive: moves unparsed bytes to the front and,
 * when a frame is longer than what fits, grows the buffer to hold it. */
static int MakeRoom(Reader* self) {
  Py_ssize_t pending = self->end - self->start;
  Py_ssize_t need = MIN_READ;
  if (pending >= LENGTH_BYTES) {
    uint32_t length;
    memcpy(&length, self->buffer + self->start, LENGTH_BYTES);
    if ((Py_ssize_t)length + LENGTH_BYTES > need) {
      need = (Py_ssize_t)length + LENGTH_BYTES;
    }
  }
  if (self->start > 0 && (self->capacity - self->end < MIN_READ / 2 ||
                          need > self->capacity - self->start)) {
    memmove(self->buffer, self->buffer + self->start, (size_t)pending);
    self->start = 0;
    self->end = pending;
  }
  if (need > self->capacity) {
    uint8_t* grown = PyMem_RawRealloc(self->buffer, (size_t)need);
    if (grown == NULL) {
      PyErr_NoMemory();
      return 0;
    }
    self->buffer = grown;
    self->capacity = need;
  }
  if (self->end == self->start) self->start = self->end = 0;
  return 1;
}

/* Parses every whole frame in the buffer. The reply to `wanted` (0: none)
 * goes to *mine as a tuple; each other goes to on_reply(tuple), which
 * returns whether to go on. Returns 1, 0 when on_reply said stop, or -1
 * with an exception set. */
static int Dispatch(Reader* self, uint64_t wanted, PyObject* on_reply,
                    PyObject** mine) {
  while (self->end - self->start >= LENGTH_BYTES) {
    uint32_t length;
    memcpy(&length, self->buffer + self->start, LENGTH_BYTES);
    if ((Py_ssize_t)length > self->end - self->start - LENGTH_BYTES) break;
    const uint8_t* frame = self->buffer + self->start + LENGTH_BYTES;
    self->start += LENGTH_BYTES + (Py_ssize_t)length;
    Reply reply;
    if (!ParseReply(frame, frame + length, &reply)) {
      PyErr_SetString(PyExc_ValueError,
                      "a LocalCallReply on the call socket does not parse");
      return -1;
    }
    PyObject* tuple = ReplyTuple(&reply);
    if (tuple == NULL) return -1;
    if (wanted != 0 && reply.call_id == wanted) {
      Py_XDECREF(*mine);
      *mine = tuple;
      continue;
    }
    PyObject* go_on = PyObject_CallOneArg(on_reply, tuple);
    Py_DECREF(tuple);
    if (go_on == NULL) return -1;
    int truth = PyObject_IsTrue(go_on);
    Py_DECREF(go_on);
    if (truth < 0) return -1;
    if (!truth) return 0;
  }
  return 1;
}

/* One receive into the buffer; `timeout` > 0 sets SO_RCVTIMEO first when
 * the one set would overrun it by over 5%. Returns the byte count, 0 at
 * the end of the stream, -2 when nothing came (timed out, or nothing there
 * with MSG_DONTWAIT), or -1 with an exception set. */
static Py_ssize_t Receive(Reader* self, double timeout, int flags) {
  if (!MakeRoom(self)) return -1;
  if (timeout > 0 && self->receive_timeout > timeout * 1.05) {
    struct timeval value;
    value.tv_sec = (time_t)timeout;
    value.tv_usec = (suseconds_t)((timeout - (double)value.tv_sec) * 1e6) + 1;
    if (value.tv_usec > 999999) value.tv_usec = 999999; /* else EDOM */
    if (setsockopt(self->fd, SOL_SOCKET, SO_RCVTIMEO, &value, sizeof(value)) <
        0) {
      PyErr_SetFromErrno(PyExc_OSError);
      return -1;
    }
    self->receive_timeout = timeout;
  }
  for (;;) {
    ssize_t received;
    PyThreadState* state = PyEval_SaveThread();
    received = recv(self->fd, self->buffer + self->end,
                    (size_t)(self->capacity - self->end), flags);
    PyEval_RestoreThread(state);
    if (received >= 0) {
      self->end += received;
      return received;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      /* The next wait sets its own timeout. */
      if (!(flags & MSG_DONTWAIT)) self->receive_timeout = INFINITY;
      return -2;
    }
    if (errno != EINTR) {
      PyErr_SetFromErrno(PyExc_OSError);
      return -1;
    }
    if (PyErr_CheckSignals() < 0) return -1;
  }
}

PyDoc_STRVAR(wait_doc,
             "wait(call_id, seconds, on_reply) -> tuple | None | False\n\n"
             "Reads the socket until the reply to `call_id` came, and "
             "returns it; every other reply read meanwhile goes to "
             "on_reply(reply), which returns whether to go on. Returns None "
             "when `seconds` passed first, False when the socket's stream "
             "ended or on_reply said stop. Raises OSError when the socket "
             "fails, ValueError for a reply that does not parse.");

static PyObject* ReaderWait(Reader* self, PyObject* args) {
  unsigned long long wanted;
  double seconds;
  PyObject* on_reply;
  if (!PyArg_ParseTuple(args, "KdO:wait", &wanted, &seconds, &on_reply)) {
    return NULL;
  }
  double deadline = Now() + seconds;
  PyObject* mine = NULL;
  for (;;) {
    int dispatched = Dispatch(self, wanted, on_reply, &mine);
    if (dispatched < 0) {
      Py_XDECREF(mine);
      return NULL;
    }
    if (mine != NULL) return mine; /* on_reply may have said stop: later */
    if (dispatched == 0) Py_RETURN_FALSE;
    double left = deadline - Now();
    if (left <= 0) Py_RETURN_NONE;
    Py_ssize_t received = Receive(self, left, 0);
    if (received == -1) return NULL;
    if (received == 0) Py_RETURN_FALSE;
  }
}

PyDoc_STRVAR(drain_doc,
             "drain(on_reply) -> bool\n\n"
             "Reads what the socket has without waiting and passes every "
             "whole reply to on_reply(reply), which returns whether to go "
             "on. Returns False when the stream ended or on_reply said "
             "stop. Raises OSError when the socket fails, ValueError for a "
             "reply that does not parse.");

static PyObject* ReaderDrain(Reader* self, PyObject* on_reply) {
  Py_ssize_t received = Receive(self, 0, MSG_DONTWAIT);
  if (received == -1) return NULL;
  if (received == 0) Py_RETURN_FALSE;
  PyObject* mine = NULL;
  int dispatched = Dispatch(self, 0, on_reply, &mine);
  if (dispatched < 0) return NULL;
  return PyBool_FromLong(dispatched);
}

static PyMethodDef kReaderMethods[] = {
    {"wait", (PyCFunction)ReaderWait, METH_VARARGS, wait_doc},
    {"drain", (PyCFunction)ReaderDrain, METH_O, drain_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(reader_doc,
             "Reader(fd)\n\n"
             "The receiving end of a call socket: its buffer of bytes read "
             "but not yet parsed. Used by one thread at a time.");

static PyTypeObject kReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "chorus._frames.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_dealloc = (destructor)ReaderDealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = reader_doc,
    .tp_methods = kReaderMethods,
    .tp_init = (initproc)ReaderInit,
    .tp_new = PyType_GenericNew,
};

/* ---- module ------------------------------------------------------------ */

static PyMethodDef kMethods[] = {
    {"send_call", SendCall, METH_VARARGS, send_call_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT,
    "chorus._frames",
    "The call socket's frames, written and read without the interpreter.",
    -1,
    kMethods,
};

PyMODINIT_FUNC PyInit__frames(void) {
  if (PyType_Ready(&kReaderType) < 0) return NULL;
  PyObject* module = PyModule_Create(&kModule);
  if (module == NULL) return NULL;
  Py_INCREF(&kReaderType);
  if (PyModule_AddObject(module, "Reader", (PyObject*)&kReaderType) < 0) {
    Py_DECREF(&kReaderType);
    Py_DECREF(module);
    return NULL;
  }
  return module;
}
