"""The routes to a worker's local API over its sockets: unary gRPC calls,
the call socket, shared regions, and the chunked stream.

Each call takes its number and is sent under the numbering's lock
(Numbering.issue), so calls go out in number order, and is settled on the
caller's thread (blocking) or when its answer comes (async_op).
"""

import threading
from typing import Any, Callable, Iterator, Optional, Tuple

import grpc
import numpy as np

from chorus import _wire
from chorus._call import Call
from chorus._outcome import Outcome, Work
from chorus._route import Link, Route
from chorus._shared import Place
from chorus.errors import Internal
from chorus.v1 import worker_pb2

__all__ = ["Unary", "OnCallSocket", "SharedRegions", "Chunked"]

Sender = Callable[[int, bytes, Optional[np.ndarray], Call], Any]
"""Link.unary or Link.on_socket: sends call number n of a prefix and data,
returns the call's future.
"""


class Unary(Route):
    """A call as one unary WorkerLocal.Collective call, its tensors in the
    messages: the way any gRPC client calls a worker (worker.proto), and
    where the others are not there (a daemon on another host, call_socket=
    False, a call socket that broke).
    """

    def run(self, call: Call) -> Any:
        """Sends `call` as one WorkerLocal.Collective call."""
        link = self.link
        number, rpc = link.numbering.issue(link.unary, call.prefix,
                                           call.data, call)
        return link.finish(call, number, rpc)


class OnCallSocket(Route):
    """A call as one LocalCallFrame on the daemon's call socket (plain
    frames on a Unix socket, chorus._call_socket), its tensors in the frame.

    Exists because: a small call costs a fraction of a gRPC call's time
    here (bench/README.md, "Python client next to embedded ranks": at 8 B
    a bare gRPC call from Python that the daemon refused at once took
    300-700 us, several times the embedded all-reduce; one run of
    bench/python_vs_embedded.py --ranks=2 --sizes=8 gave 340 us per call on
    the call socket against 619 us as gRPC calls, client/python/README.md,
    "Call socket").
    """

    def run(self, call: Call) -> Any:
        """Sends `call` on the call socket (as a unary call where the socket
        turns out broken).
        """
        link = self.link
        number, rpc = link.numbering.issue(link.on_socket, call.prefix,
                                           call.data, call)
        return link.finish(call, number, rpc)


class SharedRegions(Route):
    """A call whose input and output lie in memory shared with the daemon
    (WorkerLocal.OpenSharedRegion, chorus._shared): the request names byte
    ranges of regions, and no tensor byte crosses a socket. The request
    goes on the call socket or as a unary call, as `send` says.

    Exists because: an all_reduce of 64 MiB at 2 ranks through daemons
    took 64.5 ms with numpy arrays copied through shared memory and 41.3 ms
    with shared arrays, against 541 ms streamed in messages
    (bench/README.md, "Python client next to embedded ranks", the first
    table).
    """

    def __init__(self, link: Link, send: Sender) -> None:
        """Shared regions on `link`, the request sent by `send`."""
        super().__init__(link)
        self._send = send

    def run(self, call: Call) -> Any:
        """Sends `call` naming its place in shared memory (call.place, found
        by choose()), and copies its output out of a pool region.
        """
        link = self.link
        place: Place = call.place
        prefix = call.prefix + place.fields  # where the daemon reads, writes
        try:
            number, rpc = link.numbering.issue(self._send, prefix, None, call)
        except BaseException:
            if place.lease is not None:
                link.shared.give_back(place.lease)
            raise

        def receive(done: Any) -> Tuple[Any, Optional[np.ndarray]]:
            return self._receive(done, call, number, place)

        return link.finish(call, number, rpc, receive)

    def _receive(self, rpc: Any, call: Call, number: int, place: Place
                 ) -> Tuple[Any, Optional[np.ndarray]]:
        """Returns (the plan, the output) of a finished call, copying the
        output out of the pool region unless it landed in call.target
        itself. The region goes back to the pool, or, when the call ended
        without the daemon's answer (it may still write into it), is
        released.
        """
        shared = self.link.shared
        try:
            response = rpc.result()
        except BaseException:
            if place.lease is not None:
                shared.discard(place.lease)
            raise
        try:
            if response.data:
                raise Internal(f"{call.kind} #{number}: the worker sent "
                               "its output in the reply, not in shared "
                               "memory", grpc.StatusCode.INTERNAL)
            if call.out_shape is None:
                return response.plan, None
            target = call.target
            if place.in_target:
                return response.plan, target
            size = call.out_bytes
            assert place.lease is not None
            result = place.lease.view[place.out_offset:
                                      place.out_offset + size]
            if target is not None:
                target.reshape(-1).view(np.uint8)[...] = result
                return response.plan, target
            return response.plan, result.view(call.out_dtype).reshape(
                call.out_shape).copy()
        finally:
            if place.lease is not None:
                shared.give_back(place.lease)


