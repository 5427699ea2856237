"""The torch work objects of the chorus backend, completed by the Chorus
calls' own completion (a chorus.Work future's done callback): no thread
waits or polls for them.

torch 1.13 leaves a backend written in Python two kinds of work, and each
suits one kind of caller:

- C++ callers (DDP's reducer and constructor, dist._broadcast_coalesced)
  call the C++ virtual methods of what they get back, which a Python
  subclass of Work cannot override: they get the C++ work that
  torch._C._distributed_c10d._create_work_from_future makes. Its wait()
  drops a failed future's error; its future carries the error, so DDP
  raises it when it reads the result at the end of backward().
- The Python functions of torch.distributed (dist.all_reduce, ...) call
  wait() from Python: they get a ChorusWork, whose wait() raises the
  chorus.Error itself, with its status message and attributes.

Both hand out the same torch future from get_future(): a failure makes it
raise a RuntimeError that carries the Chorus message (torch turns the
error of a future's callback into one).
"""

import atexit
import copy
import threading
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

import chorus
from chorus.torch import _tensors

Finish = Callable[[Any], List[torch.Tensor]]
"""Turns a finished chorus.Work's result into the tensors a torch work
holds (copying the result into the caller's tensors where needed).
"""


def _value_or_raise(future: torch.futures.Future) -> Any:
    """The callback that makes the C++-visible future: the value, or the
    Chorus error raised again, which torch stores as the future's error
    (its text, with the traceback of this frame alone).
    """
    try:
        return future.value()
    except chorus.Error as e:
        raise copy.copy(e) from None


class _InFlight:
    """Every collective whose completion still has torch work to do.

    torch may not run on a daemon thread while the interpreter shuts down
    (a thread that takes the GIL back then is ended inside torch's C++
    code, and the process aborts), and gRPC completes the calls on its
    daemon threads. So the callbacks gRPC holds reach the torch objects of
    a call only through this table: settling takes them out, and the exit
    hook waits for the settlings under way, then drops what is left (calls
    still in flight) on the main thread. The arrays the communicator holds
    hand their tensors to the caller's thread when they end (see
    chorus.torch._tensors.numpy_view).
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._pending: Dict[int, Tuple["Completion", Finish]] = {}
        self._settling = 0
        self._exiting = False
        self._next_key = 0

    def add(self, completion: "Completion", finish: Finish) -> int:
        """Registers a call's torch objects; returns its key."""
        with self._lock:
            self._next_key += 1
            self._pending[self._next_key] = (completion, finish)
            return self._next_key

    def settle(self, key: int, work: "chorus.Work") -> None:
        """Completes the call of `key` with `work`'s outcome (the callback
        of the chorus.Work); does nothing after the exit hook ran.
        """
        with self._lock:
            if self._exiting or key not in self._pending:
                return
            self._settling += 1
        try:
            self._settle(key, work)  # its torch references end with it
        finally:
            with self._lock:
                self._settling -= 1
                self._lock.notify_all()

    def _settle(self, key: int, work: "chorus.Work") -> None:
        with self._lock:
            completion, finish = self._pending.pop(key)
        completion.complete(work, finish)

    def shut_down(self, timeout: float = 30.0) -> None:
        """The exit hook: lets the settlings under way end (at most
        `timeout` seconds) and drops the torch objects of the calls still
        in flight here, on the main thread.
        """
        with self._lock:
            self._exiting = True
            left = list(self._pending.values())
            self._pending.clear()
            self._lock.wait_for(lambda: self._settling == 0, timeout)
        del left
        _tensors.release_deferred()


_IN_FLIGHT = _InFlight()
atexit.register(_IN_FLIGHT.shut_down)


