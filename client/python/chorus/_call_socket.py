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

CallSocket is thread-safe: any thread may issue calls. One thread at a time
reads the socket and completes every call it reads the reply of: a
blocking call's own thread while it waits (so a lone caller gets its reply
with no hand-off between threads), else the socket's reader thread. Each
call that got no reply by its deadline ends with DEADLINE_EXCEEDED (the
daemon answers before it, so that happens only when the daemon is stuck).
Frames are written, read and parsed by the C extension chorus._frames.

CallSocket drives any Connection: a daemon's call socket (UnixConnection),
or the in-process channel of an embedded worker (chorus._embedded.Calls),
whose frames go to the runtime in this process with no socket; there a
blocking call is run by its own thread on the caller's buffers
(run_in_place(), Calls.run_into), with none of the bookkeeping of calls in
flight.
"""

import heapq
import itertools
import os
import select
import threading
import time
from typing import (Any, Callable, Dict, Iterator, List, Optional, Tuple,
                    Union)

import grpc

from chorus._connection import (HELLO, CallSocketError, Connection, Plan,
                                Reply, Response, UnixConnection, outcome_of)

__all__ = ["BlockingCall", "CallSocket", "CallSocketError", "Connection",
           "HELLO", "PendingCall", "Plan", "Response", "UnixConnection",
           "outcome_of"]

# How long close() waits for the reader thread.
_CLOSE_WAIT = 2.0

# How long past its deadline a call started on the caller's buffers
# (start_into) waits for the worker's verdict before this end gives up on
# it: the embedded worker always answers by the deadline, and until it has,
# the call may still write its output.
_IN_PLACE_GRACE = 10.0


class PendingCall:
    """A call sent on the call socket without blocking, until its reply:
    result() and add_done_callback() as a gRPC future's.
    """

    __slots__ = ("_done", "_reply", "_error", "_callbacks", "_lock")

    def __init__(self) -> None:
        self._done = threading.Event()
        self._reply: Any = None
        self._error: Optional[BaseException] = None
        self._callbacks: List[Callable[["PendingCall"], None]] = []
        self._lock = threading.Lock()

    def result(self) -> Any:
        """Waits for the call's end (the reader thread ends it by its
        deadline at the latest) and returns its Response, or raises the
        call's CallSocketError.
        """
        self._done.wait()
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


class BlockingCall:
    """A call sent on the call socket whose caller waits for it: result()
    reads the socket on the caller's thread while no other thread does, and
    ends the call at its deadline. Its fields change only under the
    socket's lock.
    """

    __slots__ = ("_socket", "_call_id", "_deadline", "_done", "_reply",
                 "_error")

    def __init__(self, socket: "CallSocket", call_id: int,
                 deadline: float) -> None:
        self._socket = socket
        self._call_id = call_id
        # When result() ends the call (monotonic).
        self._deadline = deadline
        self._done = False
        self._reply: Any = None
        self._error: Optional[BaseException] = None

    def result(self) -> Any:
        """Waits for the call's end, by its deadline at the latest, and
        returns its Response, or raises the call's CallSocketError.
        """
        if not self._done:
            self._socket._wait(self)
        if self._error is not None:
            raise self._error
        return self._reply

    def _end(self, reply: Any = None,
             error: Optional[BaseException] = None) -> None:
        """Records how the call ended; under the socket's lock."""
        self._reply = reply
        self._error = error
        self._done = True