class Chunked(Route):
    """A call whose tensors stream in pieces of at most 4 MiB through
    WorkerLocal.CollectiveChunked.

    Exists because: a daemon takes gRPC messages of max_message_bytes at
    most (64 MiB), and where it shares no memory with the rank (another
    host, another user, shared_memory=False) a larger tensor has no other
    way (bench/README.md, "Python client next to embedded ranks": the
    `stream` rows).
    """

    def run(self, call: Call) -> Any:
        """Streams `call`'s input and output; its answer is read on this
        thread (blocking) or on a thread of its own (async_op).
        """
        link = self.link
        number, rpc = link.numbering.issue(_open_stream, call, link)

        def receive(done: Any) -> Tuple[Any, Optional[np.ndarray]]:
            return _receive_streamed(done, call, number)

        settle = link.settler.settle
        if not call.async_op:
            outcome = Outcome(number)
            settle(call, outcome, rpc, receive)  # on this thread
            return outcome.result()
        work = Work(number)
        threading.Thread(target=settle, daemon=True,
                         name=f"chorus-{call.kind}-{number}",
                         args=(call, work, rpc, receive)).start()
        return work


def _open_stream(number: int, call: Call, link: Link) -> Any:
    """Opens the CollectiveChunked stream of call number `number`: its
    header, then its input in pieces. Returns the stream of responses.
    """
    request = worker_pb2.LocalCollectiveRequest.FromString(call.prefix)
    request.sequence = number
    header = worker_pb2.LocalChunkedRequest(
        header=worker_pb2.LocalChunkedHeader(
            call=request, input_bytes=call.data_bytes))
    return link.chunked(
        _wire.chunked_requests(header.SerializeToString(), call.data),
        timeout=call.timeout)


def _receive_streamed(responses: Iterator[Any], call: Call, number: int
                      ) -> Tuple[Any, Optional[np.ndarray]]:
    """Reads a CollectiveChunked stream to its end and returns (the plan,
    the output), writing the pieces straight into the result.
    """
    expected = call.out_bytes
    header = None
    buffer = np.empty(0, np.uint8)
    received = 0
    for response in responses:
        if response.WhichOneof("part") == "header":
            if header is not None:
                raise Internal(f"{call.kind} #{number}: the worker "
                               "sent a second header",
                               grpc.StatusCode.INTERNAL)
            header = response.header
            if header.output_bytes != expected:
                raise Internal(
                    f"{call.kind} #{number}: the worker returns "
                    f"{header.output_bytes} bytes; the result takes "
                    f"{expected}", grpc.StatusCode.INTERNAL)
            if call.target is not None:
                buffer = call.target.reshape(-1).view(np.uint8)
            else:
                buffer = np.empty(expected, np.uint8)
            continue
        piece = response.data
        if header is None or received + len(piece) > expected:
            raise Internal(
                f"{call.kind} #{number}: the worker sent more output "
                f"than the {expected} bytes it announced, or sent it "
                "before its header", grpc.StatusCode.INTERNAL)
        buffer[received:received + len(piece)] = np.frombuffer(
            piece, np.uint8)
        received += len(piece)
    if header is None or received != expected:
        raise Internal(
            f"{call.kind} #{number}: the worker's stream ended after "
            f"{received} of {expected} bytes of output",
            grpc.StatusCode.INTERNAL)
    if call.out_shape is None:
        return header.plan, None
    if call.target is not None:
        return header.plan, call.target
    return header.plan, buffer.view(call.out_dtype).reshape(call.out_shape)
