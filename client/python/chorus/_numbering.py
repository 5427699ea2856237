"""The numbers of one communicator's collectives, and its calls in flight.

The n-th call of every rank of a group epoch is matched with the n-th call of
the others, so a rank numbers its calls 1, 2, 3, ... without gaps. Numbering
is the one owner of those numbers: every way a call travels takes its
number here (the embedded worker's extension through the same methods), and
a call the worker refused before it took its number gives it back. It also
counts the calls in flight, which close() waits for.

    number = numbering.take()                   # a call sent after
    number, sent = numbering.issue(send, call)  # send(number, call) under
                                                # the lock: in number order
    ...
    numbering.done()                            # once the call ended

Thread safety: every method may be called from any thread. Calls issued
concurrently are numbered in the order they take the lock.
"""

import threading
from typing import Any, Callable, Optional, Tuple, TypeVar

from chorus.errors import InvalidArgument

__all__ = ["Numbering"]

T = TypeVar("T")


class Numbering:
    """The call numbers of one communicator (one rank of one group epoch),
    from 1, and the count of its calls in flight.
    """

    def __init__(self) -> None:
        """Numbers from 1, no call in flight."""
        # Public: held while a number is taken and, in issue(), while the
        # call is sent; whoever holds it holds every call back.
        self.lock: threading.Lock = threading.Lock()
        self._drained = threading.Condition(self.lock)
        self._next = 1
        self._in_flight = 0
        self._closed = False

    @property
    def next(self) -> int:
        """The number the next call will take."""
        with self.lock:
            return self._next

    def take(self) -> int:
        """Takes the next number for a call and counts it in flight until
        done(). Raises InvalidArgument once closed.
        """
        # The lock is taken without `with` (and issue() is no context
        # manager): a small call makes this call and done() from C, and
        # each of those costs is a measurable part of it.
        lock = self.lock
        lock.acquire()
        try:
            if self._closed:
                raise InvalidArgument("this communicator is closed")
            number = self._next
            self._next = number + 1
            self._in_flight += 1
            return number
        finally:
            lock.release()

    def issue(self, send: Callable[..., T], *args: Any) -> Tuple[int, T]:
        """Takes the next number, as take(), and calls send(number, *args)
        while it holds the lock, so that calls go out in number order.
        Returns (the number, what send returned). When send raises, the
        call is counted out of flight, and for an Exception (the call was
        refused before it went out) its number is given back when no later
        call took one.
        """
        lock = self.lock  # not `with`, nor a context manager: see take()
        lock.acquire()
        try:
            if self._closed:
                raise InvalidArgument("this communicator is closed")
            number = self._next
            self._next = number + 1
            self._in_flight += 1
            try:
                return number, send(number, *args)
            except BaseException as e:
                self._done_locked()
                if isinstance(e, Exception) and self._next == number + 1:
                    self._next = number
                raise
        finally:
            lock.release()

    def give_back(self, number: int) -> None:
        """Makes `number` the next one again, when no later call took one:
        for a call the worker refused before it took its number (it is
        still counted in flight until done()).
        """
        with self.lock:
            if self._next == number + 1:
                self._next = number

    def done(self) -> None:
        """Counts a call as no longer in flight."""
        lock = self.lock  # _done_locked(), written out (see take())
        lock.acquire()
        try:
            self._in_flight -= 1
            if self._closed and self._in_flight == 0:
                self._drained.notify_all()
        finally:
            lock.release()

    def close(self, timeout: Optional[float] = None) -> None:
        """Refuses every later number (take() raises InvalidArgument), then
        waits for the calls in flight to end, `timeout` seconds at most.
        Idempotent.
        """
        with self.lock:
            self._closed = True
            self._drained.wait_for(lambda: self._in_flight == 0, timeout)

    def _done_locked(self) -> None:
        self._in_flight -= 1
        if self._closed and self._in_flight == 0:
            self._drained.notify_all()