class CallSocket:
    """A connection to a worker daemon's call socket, or to the channel of
    an embedded worker (any Connection).

    One thread at a time reads the socket and completes every call whose
    reply it reads. A blocking call's own thread reads it while it waits,
    when no other thread does, so its reply needs no hand-off between
    threads; else it waits for the thread that reads. The reader thread
    reads while calls issued without blocking wait and no caller reads, and
    ends those past their deadline.
    """

    def __init__(self, path: str = "", *,
                 connection: Optional["Connection"] = None,
                 name: str = "") -> None:
        """Connects to the call socket at `path` and says hello (raises
        OSError when it cannot); or, given `connection`, drives that
        channel instead (an embedded worker's, chorus._embedded.Calls),
        named `name` in errors.
        """
        if connection is None:
            connection = UnixConnection(path)
            name = f"the worker daemon's call socket {path}"
        self._name = name
        self._conn = connection
        self._send = connection.send_call
        # A connection whose calls a waiting caller can run itself, on its
        # own buffers (an embedded worker's): see run_in_place().
        self._run_into = getattr(connection, "run_into", None)
        self._lock = threading.Lock()
        # Blocking callers wait here for their reply, or for their turn to
        # read.
        self._turn = threading.Condition(self._lock)
        # How many callers wait on _turn: no notification when none does.
        self._sleepers = 0
        self._pending: Dict[int, Union[PendingCall, BlockingCall]] = {}
        # Calls issued without blocking still waiting: the reader thread
        # reads for them when no caller does.
        self._unattended = 0
        # A thread reads the socket now; only that one uses _replies.
        self._reading = False
        # (deadline, call id) of the calls issued without blocking,
        # earliest first; entries of calls that ended already are dropped
        # as they come up.
        self._deadlines: List[Tuple[float, int]] = []
        # When the reader wakes up next at the latest (monotonic); a call
        # due before that wakes it through the pipe.
        self._wake_at = float("inf")
        self._wake_read, self._wake_write = os.pipe()
        # A full pipe already wakes the reader: writers never wait on it.
        os.set_blocking(self._wake_write, False)
        self._pipe_open = True
        # Public: the ids of its calls; next() of it is atomic, so any
        # thread (or the embedded worker's extension) takes one for a call.
        self.call_ids: Iterator[int] = itertools.count(1)
        # Public: why the connection broke (a call found it broken); None
        # while calls may be sent. Read by any thread, set under the lock.
        self.broken: Optional[str] = None
        self._closing = False
        self._reader = threading.Thread(
            target=self._read, daemon=True, name="chorus-call-socket")
        self._reader.start()

    @property
    def usable(self) -> bool:
        """Whether calls may still be sent (the connection did not break,
        as far as this end knows).
        """
        return self.broken is None

    def call(self, request: Tuple[Any, ...], timeout: float,
             blocking: bool = False,
             into: Optional[Tuple[Any, ...]] = None,
             on_device: bool = False
             ) -> Optional[Union[PendingCall, BlockingCall]]:
        """Sends the serialized LocalCollectiveRequest whose bytes are the
        buffers of `request`, one after the other (at most 8), with
        `timeout` seconds to run; or, given `into` (prefix, sequence, data,
        out) on an embedded worker's connection, starts that call on the
        buffers themselves (its start_into(); `request` is then unused),
        or with `on_device`, `into` being (prefix, sequence, input address,
        output address, stream), on GPU memory (its start_on_device()),
        which this end gives up on only _IN_PLACE_GRACE after its deadline
        (the worker's own verdict comes first). A `blocking` call returns a
        BlockingCall, whose result() the caller waits on (it reads the
        socket itself and ends the call at its deadline); any other a
        PendingCall, which the reader thread ends then. A connection that
        broke fails it with UNAVAILABLE. Returns None when nothing was sent
        because the connection was found broken on sending (the call may go
        another way).
        """
        wake = False
        deadline = time.monotonic() + timeout
        if into is not None:
            deadline += _IN_PLACE_GRACE
        with self._lock:
            call_id = next(self.call_ids)
            pending: Union[PendingCall, BlockingCall]
            if blocking:
                pending = BlockingCall(self, call_id, deadline)
                if self.broken is not None:
                    pending._end(error=self.unavailable())
                    return pending
            else:
                pending = PendingCall()
                if self.broken is not None:
                    pending._finish(error=self.unavailable())
                    return pending
                self._unattended += 1
                heapq.heappush(self._deadlines, (deadline, call_id))
                # The reader reads for it, and ends it by its deadline.
                wake = not self._reading or deadline < self._wake_at
                if deadline < self._wake_at:
                    self._wake_at = deadline
            self._pending[call_id] = pending
            try:
                timeout_us = max(1, int(timeout * 1e6))
                if into is None:
                    self._send(call_id, timeout_us, request)
                elif on_device:
                    self._conn.start_on_device(call_id, timeout_us, *into)
                else:
                    self._conn.start_into(call_id, timeout_us, *into)
            except OSError as e:
                self._pending.pop(call_id, None)
                if not blocking:
                    self._unattended -= 1
                self.broken = f"sending failed: {e}"
                broken = True
            except Exception:
                # Refused before it started (e.g. a buffer start_into
                # cannot take): nothing was sent. (A KeyboardInterrupt
                # may come after the call started: it stays pending.)
                self._pending.pop(call_id, None)
                if not blocking:
                    self._unattended -= 1
                raise
            else:
                broken = False
        if broken:
            # The daemon closed the socket. A write to a closed Unix socket
            # fails whole, so nothing of the call went out; a frame cut
            # short by another error leaves the connection unusable alike.
            self._fail(self.broken or "sending failed")
            return None
        if wake:
            self._wake()
        return pending

    @property
    def connection(self) -> Any:
        """The connection the calls go on."""
        return self._conn

    @property
    def runs_here(self) -> bool:
        """Whether run_in_place() can run calls (the connection is an
        embedded worker's and did not break).
        """
        return self._run_into is not None and self.broken is None

    def run_in_place(self, prefix: bytes, sequence: int, data: Any, out: Any,
                     timeout: float) -> Union[bool, Reply, None]:
        """Runs a blocking call on this thread, outside every lock, with
        none of the bookkeeping of call(): the request whose bytes are
        `prefix` (a LocalCollectiveRequest with no sequence and no data)
        with `sequence`, on the buffers themselves: the embedded worker
        reads its input from `data` and writes its output into the writable
        buffer `out` (no copies; a retry of the number is refused, as no
        copy of the output is kept). Returns True once the call succeeded,
        its reply (as chorus._frames reads it) when it failed, or None when
        nothing was sent: the connection cannot run calls here, or broke.
        """
        if self._run_into is None or self.broken is not None:
            return None
        try:
            return self._run_into(next(self.call_ids),
                                  max(1, int(timeout * 1e6)), prefix,
                                  sequence, data, out)
        except OSError as e:
            self._fail(f"sending failed: {e}")
            return None

    def run_on_device(self, prefix: bytes, sequence: int, input: int,
                      output: int, stream: int,
                      timeout: float) -> Union[bool, Reply, None]:
        """run_in_place() on GPU memory: the embedded worker reads the
        input at device address `input` and writes the output at `output`
        (0: none), ordered on the CUDA stream `stream` (0: none). Returns
        as run_in_place() does.
        """
        if self._run_into is None or self.broken is not None:
            return None
        try:
            return self._conn.run_on_device(next(self.call_ids),
                                            max(1, int(timeout * 1e6)),
                                            prefix, sequence, input, output,
                                            stream)
        except OSError as e:
            self._fail(f"sending failed: {e}")
            return None

    def close(self) -> None:
        """Closes the connection; calls still waiting fail with
        UNAVAILABLE. Idempotent.
        """
        with self._lock:
            self._closing = True
        self._conn.shutdown()
        self._wake()
        self._reader.join(timeout=_CLOSE_WAIT)
        if not self._reader.is_alive():
            self._fail("it was closed")
            with self._lock:
                if self._pipe_open:
                    self._pipe_open = False
                    os.close(self._wake_read)
                    os.close(self._wake_write)
            self._conn.close()

    def _wake(self) -> None:
        """Wakes the reader thread up."""
        with self._lock:
            if not self._pipe_open:
                return
            try:
                os.write(self._wake_write, b"w")
            except BlockingIOError:
                pass  # the reader has wake-ups to read already

    def unavailable(self) -> CallSocketError:
        """The error of a call that found the connection broken."""
        return CallSocketError(
            grpc.StatusCode.UNAVAILABLE,
            f"{self._name} closed ({self.broken})")

    def _end_late(self, waiting: BlockingCall) -> None:
        """Ends a blocking call whose deadline passed with
        DEADLINE_EXCEEDED; under the lock.
        """
        if waiting._done:
            return
        self._pending.pop(waiting._call_id, None)
        waiting._end(error=CallSocketError(
            grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))

    def _wait(self, waiting: BlockingCall) -> None:
        """Waits on a blocking call's thread until it ended, reading the
        socket while no other thread does; ends it at its deadline.
        """
        with self._lock:
            while True:
                if waiting._done:
                    return
                left = waiting._deadline - time.monotonic()
                if left <= 0:
                    self._end_late(waiting)
                    return
                if not self._reading and self.broken is None:
                    self._reading = True
                    break
                self._sleepers += 1
                self._turn.wait(left)
                self._sleepers -= 1
        outcome = None
        try:
            left = waiting._deadline - time.monotonic()
            if left > 0:
                # Receives that give up at the deadline, straight into
                # recv() (no poll first: that is a system call and a
                # wake-up more); other calls' replies go to _complete.
                try:
                    reply = self._conn.wait(waiting._call_id, left,
                                               self._complete)
                except Exception as e:  # a reset, a reply that does not parse
                    self._fail(f"{type(e).__name__}: {e}")
                else:
                    if reply is False:
                        self._fail("the daemon closed it")
                    elif reply is not None:
                        outcome = outcome_of(reply)
        finally:
            with self._lock:
                self._reading = False
                if outcome is not None and not waiting._done:
                    self._pending.pop(waiting._call_id, None)
                    waiting._end(*outcome)
                else:
                    self._end_late(waiting)
                # Another blocking caller may read now; calls issued
                # without blocking need the reader thread.
                if self._sleepers:
                    self._turn.notify_all()
                wake = self._unattended > 0
            if wake:
                self._wake()

    def _receive(self) -> bool:
        """Reads what the socket has, without waiting, and completes the
        calls it answers. Called by the thread that reads. Returns False
        when the connection ended (every call waiting then failed).
        """
        try:
            if self._conn.drain(self._complete):
                return True
            self._fail("the daemon closed it")
        except Exception as e:  # a reset, a reply that does not parse, ...
            self._fail(f"{type(e).__name__}: {e}")
        return False

    def _complete(self, reply: Reply) -> bool:
        """Ends the call `reply` answers (none when it ended at its deadline
        already). Returns False when the reply ends the connection instead.
        """
        call_id = reply[0]
        if call_id == 0:
            self._fail(reply[2])
            return False
        response, error = outcome_of(reply)
        with self._lock:
            pending = self._pending.pop(call_id, None)
            if type(pending) is BlockingCall:
                pending._end(response, error)
                if self._sleepers:
                    self._turn.notify_all()  # its caller waits there
                return True
            if pending is None:
                return True  # ended at its deadline already
            self._unattended -= 1
        pending._finish(response, error)
        return True

    def _fail(self, why: str) -> None:
        """Marks the connection broken (once) and fails every call still
        waiting with UNAVAILABLE.
        """
        waiting: List[PendingCall] = []
        with self._lock:
            if self.broken is None:
                self.broken = why
            for pending in self._pending.values():
                if type(pending) is BlockingCall:
                    pending._end(error=self.unavailable())
                else:
                    waiting.append(pending)
            self._pending.clear()
            self._unattended = 0
            self._turn.notify_all()
        for pending in waiting:
            pending._finish(error=self.unavailable())
        self._wake()

    def _expire(self, now: float) -> Optional[float]:
        """Ends the calls issued without blocking that are due by `now`
        with DEADLINE_EXCEEDED; returns the next deadline (None when no
        such call waits).
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
                self._unattended -= 1
            upcoming = self._deadlines[0][0] if self._deadlines else None
            self._wake_at = upcoming if upcoming is not None \
                else float("inf")
        for pending in expired:
            pending._finish(error=CallSocketError(
                grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))
        return upcoming

    def _read(self) -> None:
        """The reader thread: reads for the calls issued without blocking
        while no caller reads, and ends those past their deadline, until
        the connection ends or closes.
        """
        while True:
            upcoming = self._expire(time.monotonic())
            with self._lock:
                if self._closing or self.broken is not None:
                    return
                read = self._unattended > 0 and not self._reading
                if read:
                    self._reading = True
            wait = None if upcoming is None else \
                max(0.0, upcoming - time.monotonic())
            watched = [self._conn, self._wake_read] if read else \
                [self._wake_read]
            ready, _, _ = select.select(watched, [], [], wait)
            if self._wake_read in ready:
                os.read(self._wake_read, 4096)
            if not read:
                continue
            ended = self._conn in ready and not self._receive()
            with self._lock:
                self._reading = False
                self._turn.notify_all()  # a blocking caller may read now
            if ended:
                return
