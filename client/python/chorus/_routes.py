"""The ways a collective travels from a rank to its worker: one Route class
per way, and choose(), the one table that picks a call's route.

A Route (chorus._route) overrides one method, run(call): it takes the
call's number, sends the call its way, and settles it (the output, or the
chorus.Error), as a torch ProcessGroup backend overrides its collectives.
The routes live in chorus._daemon_routes (a worker daemon's sockets) and
chorus._embedded_routes (a worker runtime in this process). The base way is
a unary WorkerLocal.Collective call, which any gRPC client makes; every
other way says in its docstring why it exists ("Exists because: ...",
naming a section of bench/README.md or a deployment).

choose() reads, in this order (the first row that fits wins):

    worker                 call                                 route
    ---------------------  -----------------------------------  -------------
    embedded, in process   blocking all_reduce, default         AllReduceHere
                           options, not checked yet
    embedded, in process   on arrays in GPU memory              OnDevice
    embedded, in process   async_op                             StartInto
    embedded, in process   blocking                             RunInto
    daemon                 input + output >= 64 KiB, and        SharedRegions
                           shared memory gives it a place       (call socket
                                                                or unary)
    daemon                 request or reply over the stream     Chunked
                           limit (4 MiB, or max_message_bytes)
    daemon, call socket    any other                            OnCallSocket
    daemon                 any other                            Unary

A sync (an elastic group's step boundary) goes on the call socket, or as a
unary call, on a daemon: its outcome is its output, in a reply. An
embedded rank's blocking sync runs on its own thread (RunInto), which hands
the outcome back in the reply it returns. Measured with
bench/elastic_sync.py --ranks=2 --worker=embedded: on the call socket a
sync took 1.73x an 8 B all_reduce of the same run (193.9 against 111.9 us
per call), run here 1.27x and 1.35x in two runs (91.7 against 72.2 us,
75.3 against 55.9 us; 2026-12-06).

"Embedded, in process": the rank joined through an EmbeddedWorker whose
channel runs calls on this process's threads (CallSocket.runs_here); once
that channel broke, its calls go the daemon rows' ways, to the embedded
worker's gRPC socket.

The first row is read first, by Communicator.all_reduce() before it makes
a Call (Routes.here, AllReduceHere.all_reduce()); choose() reads it for a
Call that comes that far. Measured with callgrind on a world-1 loop of
8 B all_reduce through an embedded worker: 30,582 instructions per call
before this table, 36,518 with that row read only here (a Call made, the
table read: +19%, and 2 ranks of bench/python_vs_embedded.py --sizes=8
--worker=embedded took 74.6 us per call against 51.0 at the median of 12
alternating runs), 30,381 with it read first (54.5 us against 54.5).

Thread safety: routes are made once per communicator and run calls from any
thread at once; what a call changes it owns (its Call) or changes under the
communicator's Numbering.
"""

from typing import Any, Optional

from chorus import _wire
from chorus._call import Call, check
from chorus._daemon_routes import Chunked, OnCallSocket, SharedRegions, Unary
from chorus._device_arrays import check_device_call
from chorus._embedded_routes import AllReduceHere, OnDevice, RunInto, StartInto
from chorus._route import Link, Route
from chorus._shared import SHARED_THRESHOLD_BYTES

__all__ = ["Route", "Link", "Routes", "choose", "AllReduceHere", "Chunked",
           "OnCallSocket", "OnDevice", "RunInto", "SharedRegions",
           "StartInto", "Unary"]

# Bytes a reply adds around its data: the data field's tag and length, the
# sequence and the plan.
REPLY_OVERHEAD = 64


class Routes:
    """The routes of one communicator, one of each (two of SharedRegions,
    over the call socket and over unary calls): what choose() picks from.
    """

    def __init__(self, link: Link, embedded: Any = None) -> None:
        """The routes on `link`; `embedded` is the EmbeddedWorker the
        communicator joined through, if any (for AllReduceHere).
        """
        self.link = link
        self.unary = Unary(link)
        self.on_call_socket = OnCallSocket(link)
        self.shared_unary = SharedRegions(link, link.unary)
        self.shared_on_socket = SharedRegions(link, link.on_socket)
        self.chunked = Chunked(link)
        self.run_into = RunInto(link)
        self.start_into = StartInto(link)
        self.on_device = OnDevice(link)
        self.here: Optional[AllReduceHere] = None
        calls = link.calls
        if embedded is not None and calls is not None and calls.runs_here:
            self.here = AllReduceHere(
                link, embedded, lambda call: choose(call, self).run(call))

    def close(self) -> None:
        """Drops what holds the communicator's channel in a cycle."""
        if self.here is not None:
            self.here.close()
        self.here = None


def choose(call: Call, routes: Routes) -> Route:
    """Returns the route of `call`: the table in this module's docstring.
    A call comes here unchecked; it is checked (check(), InvalidArgument
    before it takes a number) as every row but the first needs, and the
    first row's route checks it in C. For a large call on a daemon it asks
    shared memory for a place (call.place), which may lend a region that
    the route then gives back.
    """
    here = routes.here
    if here is not None and call.plain:
        return here
    link = routes.link
    check(call, link.prefixes, link.timeout)
    calls = link.calls
    socket = calls is not None and calls.broken is None  # still usable
    runs_here = calls is not None and calls.runs_here
    if check_device_call(call.data, call.target, call.out_shape is not None,
                         runs_here):
        return routes.on_device
    if call.kind == "sync":
        # Its outcome travels as its output, in a reply (run_into returns
        # a blocking sync's reply).
        if runs_here and not call.async_op:
            return routes.run_into
        return routes.on_call_socket if socket else routes.unary
    if runs_here:
        return routes.start_into if call.async_op else routes.run_into
    data_bytes = call.data_bytes
    output_bytes = call.out_bytes
    if data_bytes + output_bytes >= SHARED_THRESHOLD_BYTES:
        call.place = link.shared.place(call.data, call.target, output_bytes)
        if call.place is not None:
            return routes.shared_on_socket if socket else routes.shared_unary
    if max(_wire.request_bytes(call.prefix, data_bytes),
           output_bytes + REPLY_OVERHEAD) > link.stream_limit:
        return routes.chunked
    return routes.on_call_socket if socket else routes.unary
