"""How a collective ends: the future an async_op call returns (Work), what a
blocking call settles in its place (Outcome), and settling either from the
worker's answer (Settler).

Every route ends its calls through Settler.settle(): the output, the plan it
ran, or the chorus.Error of a failure, built from the status the worker
sent; a call the worker refused before it took its number gives the number
back (Numbering.give_back), and every call is counted out of flight once
settled.

Thread safety: settle() may run on any thread (gRPC's, the call socket's
reader, the caller's); each call is settled once.
"""

from concurrent import futures
from typing import Any, Callable, Optional, Tuple, Union

import grpc
import numpy as np

from chorus import _names
from chorus._call import Call
from chorus._call_socket import CallSocket, outcome_of
from chorus._numbering import Numbering
from chorus.errors import (Cancelled, DeadlineExceeded, Error, Internal,
                           MembershipChanged, from_rpc_error)

__all__ = ["Work", "Outcome", "Blocking", "Replied", "Unsent", "Settler",
           "Receive"]

# Codes of a worker's (or gRPC's own size) refusal: without `number_used`
# the call took no sequence number.
_REFUSALS = (grpc.StatusCode.INVALID_ARGUMENT,
             grpc.StatusCode.FAILED_PRECONDITION,
             grpc.StatusCode.RESOURCE_EXHAUSTED)

Receive = Callable[[Any], Tuple[Any, Optional[np.ndarray]]]
"""Reads a finished call's answer (its future, or its stream) and returns
(the plan, the output); raises its grpc.RpcError or a chorus.Error.
"""


class Work(futures.Future):
    """The future of a collective issued with async_op=True: a
    concurrent.futures.Future whose result() is what the blocking call
    returns, and whose exception() is a chorus.Error. It cannot be cancelled:
    the other ranks match the call by its number.

    Attributes:
        sequence: the call's number in the group (from 1).
        algorithm: the plan it ran with ("inline", "ring", ...), once done.
        chunk_bytes: the plan's data-plane chunk size, once done.
    """

    def __init__(self, sequence: int) -> None:
        super().__init__()
        self.sequence: int = sequence
        self.algorithm: Optional[str] = None
        self.chunk_bytes: Optional[int] = None
        self.set_running_or_notify_cancel()

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Same as result(): waits for the call and returns its output."""
        return self.result(timeout)


class Outcome:
    """What a blocking call settles in place of a Work: its result or its
    error, on the caller's own thread.
    """

    __slots__ = ("sequence", "algorithm", "chunk_bytes", "_result",
                 "_error")

    def __init__(self, sequence: int) -> None:
        self.sequence = sequence
        self.algorithm: Optional[str] = None
        self.chunk_bytes: Optional[int] = None
        self._result: Any = None
        self._error: Optional[BaseException] = None

    def set_result(self, result: Any) -> None:
        """Records the call's output."""
        self._result = result

    def set_exception(self, error: BaseException) -> None:
        """Records the call's error."""
        self._error = error

    def result(self) -> Any:
        """Returns the output, or raises the error."""
        if self._error is not None:
            raise self._error
        return self._result


class Blocking:
    """A unary call made when its result is asked for, on that thread: what
    a call that blocks uses in place of a gRPC future.
    """

    __slots__ = ("_method", "_request", "_timeout")

    def __init__(self, method: Any, request: bytes, timeout: float) -> None:
        self._method = method
        self._request = request
        self._timeout = timeout

    def result(self) -> Any:
        """Makes the call and returns its response (or raises its
        grpc.RpcError).
        """
        request, self._request = self._request, b""
        return self._method(request, timeout=self._timeout)


class Replied:
    """A call that ended already, as a future of it: result() returns its
    Response or raises its CallSocketError.
    """

    __slots__ = ("_reply",)

    def __init__(self, reply: Tuple[Any, ...]) -> None:
        self._reply = reply

    def result(self) -> Any:
        """The call's Response; raises its CallSocketError."""
        response, error = outcome_of(self._reply)
        if error is not None:
            raise error
        return response


