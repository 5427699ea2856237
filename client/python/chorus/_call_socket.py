"""The worker daemon's call socket: collectives as plain frames.

A daemon started with --local_call_socket (the default) serves its local
API's collectives on a second Unix socket too, whose path JoinGroup returns
(LocalJoinResponse.call_socket). A call there is one LocalCallFrame written
and one LocalCallReply read (worker.proto), with no HTTP/2 and no gRPC
machinery in this process, which is most of what a small collective costs
through gRPC. The daemon runs each frame exactly as the Collective RPC, so
every check, code and error detail is the same: a failed call here raises
the same grpc.RpcError shape (code, details, trailing metadata with the
google.rpc.Status) that from_rpc_error() reads.

CallSocket is thread-safe: any thread may issue calls; one reader thread
per socket completes them, and ends each call that got no reply by its
deadline with DEADLINE_EXCEEDED (the daemon answers before it, so that
happens only when the daemon is stuck).
"""

import heapq
import os
import select
import socket
import struct
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import grpc

from chorus import _status_details
from chorus.v1 import worker_pb2

__all__ = ["CallSocket", "CallSocketError", "HELLO", "PendingCall", "varint"]

HELLO: bytes = b"CHORUS-LOCAL/1\n"

# How long connecting may take: the socket is local, so at once or never.
_CONNECT_TIMEOUT = 2.0
_LENGTH = struct.Struct("<I")


def varint(value: int) -> bytes:
    """`value` as a protobuf varint."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class CallSocketError(grpc.RpcError):
    """A call on the call socket that did not succeed, shaped as a failed
    gRPC call: code(), details() and trailing_metadata() (holding the
    google.rpc.Status with its ErrorDetail, as gRPC sends it).
    """

    def __init__(self, code: grpc.StatusCode, message: str,
                 status_details: bytes = b"") -> None:
        """Makes the error of a call that ended with `code` and `message`."""
        super().__init__(message)
        self._code = code
        self._message = message
        self._status_details = status_details

    def code(self) -> grpc.StatusCode:
        """The call's status code."""
        return self._code

    def details(self) -> str:
        """The call's status message."""
        return self._message

    def trailing_metadata(self) -> Tuple[Tuple[str, bytes], ...]:
        """The status details as gRPC's trailing metadata would carry
        them.
        """
        if not self._status_details:
            return ()
        return ((_status_details.DETAILS_KEY, self._status_details),)


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def _error_of(reply: Any) -> CallSocketError:
    code = _CODES.get(reply.code, grpc.StatusCode.UNKNOWN)
    return CallSocketError(code, reply.message, reply.status_details)


