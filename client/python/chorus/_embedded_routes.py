"""The routes of a rank that embeds the worker runtime (chorus.embedded):
calls that run in this process, on the caller's own arrays, with no socket
and no copy into a message or shared memory.

The channel is the embedded worker's chorus._embedded.Calls, driven by the
communicator's CallSocket; these routes use its in-place entries: run_into
(a blocking call, on the caller's thread), start_into (an async_op call, on
the worker's threads), AllReduceHere (a blocking all_reduce in one call
into the extension) and OnDevice (a call on arrays in GPU memory).
"""

from typing import Any, Callable, Optional, Tuple

import numpy as np

from chorus import _arrays
from chorus._call import Call
from chorus._outcome import Outcome, Replied, Unsent, Work
from chorus._route import NOTHING, Link, Route

__all__ = ["AllReduceHere", "OnDevice", "RunInto", "StartInto"]

# What the extension's AllReduceHere returns for a call it leaves to the
# other routes.
_NOT_HERE = object()


def _result_array(call: Call) -> Optional[np.ndarray]:
    """Where a call's output goes: call.target, or a new array shaped as
    its output; None for a call with no output.
    """
    if call.target is None and call.out_shape is not None:
        return np.empty(call.out_shape, call.out_dtype)
    return call.target


def _start_into(number: int, calls: Any, call: Call, data: Any,
                place: Any) -> Any:
    """Starts call number `number` on the buffers `data` and `place`
    (CallSocket.call with `into`); returns its future, or None when the
    channel broke (nothing sent).
    """
    return calls.call((), call.timeout,
                      into=(call.prefix, number, data, place))


def _run_here(link: Link, call: Call, run: Callable[[int], Any],
              result: Any) -> Any:
    """Runs blocking call `call` on this thread as run(number) does (a
    channel's run_in_place or run_on_device, which returns True, a failed
    call's reply, or None when nothing was sent) under the next number of
    `link`; returns `result` once it succeeded, else raises its
    chorus.Error.
    """
    number = link.numbering.take()
    try:
        reply = run(number)
    except BaseException:
        link.numbering.done()
        raise
    if reply is True:
        link.numbering.done()
        return result
    outcome = Outcome(number)
    rpc = Replied(reply) if reply is not None else Unsent(link.calls)
    link.settler.settle(call, outcome, rpc)
    return outcome.result()


def _start_here(link: Link, call: Call, start: Callable[[int], Any],
                result: Any) -> Work:
    """Starts async_op call `call` as start(number) does (a CallSocket.call
    on the worker's threads, returning its future, or None when the
    channel broke) under the next number of `link`, in number order;
    returns its Work, which ends with `result`.
    """
    number, rpc = link.numbering.issue(start)
    work = Work(number)
    if rpc is None:  # the channel broke: nothing sent
        link.settler.settle(call, work, Unsent(link.calls))
        return work

    def receive(done: Any) -> Tuple[Any, Any]:
        return done.result().plan, result

    rpc.add_done_callback(
        lambda done: link.settler.settle(call, work, done, receive))
    return work


class RunInto(Route):
    """A blocking call run on the caller's thread by the embedded worker
    (CallSocket.run_in_place, Calls.run_into): the runtime reads the input
    and writes the output in place, with no frame and no reply message.

    Exists because: it took an embedded rank's large calls from 1.60x to
    1.05x of the embedded C++ time at 64 MiB, and its 8 B calls' CPU from
    76-79 to 63-67 us (bench/README.md, "Python client next to embedded
    ranks", 2026-12-05 07:32 UTC; then RunInPlace, 09:30-10:35 UTC).
    """

    def run(self, call: Call) -> Any:
        """Runs `call` on this thread; leaves call.target as it was when it
        fails.
        """
        calls = self.link.calls
        result = _result_array(call)
        data = NOTHING if call.data is None else call.data
        place = NOTHING if result is None else result
        return _run_here(
            self.link, call,
            lambda number: calls.run_in_place(call.prefix, number, data,
                                              place, call.timeout),
            result)


class StartInto(Route):
    """An async_op call started on the caller's arrays (CallSocket.call
    with `into`, Calls.start_into): the runtime reads the input and writes
    the output in place on the worker's threads; the extension holds both
    until the call's reply came, and the caller leaves them alone until its
    Work ended.

    Exists because: two embedded ranks' async_op all_reduce of 64 MiB took
    65.7 and 69.5 ms copied through shared memory, 42.8 and 42.5 ms in place
    (bench/README.md, "Python client next to embedded ranks", 2026-12-05
    10:35 UTC); the torch backend's collectives are all async_op.
    """

    def run(self, call: Call) -> Work:
        """Starts `call` and returns its Work."""
        calls = self.link.calls
        result = _result_array(call)
        data = NOTHING if call.data is None else call.data
        place = NOTHING if result is None else result
        # Sent in number order, under the lock, as every route's calls.
        return _start_here(
            self.link, call,
            lambda number: _start_into(number, calls, call, data, place),
            result)


