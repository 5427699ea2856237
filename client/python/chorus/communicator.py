"""A Communicator: one rank of a Chorus group, and its collectives.

A Communicator is one rank of one group, reached through the local API of a
worker daemon (chorus.v1.WorkerLocal) or an embedded worker runtime;
chorus.join() (chorus._join) makes it. It numbers its collectives from 1 in
the order they are issued (chorus._numbering) and carries the group's epoch,
so the n-th call of every rank is matched with the n-th call of the others.
Each collective checks its arguments, makes a Call, and runs it the way
chorus._routes' table chooses.

Thread safety: every method may be called from any thread. Calls issued
concurrently from several threads are numbered in the order they take the
numbering's lock, so ranks that do that must agree on the order some other
way.
"""

# Annotations stay unevaluated: the public methods' signatures cost no
# typing work each time.
from __future__ import annotations

import math
import threading
from typing import Any, List, Optional, Sequence, Tuple, Union

import grpc
import numpy as np

from chorus import _arrays, _dtypes
from chorus._arrays import Buffer
from chorus._call import Call
from chorus._call_socket import CallSocket
from chorus._device_arrays import DeviceArray, is_device_array
from chorus._numbering import Numbering
from chorus._outcome import Settler, Work
from chorus._routes import Link, Routes, choose
from chorus._shared import SHARED_THRESHOLD_BYTES, SharedMemory
from chorus._wire import Prefixes
from chorus._elastic import Elastic
from chorus._membership import Hold, Membership
from chorus.embedded import EmbeddedWorker
from chorus.errors import InvalidArgument, MembershipChanged
from chorus.v1 import types_pb2, worker_pb2

__all__ = ["join", "Communicator", "Membership", "Work", "Buffer",
           "DEFAULT_TIMEOUT",
           "MAX_MESSAGE_BYTES", "STREAM_THRESHOLD_BYTES",
           "SHARED_THRESHOLD_BYTES"]

DEFAULT_TIMEOUT: float = 60.0
"""Seconds a join or a collective may take unless `timeout` says otherwise."""

MAX_MESSAGE_BYTES: int = 64 * 1024 * 1024
"""The largest gRPC message the worker daemon accepts or sends (64 MiB).
Collectives whose tensors would not fit one message go through the daemon's
CollectiveChunked stream, in pieces, instead.
"""

STREAM_THRESHOLD_BYTES: int = 4 * 1024 * 1024
"""A collective whose request or reply would be over this many bytes (or
over max_message_bytes, when that is smaller) streams its input and output
in pieces of at most 4 MiB through WorkerLocal.CollectiveChunked; smaller
ones go as one unary WorkerLocal.Collective call each.
"""


_COLLECTIVE_METHOD = "/chorus.v1.WorkerLocal/Collective"
_CHUNKED_METHOD = "/chorus.v1.WorkerLocal/CollectiveChunked"
_HOLD_METHOD = "/chorus.v1.WorkerLocal/HoldMembership"
# How long close() waits for the daemon to take the hold's release.
_RELEASE_WAIT = 2.0