class Unsent:
    """A blocking call of an embedded worker that was not sent, the channel
    having broken, as a future of it: result() raises UNAVAILABLE.
    """

    __slots__ = ("_calls",)

    def __init__(self, calls: CallSocket) -> None:
        self._calls = calls

    def result(self) -> Any:
        """Raises the channel's CallSocketError (UNAVAILABLE)."""
        raise self._calls.unavailable()


class Settler:
    """Settles the calls of one communicator (one rank of `group`, through
    the worker at `worker`, numbered by `numbering`).
    """

    def __init__(self, group: str, worker: str, numbering: Numbering,
                 saw_change: Optional[Callable[[MembershipChanged], None]]
                 = None) -> None:
        """Settles calls of `group` through `worker`, numbered by
        `numbering`; `saw_change` hears of each MembershipChanged.
        """
        self._group = group
        self._worker = worker
        self._numbering = numbering
        self._saw_change = saw_change

    def settle(self, call: Call, work: Union[Work, Outcome], rpc: Any,
               receive: Optional[Receive] = None) -> None:
        """Completes `work` with the outcome of `rpc`: the plan and output
        that receive(rpc) returns (for a call in a message, which has none,
        its response's, written into call.target when there is one), or
        the chorus.Error either raises. A call refused before it took its
        number (a refusal code without `number_used`, e.g. over the
        worker's --max_tensor_bytes) gives its number back when no later
        call took one. Counts the call out of flight.
        """
        try:
            try:
                if receive is None:
                    response = rpc.result()
                    plan = response.plan
                    output = output_of(call, response.data, work.sequence)
                else:
                    plan, output = receive(rpc)
            except grpc.FutureCancelledError:
                raise Cancelled(f"{call.kind} #{work.sequence} was cancelled",
                                grpc.StatusCode.CANCELLED) from None
            except grpc.RpcError as e:
                raise self._error(call, work.sequence, e) from None
            work.algorithm = _names.ALGORITHM_NAMES.get(plan.algorithm,
                                                        str(plan.algorithm))
            work.chunk_bytes = plan.chunk_bytes
            work.set_result(output)
        except Error as e:
            work.set_exception(e)
        except (KeyboardInterrupt, SystemExit):
            raise  # a blocking call interrupted on its own thread
        except BaseException as e:  # never leave a future unfinished
            work.set_exception(Internal(
                f"{call.kind} #{work.sequence}: {type(e).__name__}: {e}",
                grpc.StatusCode.INTERNAL))
        finally:
            self._numbering.done()

    def _error(self, call: Call, sequence: int,
               failed: grpc.RpcError) -> Error:
        """The chorus.Error of call number `sequence` that failed with
        `failed`; gives the number back for a refusal that took none.
        """
        error = from_rpc_error(failed)
        if (isinstance(error, DeadlineExceeded) and
                error.message == "Deadline Exceeded"):
            # gRPC's own deadline came before the worker's verdict.
            error = DeadlineExceeded(
                f"{call.kind} #{sequence} of group {self._group} got no "
                f"answer from the worker daemon at {self._worker} within its "
                "deadline", error.code, error.details)
        if error.sequence is None:
            error.sequence = sequence
        if error.group is None:
            error.group = self._group
        if not error.number_used and error.code in _REFUSALS:
            self._numbering.give_back(sequence)
        if isinstance(error, MembershipChanged) and self._saw_change:
            self._saw_change(error)
        return error


def output_of(call: Call, data: bytes,
              sequence: int) -> Optional[np.ndarray]:
    """The output of call number `sequence` whose reply carried `data`:
    written into call.target when there is one, else a new array; raises
    Internal when `data` is not the output's size.
    """
    if call.kind == "sync":
        return data  # a SyncOutcome (worker.proto)
    if call.out_shape is None:
        return None
    expected = call.out_bytes
    if len(data) != expected:
        raise Internal(
            f"{call.kind} #{sequence}: the worker returned {len(data)} "
            f"bytes; the result takes {expected}",
            grpc.StatusCode.INTERNAL)
    if call.target is not None:
        # C-contiguous and `expected` bytes long (as_output).
        memoryview(call.target).cast("B")[:] = data
        return call.target
    return np.frombuffer(data, dtype=call.out_dtype).reshape(
        call.out_shape).copy()