class OnDevice(Route):
    """A call on arrays in GPU memory (chorus._device_arrays) of a rank
    joined on that GPU, run by the embedded worker's device path
    (Calls.run_on_device on the caller's thread, start_on_device on the
    worker's for async_op): the worker stages it through pinned host memory
    on its own streams, ordered on the arrays' stream, and writes the output
    into `out` where it is. The call returns `out` (None where the rank gets
    no output) once the worker ended it; with a stream, its output is
    complete in that stream's order.

    Exists because: torch's CUDA tensors otherwise cross to the host in a
    copy of their own, with the issuing thread waiting for the stream
    (chorus.torch._tensors), and arrays in GPU memory cannot be read at
    all otherwise.
    """

    def run(self, call: Call) -> Any:
        """Runs `call`, or starts it for async_op (returning its Work)."""
        calls = self.link.calls
        data, target = call.data, call.target
        stream = (data if data is not None else target).stream
        source = 0 if data is None else data.pointer
        place = 0 if target is None else target.pointer
        result = None if call.out_shape is None else call.out
        if call.async_op:
            return _start_here(
                self.link, call,
                lambda number: calls.call(
                    (), call.timeout,
                    into=(call.prefix, number, source, place, stream),
                    on_device=True),
                result)
        return _run_here(
            self.link, call,
            lambda number: calls.run_on_device(call.prefix, number, source,
                                               place, stream, call.timeout),
            result)


class AllReduceHere(Route):
    """A blocking all_reduce of numpy arrays with default options, in one
    call into the extension (chorus._embedded.AllReduceHere), which checks,
    numbers (through the communicator's Numbering) and runs it as RunInto
    does, before the call is checked in Python at all. What it does not
    take (another buffer type, out of another dtype, a channel that broke)
    goes the way choose() says once checked.

    Communicator.all_reduce() hands it such a call before it makes a Call
    (all_reduce()), which is the table's first row read first: see
    chorus._routes.

    Exists because: with RunInto, it took a world-1 loop of 8 B
    all_reduce from 64.2 to 53.9 us of CPU per call, and 4 embedded ranks
    from 331.6 to 283.8 us per call (bench/README.md, "Python client next
    to embedded ranks", 2026-12-05 09:30-10:35 UTC, change (3)).
    """

    def __init__(self, link: Link, embedded: Any,
                 then: Callable[[Call], Any]) -> None:
        """The extension's entry for `link`'s channel of `embedded` (an
        EmbeddedWorker); then(call) runs a call it leaves, the way choose()
        says.
        """
        super().__init__(link)
        self._then = then
        calls = link.calls
        self._here = embedded.all_reduce_here(
            calls.connection, link.numbering, calls, self._prepare,
            _NOT_HERE, link.timeout)

    def run(self, call: Call) -> Any:
        """Runs a plain Call.all_reduce() as all_reduce() does."""
        return self.all_reduce(call.raw, call.op, call.out, call.timeout,
                               call)

    def all_reduce(self, x: Any, op: Any, out: Any, timeout: Any,
                   call: Optional[Call] = None) -> Any:
        """Runs a blocking all_reduce of `x` with default options in the
        extension, or, when it leaves it, the way choose() says (which
        checks it first; `call` is its Call if one was made). Returns the
        output; raises the call's chorus.Error.
        """
        here = self._here
        done = _NOT_HERE if here is None else here(x, op, out, timeout)
        if done is _NOT_HERE:
            if call is None:
                call = Call.all_reduce(x, op, out, None, False, timeout,
                                       None, None)
            call.plain = False  # the table checks it and picks another way
            return self._then(call)
        if type(done) is tuple:  # failed: (its call, number, reply)
            prepared, number, reply = done
            outcome = Outcome(number)
            self.link.settler.settle(prepared, outcome, Replied(reply))
            return outcome.result()
        return done

    def close(self) -> None:
        """Drops the extension's entry (it holds this route: a cycle)."""
        self._here = None

    def _prepare(self, x: np.ndarray, op: Any) -> Tuple[bytes, Call]:
        """(the request's bytes but its number and data, the call) of a
        blocking all_reduce of arrays shaped as x, for the extension, which
        keeps them. Raises InvalidArgument as check() would.
        """
        data, name = _arrays.as_array(x, None, "x")
        prepared = Call("all_reduce", name, data.size, op=op,
                        out_shape=data.shape)
        prepared.out_bytes = data.nbytes
        prefix = self.link.prefixes.prefix("all_reduce", name, data.size, op,
                                           0, None, None)
        return prefix, prepared
