"""What every route of a communicator shares: the Link it travels on, and
Route, the base class whose run() each way overrides (chorus._routes has
the table).

Thread safety: a Link and its routes run calls from any thread at once.
"""

from typing import Any, Optional

import numpy as np

from chorus import _wire
from chorus._call import Call
from chorus._call_socket import CallSocket
from chorus._numbering import Numbering
from chorus._outcome import Blocking, Outcome, Receive, Settler, Work
from chorus._shared import SharedMemory
from chorus._wire import Prefixes

__all__ = ["Link", "Route", "NOTHING"]

# The input or output of a call that has none, for the in-process routes:
# no byte of it is read or written.
NOTHING = np.empty(0, np.uint8)


class Link:
    """What one communicator's routes travel on and share: its worker's
    local API (the unary and streaming stubs on its gRPC channel), its call
    socket or embedded channel, its shared memory, and the communicator's
    numbering, request prefixes and settling.
    """

    def __init__(self, *, timeout: float, prefixes: Prefixes,
                 numbering: Numbering,
                 settler: Settler, collective: Any, chunked: Any,
                 shared: SharedMemory, calls: Optional[CallSocket],
                 stream_limit: int) -> None:
        """Made by the Communicator: `timeout` is its calls' default
        deadline, `collective` and `chunked` its channel's
        WorkerLocal.Collective (bytes in) and CollectiveChunked stubs,
        `calls` its call socket (None: none), `stream_limit` the largest
        request or reply that goes in one message.
        """
        self.timeout = timeout
        self.prefixes = prefixes
        self.numbering = numbering
        self.settler = settler
        self.collective = collective
        self.chunked = chunked
        self.shared = shared
        self.calls = calls
        self.stream_limit = stream_limit

    def unary(self, number: int, prefix: bytes, data: Optional[np.ndarray],
              call: Call) -> Any:
        """Sends call number `number` (its request's `prefix`, and `data`
        as its data field) as one WorkerLocal.Collective call; returns its
        future, or for a blocking call one made when its result is asked
        for, on that thread (the worker orders calls by number however they
        arrive).
        """
        wire = b"".join(_wire.request_parts(prefix, number, data))
        if not call.async_op:
            return Blocking(self.collective, wire, call.timeout)
        return self.collective.future(wire, timeout=call.timeout)

    def on_socket(self, number: int, prefix: bytes,
                  data: Optional[np.ndarray], call: Call) -> Any:
        """Sends call number `number` as unary() does, on the call socket,
        or, where the socket turns out broken (nothing sent), as a unary
        call; returns its future.
        """
        calls = self.calls
        sent = None
        if calls is not None and calls.broken is None:  # still usable
            sent = calls.call(_wire.request_parts(prefix, number, data),
                              call.timeout, blocking=not call.async_op)
        if sent is None:
            sent = self.unary(number, prefix, data, call)
        return sent

    def finish(self, call: Call, number: int, rpc: Any,
               receive: Optional[Receive] = None) -> Any:
        """Settles call number `number` whose answer `rpc` brings: on this
        thread for a blocking call (its output returned, its error raised),
        else when `rpc` is done (its Work returned).
        """
        if not call.async_op:
            outcome = Outcome(number)
            self.settler.settle(call, outcome, rpc, receive)
            return outcome.result()
        work = Work(number)
        rpc.add_done_callback(
            lambda done: self.settler.settle(call, work, done, receive))
        return work


class Route:
    """One way a collective travels from this rank to its worker. A
    subclass overrides run(); routes are made once per communicator, on its
    Link.
    """

    def __init__(self, link: Link) -> None:
        """A route on `link`."""
        self.link = link

    def run(self, call: Call) -> Any:
        """Runs a call choose() gave this route: takes its number, sends it,
        settles it. Returns the output of a blocking call (raising its
        chorus.Error) or the Work of an async_op one.
        """
        raise NotImplementedError