class Completion:
    """The outcome of one collective as torch sees it: the tensors or the
    error, a torch future that C++ callers can read, and an event for
    waiting with a deadline.

    It completes from the chorus.Work's done callback, on the thread that
    finishes the gRPC call. Thread safety: complete() runs once; everything
    else may be called from any thread.
    """

    def __init__(self, kind: str) -> None:
        """An unfinished completion of a collective of `kind`."""
        self.kind: str = kind
        self.sequence: Optional[int] = None
        self.error: Optional[BaseException] = None
        self.tensors: List[torch.Tensor] = []
        self.done = threading.Event()
        self._future: torch.futures.Future = torch.futures.Future()
        # then() turns the Python-level exception of _future into a C++
        # error that DDP's reducer sees when it reads the value.
        self.future: torch.futures.Future = self._future.then(
            _value_or_raise)

    def attach(self, work: "chorus.Work", finish: Finish) -> None:
        """Completes this once `work` is done, with finish(its result) or
        with its error.
        """
        self.sequence = work.sequence
        key = _IN_FLIGHT.add(self, finish)
        work.add_done_callback(
            lambda done: _IN_FLIGHT.settle(key, done))

    def complete(self, work: "chorus.Work", finish: Finish) -> None:
        """Completes this with finish(work's result), or with its error."""
        try:
            error = work.exception()
            if error is None:
                self.tensors = finish(work.result())
        except Exception as e:  # never leave the future unfinished
            error = e
        self.error = error
        if error is None:
            self._future.set_result(self.tensors)
        else:
            self._future.set_exception(error)
        self.done.set()

    def wait(self, timeout: Optional[float] = None) -> List[torch.Tensor]:
        """Waits (at most `timeout` seconds) and returns the tensors, or
        raises the Chorus error; TimeoutError when the wait ran out first.
        """
        if not self.done.wait(timeout):
            raise TimeoutError(
                f"{self.kind} #{self.sequence} did not finish within "
                f"{timeout} s of waiting (the call goes on until its own "
                "deadline)")
        if self.error is not None:
            raise self.error
        return self.tensors


def cpp_work(completion: Completion) -> dist.Work:
    """The C++ work for callers in C++ (see the module's docstring)."""
    return _create_work_from_future(completion.future)


class ChorusWork(dist.Work):
    """The work a torch.distributed function gets for a call it issued with
    the chorus backend: wait() raises the chorus.Error of a failed call
    (InvalidArgument with the per-rank account of a mismatch, Aborted
    naming the lost rank, DeadlineExceeded naming the missing ones).

    Attributes:
        kind: the collective ("all_reduce", ...).
        sequence: its number in the Chorus group.
    """

    def __init__(self, completion: Completion) -> None:
        """Wraps the completion of one collective."""
        super().__init__()
        self._completion = completion

    @property
    def kind(self) -> str:
        """The collective, e.g. "all_reduce"."""
        return self._completion.kind

    @property
    def sequence(self) -> Optional[int]:
        """The call's number in the Chorus group."""
        return self._completion.sequence

    def wait(self, timeout: Union[timedelta, float, None] = None) -> bool:
        """Waits for the call and returns True, or raises its chorus.Error.
        With `timeout` (a timedelta or seconds), raises TimeoutError when
        the call is not done by then; the call keeps its own deadline.
        """
        if isinstance(timeout, timedelta):
            seconds: Optional[float] = timeout.total_seconds()
            if seconds < 0:  # torch's "no timeout"
                seconds = None
        else:
            seconds = timeout
        self._completion.wait(seconds)
        return True

    def get_future(self) -> torch.futures.Future:
        """The torch future of the call: its value is the list of output
        tensors; a failure raises a RuntimeError carrying the Chorus message.
        """
        return self._completion.future

    def is_completed(self) -> bool:
        """Whether the call finished, either way."""
        return self._completion.done.is_set()

    def is_success(self) -> bool:
        """Whether the call finished without an error."""
        return self.is_completed() and self._completion.error is None

    def exception(self) -> Optional[BaseException]:
        """The call's error once it failed, else None."""
        return self._completion.error

    def result(self) -> List[torch.Tensor]:
        """Waits and returns the output tensors, or raises the error."""
        return self._completion.wait()

    def source_rank(self) -> int:
        """Not defined for the collectives Chorus runs."""
        raise RuntimeError("source_rank() is only defined for recv, which "
                           "the chorus backend does not have")

    def synchronize(self) -> None:
        """Nothing to do: the results are in host memory once done."""

    def __repr__(self) -> str:
        state = ("pending" if not self.is_completed() else
                 "done" if self.is_success() else "failed")
        return (f"ChorusWork({self.kind} #{self.sequence}, {state})")