class PendingCall:
    """One call sent on the call socket, until its reply: result() and
    add_done_callback() as a gRPC future's.
    """

    __slots__ = ("_done", "_reply", "_error", "_callbacks", "_lock",
                 "_timeout", "_forget")

    def __init__(self, timeout: Optional[float] = None,
                 forget: Optional[Callable[[], None]] = None) -> None:
        # A blocking call's own deadline (its waiter ends it), or None for
        # one the reader ends at its deadline.
        self._timeout = timeout
        self._forget = forget
        self._done = threading.Event()
        self._reply: Any = None
        self._error: Optional[BaseException] = None
        self._callbacks: List[Callable[["PendingCall"], None]] = []
        self._lock = threading.Lock()

    def result(self) -> Any:
        """Waits for the call's end, by its deadline at the latest, and
        returns the LocalCollectiveResponse, or raises the call's
        CallSocketError.
        """
        if not self._done.wait(self._timeout):
            if self._forget is not None:
                self._forget()
            self._finish(error=CallSocketError(
                grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))
        if self._error is not None:
            raise self._error
        return self._reply

    def add_done_callback(self, fn: Callable[["PendingCall"], None]) -> None:
        """Runs fn(self) once the call ended (at once if it has)."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        fn(self)

    def _finish(self, reply: Any = None,
                error: Optional[BaseException] = None) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self._reply = reply
            self._error = error
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn(self)


class CallSocket:
    """A connection to a worker daemon's call socket."""

    def __init__(self, path: str) -> None:
        """Connects to the call socket at `path` and says hello. Raises
        OSError when it cannot.
        """
        self._path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.settimeout(_CONNECT_TIMEOUT)
            self._sock.connect(path)
            self._sock.settimeout(None)
            self._sock.sendall(HELLO)
        except BaseException:
            self._sock.close()
            raise
        self._lock = threading.Lock()
        self._pending: Dict[int, PendingCall] = {}
        # (deadline, call id) of the calls sent, earliest first; entries of
        # calls that ended already are dropped as they come up.
        self._deadlines: List[Tuple[float, int]] = []
        # When the reader wakes up next at the latest (monotonic); a call
        # due before that wakes it through the pipe.
        self._wake_at = float("inf")
        self._wake_read, self._wake_write = os.pipe()
        # A full pipe already wakes the reader: writers never wait on it.
        os.set_blocking(self._wake_write, False)
        self._next_id = 1
        self._broken: Optional[str] = None
        self._reader = threading.Thread(
            target=self._read, daemon=True, name="chorus-call-socket")
        self._reader.start()

    @property
    def usable(self) -> bool:
        """Whether calls may still be sent (the connection did not break)."""
        return self._broken is None

    def call(self, request: bytes, timeout: float,
             blocking: bool = False) -> PendingCall:
        """Sends the serialized LocalCollectiveRequest `request` with
        `timeout` seconds to run and returns its PendingCall. A `blocking`
        call is waited for with result() on the caller's thread, which ends
        it at its deadline; any other the reader ends then. A connection
        that broke fails it with UNAVAILABLE.
        """
        wake = False
        with self._lock:
            call_id = self._next_id
            self._next_id += 1
            if blocking:
                pending = PendingCall(timeout, lambda: self._forget(call_id))
            else:
                pending = PendingCall()
            if self._broken is not None:
                pending._finish(error=self._unavailable())
                return pending
            self._pending[call_id] = pending
            if not blocking:
                deadline = time.monotonic() + timeout
                heapq.heappush(self._deadlines, (deadline, call_id))
                if deadline < self._wake_at:
                    self._wake_at = deadline
                    wake = True
            micros = max(1, int(timeout * 1e6))
            head = b"".join([b"\x08", varint(call_id), b"\x10",
                             varint(micros), b"\x1a",
                             varint(len(request))])
            try:
                self._sock.sendmsg([
                    _LENGTH.pack(len(head) + len(request)), head, request])
            except OSError as e:
                self._pending.pop(call_id, None)
                self._broken = f"sending failed: {e}"
                pending._finish(error=self._unavailable())
                return pending
        if wake:
            try:
                os.write(self._wake_write, b"w")
            except BlockingIOError:
                pass  # the reader has wake-ups to read already
        return pending

    def close(self) -> None:
        """Closes the connection; calls still waiting fail with
        UNAVAILABLE. Idempotent.
        """
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._reader.join(timeout=_CONNECT_TIMEOUT)
        if not self._reader.is_alive():
            self._sock.close()
            os.close(self._wake_read)
            os.close(self._wake_write)

    def _unavailable(self) -> CallSocketError:
        return CallSocketError(
            grpc.StatusCode.UNAVAILABLE,
            f"the worker daemon's call socket {self._path} closed "
            f"({self._broken})")

    def _forget(self, call_id: int) -> None:
        with self._lock:
            self._pending.pop(call_id, None)

    def _expire(self, now: float) -> Optional[float]:
        """Ends the calls due by `now` with DEADLINE_EXCEEDED; returns the
        next deadline (None when no call waits).
        """
        expired: List[PendingCall] = []
        with self._lock:
            while self._deadlines:
                deadline, call_id = self._deadlines[0]
                if call_id not in self._pending:
                    heapq.heappop(self._deadlines)  # ended already
                    continue
                if deadline > now:
                    break
                heapq.heappop(self._deadlines)
                expired.append(self._pending.pop(call_id))
            upcoming = self._deadlines[0][0] if self._deadlines else None
            self._wake_at = upcoming if upcoming is not None \
                else float("inf")
        for pending in expired:
            pending._finish(error=CallSocketError(
                grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))
        return upcoming

    def _read(self) -> None:
        """Completes calls as their replies arrive and ends those past their
        deadline, until the connection ends; then fails the calls still
        waiting.
        """
        buffer = bytearray()
        why = "the daemon closed it"
        try:
            while True:
                upcoming = self._expire(time.monotonic())
                wait = None if upcoming is None else \
                    max(0.0, upcoming - time.monotonic())
                ready, _, _ = select.select(
                    [self._sock, self._wake_read], [], [], wait)
                if self._wake_read in ready:
                    os.read(self._wake_read, 4096)
                if self._sock not in ready:
                    continue
                chunk = self._sock.recv(1 << 20)
                if not chunk:
                    break
                buffer += chunk
                while len(buffer) >= _LENGTH.size:
                    (size,) = _LENGTH.unpack_from(buffer)
                    end = _LENGTH.size + size
                    if len(buffer) < end:
                        break
                    reply = worker_pb2.LocalCallReply.FromString(
                        bytes(buffer[_LENGTH.size:end]))
                    del buffer[:end]
                    if reply.call_id == 0:
                        why = reply.message
                        raise ConnectionError(why)
                    with self._lock:
                        pending = self._pending.pop(reply.call_id, None)
                    if pending is None:
                        continue  # ended at its deadline already
                    if reply.code == 0:
                        pending._finish(reply=reply.response)
                    else:
                        pending._finish(error=_error_of(reply))
        except ConnectionError as e:
            if e.args != (why,):  # else the daemon said why (call id 0)
                why = f"{type(e).__name__}: {e}"
        except Exception as e:  # a reply that does not parse, ...
            why = f"{type(e).__name__}: {e}"
        with self._lock:
            self._broken = why
            waiting = list(self._pending.values())
            self._pending.clear()
        for pending in waiting:
            pending._finish(error=self._unavailable())