class Communicator(Elastic):
    """One rank of a Chorus group, joined through a worker daemon. Made by
    chorus.join(); use it as a context manager or call close().

    Each collective takes this rank's input and returns its output as a new
    numpy array (or writes it into `out` and returns `out`). Inputs are numpy
    arrays, C-contiguous buffers or DLPack tensors of the ten Chorus dtypes;
    bf16 travels as its 16-bit patterns: pass a uint16 array with
    dtype="bf16" and get uint16 back (chorus.bf16_to_f32 widens it).

    A rank that embeds the worker runtime (chorus.embedded) and joined on a
    GPU (device="cuda:N") also takes arrays in that GPU's memory: objects
    with __cuda_array_interface__ (CuPy, Numba, torch CUDA tensors), input
    and `out` alike, `out` given (e.g. out=x). The call reads and writes
    them where they are, ordered on the interface's `stream` when it names
    one: the call waits on the GPU for the work enqueued there before it,
    and work enqueued there after the call returned (or its Work ended)
    sees its output.

    Common keyword arguments:
        async_op: return a Work future at once instead of waiting; calls in
            flight are matched in the order they were issued. Through an
            embedded worker the call reads the input and writes `out` in
            place while it runs: leave the input unchanged and `out` unread
            until the Work ended.
        timeout: seconds the call may take, including the wait for the other
            ranks (default: the join's timeout).
        algorithm: force a plan: "auto" (default), "inline", "ring",
            "recursive_doubling" or "same_host" (the last two for all_reduce
            only); every rank must force the same.
        device: the device the daemon reduces this call on ("cuda:0"); the
            rank's device when None.

    Tensors of any size go through: a call whose request or reply would be
    over STREAM_THRESHOLD_BYTES streams them in pieces (the daemon's
    --max_tensor_bytes, 4 GiB by default, bounds one call's input and
    output: ResourceExhausted over it).

    Checks this class can make itself (dtypes, sizes, contiguity, roots)
    raise InvalidArgument at once, before the call takes a sequence number;
    so do the daemon's refusals of a call's size (InvalidArgument) and of a
    tensor over its cap (ResourceExhausted). Other errors from the servers
    come as chorus.Error subclasses (from result() for async calls), after
    the call used up its number (their `number_used` is True).
    """


    def __init__(self, *, _channel: grpc.Channel, _worker: str, _group: str,
                 _world_size: int, _rank: int, _epoch: int, _device: str,
                 _member_devices: List[str], _timeout: float,
                 _max_message_bytes: int, _shared_memory: bool = True,
                 _call_socket: str = "",
                 _embedded: Optional[EmbeddedWorker] = None,
                 _device_proto: Optional[types_pb2.Device] = None,
                 _min_world_size: int = 0,
                 _max_world_size: int = 0) -> None:
        """Made by chorus.join(); not meant to be called directly."""
        self._channel = _channel
        self._worker = _worker
        self._group = _group
        self._world_size = _world_size
        self._rank = _rank
        self._epoch = _epoch
        self._device = _device
        self._device_proto = _device_proto or types_pb2.Device()
        self._member_devices = _member_devices
        self._timeout = _timeout
        self._max_message_bytes = _max_message_bytes
        self._shared_memory = _shared_memory
        self._embedded = _embedded
        self._min_world_size = _min_world_size
        self._max_world_size = _max_world_size
        self._joiners_waiting = 0
        self._calls = _call_socket_of(_call_socket, _embedded)
        # Moves to a new epoch (and a change an async call saw) happen under
        # this lock.
        self._switch = threading.Lock()
        self._change: Optional[MembershipChanged] = None
        # Parts of epochs this rank left (numbering, routes, shared memory),
        # closed with the communicator.
        self._retired: List[Any] = []
        self._build()
        self._hold = Hold(_channel, _group, _epoch, _rank)

    def _build(self) -> None:
        """Makes the numbering, shared memory and routes of this rank's
        current epoch.
        """
        self._numbering = Numbering()
        self._shared = SharedMemory(self._channel, self._group, self._epoch,
                                    self._rank, self._shared_memory)
        # The request is serialized by the routes, so the stubs take bytes
        # as they are.
        link = Link(
            timeout=self._timeout,
            prefixes=Prefixes(self._group, self._rank, self._epoch),
            numbering=self._numbering,
            settler=Settler(self._group, self._worker, self._numbering,
                            self._saw_change),
            collective=self._channel.unary_unary(
                _COLLECTIVE_METHOD, request_serializer=None,
                response_deserializer=(
                    worker_pb2.LocalCollectiveResponse.FromString)),
            chunked=self._channel.stream_stream(
                _CHUNKED_METHOD, request_serializer=None,
                response_deserializer=(
                    worker_pb2.LocalChunkedResponse.FromString)),
            shared=self._shared, calls=self._calls,
            # A call whose request or reply is larger streams.
            stream_limit=min(STREAM_THRESHOLD_BYTES,
                             self._max_message_bytes))
        self._routes = Routes(link, self._embedded)

    # --- properties ---------------------------------------------------------

    @property
    def group(self) -> str:
        """The group's name."""
        return self._group

    @property
    def world_size(self) -> int:
        """The number of ranks in the group (an elastic group's current)."""
        self._catch_up()
        return self._world_size

    @property
    def rank(self) -> int:
        """This rank, 0 .. world_size - 1 (in an elastic group's current
        epoch).
        """
        self._catch_up()
        return self._rank

    @property
    def epoch(self) -> int:
        """The group's epoch this rank is in; calls carry it."""
        self._catch_up()
        return self._epoch

    @property
    def min_world_size(self) -> int:
        """An elastic group's minimum (0: not elastic)."""
        return self._min_world_size

    @property
    def max_world_size(self) -> int:
        """An elastic group's maximum (0: not elastic)."""
        return self._max_world_size

    @property
    def joiners_waiting(self) -> int:
        """Newcomers waiting to join this elastic group, as the last sync()
        or membership change said.
        """
        return self._joiners_waiting

    @property
    def device(self) -> str:
        """This rank's device, by canonical name ("Cpu", "Cuda(0)")."""
        return self._device

    @property
    def member_devices(self) -> List[str]:
        """Every rank's device by canonical name, in rank order.

        Empty for a group larger than the coordinator's
        ``--member_list_max`` (256 ranks by default), whose members the
        workers learn only as they exchange data with them.
        """
        return list(self._member_devices)

    @property
    def worker(self) -> str:
        """The gRPC target of the worker daemon's local API it dialed:
        "unix:/path" (the default socket too) or "host:port".
        """
        return self._worker

    @property
    def timeout(self) -> float:
        """The default deadline of each call, in seconds."""
        return self._timeout

    @property
    def max_message_bytes(self) -> int:
        """The largest gRPC message the daemon takes and sends; larger calls
        stream their tensors.
        """
        return self._max_message_bytes

    @property
    def shared_memory(self) -> str:
        """Whether large collectives go through memory shared with the
        daemon: "on" once a region was mapped, "untried" before the first
        such call, else why not (e.g. the daemon runs as another user).
        """
        usable = self._shared.usable
        if usable is None:
            return "untried"
        return "on" if usable else self._shared.why_not

    @property
    def device_arrays(self) -> bool:
        """Whether this rank's collectives take arrays in GPU memory
        (__cuda_array_interface__): it embeds the worker runtime and joined
        on a GPU ("cuda:N").
        """
        return (self._embedded is not None and
                self._device_proto.kind == types_pb2.DEVICE_KIND_CUDA)

    @property
    def call_socket(self) -> bool:
        """Whether collectives go on the daemon's call socket (plain frames)
        rather than as gRPC calls; False where the daemon offers none, it
        cannot be opened from here, join() was told not to, or the
        connection broke (later calls are gRPC calls then).
        """
        return self._calls is not None and self._calls.usable

    def shared_array(self, shape: Union[int, Sequence[int]],
                     dtype: Any = "float32") -> np.ndarray:
        """Returns a new, uninitialized array of `shape` and `dtype` (a
        Chorus dtype name or a numpy dtype) in memory shared with the
        daemon. Passed as a collective's input or `out`, its bytes are not
        copied on this side at all: the daemon reads and writes them in
        place. It stays valid until it is garbage, but after close() it is
        no longer shared. Where the daemon shares no memory with this
        process it is an ordinary array (and calls copy as usual).

        Raises:
            InvalidArgument: a malformed shape or an unknown dtype.
        """
        arr_shape = _arrays.shape_of(shape)
        try:
            name = _dtypes.dtype_name(dtype)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
        np_dtype = _dtypes.numpy_dtype(name)
        shared = self._shared.array(arr_shape, np_dtype)
        if shared is None:
            return np.empty(arr_shape, np_dtype)
        return shared

    @property
    def next_sequence(self) -> int:
        """The number the next collective will take."""
        return self._numbering.next

    def __repr__(self) -> str:
        return (f"Communicator(group={self._group!r}, rank={self._rank}, "
                f"world_size={self._world_size}, worker={self._worker!r}, "
                f"epoch={self._epoch})")

    # --- lifecycle ----------------------------------------------------------

    def close(self, timeout: Optional[float] = None) -> None:
        """Waits for the calls in flight (at most `timeout` seconds; their
        own deadlines bound the wait anyway), releases the rank's hold (so
        the daemon does not report it gone; a rank of an elastic group
        leaves it, and the others go on at once), then closes the
        connection to the daemon. Later calls raise InvalidArgument.
        Idempotent.
        """
        for numbering, routes, shared in self._retired + [
                (self._numbering, self._routes, self._shared)]:
            numbering.close(timeout)
            routes.close()
            shared.close()
        if self._calls is not None:
            self._calls.close()
        self._hold.release(_RELEASE_WAIT)
        self._channel.close()

    def leave(self, timeout: Optional[float] = None) -> None:
        """Leaves the group cleanly: close(). The other ranks of an elastic
        group get MembershipChanged at once and go on without this one.
        """
        self.close(timeout)

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # --- collectives --------------------------------------------------------

    def all_reduce(self, x: Buffer, op: str = "sum", *,
                   out: Optional[Buffer] = None, dtype: Any = None,
                   async_op: bool = False, timeout: Optional[float] = None,
                   algorithm: Optional[str] = None,
                   device: Optional[str] = None) -> Any:
        """Reduces `x` elementwise across all ranks with `op` ("sum",
        "prod", "min", "max", "avg"); every rank gets the result, shaped as
        x. count = x.size; every rank passes the same shape and dtype.
        """
        here = self._routes.here
        if (here is not None and not async_op and dtype is None and
                algorithm is None and device is None):
            # The table's first row, read before a Call is made
            # (chorus._routes says why).
            return here.all_reduce(x, op, out, timeout)
        # x is read as the call's route needs it (chorus._call.check).
        return self._run(Call.all_reduce(x, op, out, dtype, async_op, timeout,
                                         algorithm, device))


    def reduce(self, x: Buffer, root: int = 0, op: str = "sum", *,
               out: Optional[Buffer] = None, dtype: Any = None,
               async_op: bool = False, timeout: Optional[float] = None,
               algorithm: Optional[str] = None,
               device: Optional[str] = None) -> Any:
        """Reduces `x` elementwise across all ranks with `op`; the root gets
        the result shaped as x, every other rank gets None (and `out` is left
        alone). count = x.size; every rank passes its input.
        """
        arr, name = _arrays.as_array(x, dtype, "x")
        root = self._check_root(root)
        call = Call("reduce", name, arr.size, op=op, root=root, data=arr,
                    out_shape=arr.shape if self._rank == root else None,
                    out=out, async_op=async_op, timeout=timeout,
                    algorithm=algorithm, device=device)
        return self._run(call)

    def broadcast(self, x: Optional[Buffer] = None, root: int = 0, *,
                  shape: Optional[Union[int, Sequence[int]]] = None,
                  out: Optional[Buffer] = None, dtype: Any = None,
                  async_op: bool = False, timeout: Optional[float] = None,
                  algorithm: Optional[str] = None,
                  device: Optional[str] = None) -> Any:
        """Sends the root's `x` to every rank; every rank (the root too) gets
        a copy shaped as x. count = x.size. Other ranks need not pass data,
        but must say what they receive: an `x` of the root's shape and dtype
        (its contents are not sent), an `out`, or shape= and dtype=.
        """
        root = self._check_root(root)
        if self._rank == root or x is not None:
            if x is None:
                raise InvalidArgument(f"the root (rank {root}) of broadcast "
                                      "must pass x")
            arr, name = _arrays.as_array(x, dtype, "x")
            if isinstance(arr, DeviceArray) and out is None:
                raise InvalidArgument(
                    "broadcast of an array in GPU memory writes into out=, an "
                    "array in that GPU's memory (e.g. out=x): pass one")
            block = arr.shape
        else:
            name, block = self._receive_only(shape, out, dtype, "broadcast")
            arr = None
        count = math.prod(block)
        call = Call("broadcast", name, count, root=root,
                    data=arr if self._rank == root else None,
                    out_shape=block, out=out, async_op=async_op,
                    timeout=timeout, algorithm=algorithm, device=device)
        return self._run(call)

    def all_gather(self, x: Buffer, *, out: Optional[Buffer] = None,
                   dtype: Any = None, async_op: bool = False,
                   timeout: Optional[float] = None,
                   algorithm: Optional[str] = None,
                   device: Optional[str] = None) -> Any:
        """Gathers every rank's `x`; every rank gets shape
        (world_size, *x.shape), row i from rank i. count = x.size.
        """
        arr, name = _arrays.as_array(x, dtype, "x")
        call = Call("all_gather", name, arr.size, data=arr,
                    out_shape=(self._world_size,) + arr.shape, out=out,
                    async_op=async_op, timeout=timeout, algorithm=algorithm,
                    device=device)
        return self._run(call)

    def reduce_scatter(self, x: Buffer, op: str = "sum", *,
                       out: Optional[Buffer] = None, dtype: Any = None,
                       async_op: bool = False,
                       timeout: Optional[float] = None,
                       algorithm: Optional[str] = None,
                       device: Optional[str] = None) -> Any:
        """Reduces `x` elementwise across ranks and gives rank i block i of
        the result. x holds world_size blocks along its first axis: shape
        (world_size, *block) gives block-shaped results, (world_size * n,
        *rest) gives (n, *rest). count = elements per block = x.size /
        world_size.
        """
        arr, name = _arrays.as_array(x, dtype, "x")
        block = _arrays.split_blocks(arr.shape, self._world_size, "x")
        call = Call("reduce_scatter", name, arr.size // self._world_size,
                    op=op, data=arr, out_shape=block, out=out,
                    async_op=async_op, timeout=timeout, algorithm=algorithm,
                    device=device)
        return self._run(call)

    def gather(self, x: Buffer, root: int = 0, *,
               out: Optional[Buffer] = None, dtype: Any = None,
               async_op: bool = False, timeout: Optional[float] = None,
               algorithm: Optional[str] = None,
               device: Optional[str] = None) -> Any:
        """Gathers every rank's `x` at the root, which gets shape
        (world_size, *x.shape), row i from rank i; every other rank gets None.
        count = x.size; every rank passes its input.
        """
        arr, name = _arrays.as_array(x, dtype, "x")
        root = self._check_root(root)
        out_shape = ((self._world_size,) + arr.shape
                     if self._rank == root else None)
        call = Call("gather", name, arr.size, root=root, data=arr,
                    out_shape=out_shape, out=out, async_op=async_op,
                    timeout=timeout, algorithm=algorithm, device=device)
        return self._run(call)

    def scatter(self, x: Optional[Buffer] = None, root: int = 0, *,
                shape: Optional[Union[int, Sequence[int]]] = None,
                out: Optional[Buffer] = None, dtype: Any = None,
                async_op: bool = False, timeout: Optional[float] = None,
                algorithm: Optional[str] = None,
                device: Optional[str] = None) -> Any:
        """Sends block i of the root's `x` to rank i. x holds world_size
        blocks along its first axis, as for reduce_scatter; every rank (the
        root too) gets its block. count = elements per block. Other ranks
        need not pass data, but must say what they receive: an `x` shaped as
        the root's (not sent), an `out` of the block's size, or shape= (the
        block's shape) and dtype=.
        """
        root = self._check_root(root)
        if self._rank == root or x is not None:
            if x is None:
                raise InvalidArgument(f"the root (rank {root}) of scatter "
                                      "must pass x")
            arr, name = _arrays.as_array(x, dtype, "x")
            if isinstance(arr, DeviceArray) and out is None:
                raise InvalidArgument(
                    "scatter of an array in GPU memory writes into out=, an "
                    "array in that GPU's memory (e.g. out=x): pass one")
            block = _arrays.split_blocks(arr.shape, self._world_size, "x")
        else:
            name, block = self._receive_only(shape, out, dtype, "scatter")
            arr = None
        count = math.prod(block)
        call = Call("scatter", name, count, root=root,
                    data=arr if self._rank == root else None,
                    out_shape=block, out=out, async_op=async_op,
                    timeout=timeout, algorithm=algorithm, device=device)
        return self._run(call)

    def all_to_all(self, x: Buffer, *, out: Optional[Buffer] = None,
                   dtype: Any = None, async_op: bool = False,
                   timeout: Optional[float] = None,
                   algorithm: Optional[str] = None,
                   device: Optional[str] = None) -> Any:
        """Sends block i of `x` to rank i; rank j gets x's shape back with
        block i from rank i. x holds world_size blocks along its first axis,
        as for reduce_scatter. count = elements per block = x.size /
        world_size.
        """
        arr, name = _arrays.as_array(x, dtype, "x")
        _arrays.split_blocks(arr.shape, self._world_size, "x")
        call = Call("all_to_all", name, arr.size // self._world_size,
                    data=arr, out_shape=arr.shape, out=out,
                    async_op=async_op, timeout=timeout, algorithm=algorithm,
                    device=device)
        return self._run(call)

    def barrier(self, *, async_op: bool = False,
                timeout: Optional[float] = None,
                algorithm: Optional[str] = None) -> Any:
        """Returns (None) once every rank reached this barrier. count = 0."""
        return self._run(Call("barrier", None, 0, async_op=async_op,
                              timeout=timeout, algorithm=algorithm))

    # --- internals ----------------------------------------------------------

    def _check_root(self, root: Any) -> int:
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)):
            raise InvalidArgument(f"root must be an int, got {root!r}")
        if not 0 <= root < self._world_size:
            raise InvalidArgument(
                f"root {root} is out of range for world size "
                f"{self._world_size}")
        return int(root)

    def _receive_only(self, shape: Any, out: Optional[Buffer], dtype: Any,
                      kind: str) -> Tuple[str, Tuple[int, ...]]:
        """The dtype and block shape a non-root of broadcast or scatter
        receives, from shape= and dtype=, or from out.
        """
        name = None
        if dtype is not None:
            try:
                name = _dtypes.dtype_name(dtype)
            except ValueError as e:
                raise InvalidArgument(str(e)) from None
        if out is not None and is_device_array(out):
            out = DeviceArray(out, "out")  # its shape and dtype
        if shape is not None:
            block = _arrays.shape_of(shape)
        elif out is not None and isinstance(out, (np.ndarray, DeviceArray)):
            block = out.shape
        else:
            raise InvalidArgument(
                f"rank {self._rank} is not the root of {kind}: pass x (as "
                "the root's), out, or shape= and dtype= to say what it "
                "receives")
        if name is None:
            if isinstance(out, (np.ndarray, DeviceArray)):
                name = _dtypes.numpy_dtype_name(out.dtype)
            if name is None:
                raise InvalidArgument(
                    f"rank {self._rank} is not the root of {kind}: pass "
                    "dtype= (or an out array) to say what it receives")
        return name, block

    def _run(self, call: Call) -> Any:
        """Runs `call` the way chorus._routes.choose() says (which checks it
        first): returns its output, or its Work for async_op. A blocking
        call whose group's membership changed raises MembershipChanged once
        the communicator moved to the new epoch.
        """
        if self._change is not None:
            self._catch_up()
        try:
            return choose(call, self._routes).run(call)
        except MembershipChanged as e:
            self._follow(e)
            raise


def _call_socket_of(path: str, embedded: Optional[EmbeddedWorker]
                    ) -> Optional[CallSocket]:
    """The communicator's call socket: the embedded worker's channel, or the
    daemon's socket at `path`; None where there is none or it cannot be
    opened (then calls are gRPC calls).
    """
    if embedded is not None:
        try:
            return CallSocket(connection=embedded.calls(),
                              name=f"the call channel of {embedded!r}")
        except OSError:
            return None  # closed meanwhile: gRPC calls, which fail alike
    if path:
        try:
            return CallSocket(path)
        except OSError:
            return None  # not this host, or not this user: gRPC calls
    return None


# join() makes Communicators; it lives in chorus._join, which imports this
# module, and is still reached here as before (chorus.communicator.join).
from chorus._join import join  # noqa: E402  (after Communicator)
