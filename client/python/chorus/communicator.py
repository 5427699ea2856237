"""Joining a Chorus group through a worker daemon and running collectives.

A Communicator is one rank of one group, reached through the local API of a
worker daemon (chorus.v1.WorkerLocal). It numbers its collectives from 1 in
the order they are issued and carries the group's epoch, so the n-th call of
every rank is matched with the n-th call of the others.

Thread safety: every method may be called from any thread. Calls issued
concurrently from several threads are numbered in the order they take the
communicator's lock, so ranks that do that must agree on the order some
other way.
"""

# Annotations stay unevaluated: the nested functions a call defines cost no
# typing work each time.
from __future__ import annotations

import math
import os
import threading
from concurrent import futures
from typing import Any, Callable, Dict, Iterator, List, Optional
from typing import Sequence, Tuple, Union

import grpc
import numpy as np

from chorus import _connect, _dtypes
from chorus import embedded as _embedded_worker
from chorus._call_socket import CallSocket, _outcome_of, varint as _varint
from chorus._shared import SHARED_THRESHOLD_BYTES, Region, SharedMemory
from chorus.embedded import EmbeddedWorker
from chorus.errors import (Cancelled, DeadlineExceeded, Error, Internal,
                           InvalidArgument, Unavailable, from_rpc_error)
from chorus.v1 import types_pb2, worker_pb2, worker_pb2_grpc

__all__ = ["join", "Communicator", "Work", "DEFAULT_TIMEOUT",
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

# The largest piece of a tensor in one CollectiveChunked message.
_PIECE_BYTES = 4 * 1024 * 1024

# Bytes a reply adds around its data: the data field's tag and length, the
# sequence and the plan.
_REPLY_OVERHEAD = 64
# Codes of a daemon's (or gRPC's own size) refusal: without `number_used`
# the call took no sequence number.
_REFUSALS = (grpc.StatusCode.INVALID_ARGUMENT,
             grpc.StatusCode.FAILED_PRECONDITION,
             grpc.StatusCode.RESOURCE_EXHAUSTED)

# How long join() waits for the channel to connect before it asks anyway.
_CONNECT_WAIT = 5.0

Buffer = Any
"""A numpy array, any object with the buffer protocol (C-contiguous), or an
object with __dlpack__ (e.g. a torch CPU tensor).
"""

_KINDS = {
    "all_reduce": types_pb2.COLLECTIVE_KIND_ALL_REDUCE,
    "reduce": types_pb2.COLLECTIVE_KIND_REDUCE,
    "broadcast": types_pb2.COLLECTIVE_KIND_BROADCAST,
    "all_gather": types_pb2.COLLECTIVE_KIND_ALL_GATHER,
    "reduce_scatter": types_pb2.COLLECTIVE_KIND_REDUCE_SCATTER,
    "gather": types_pb2.COLLECTIVE_KIND_GATHER,
    "scatter": types_pb2.COLLECTIVE_KIND_SCATTER,
    "all_to_all": types_pb2.COLLECTIVE_KIND_ALL_TO_ALL,
    "barrier": types_pb2.COLLECTIVE_KIND_BARRIER,
}

_OPS = {
    "sum": types_pb2.REDUCE_OP_SUM,
    "prod": types_pb2.REDUCE_OP_PROD,
    "min": types_pb2.REDUCE_OP_MIN,
    "max": types_pb2.REDUCE_OP_MAX,
    "avg": types_pb2.REDUCE_OP_AVG,
}

_ALGORITHMS = {
    "auto": types_pb2.ALGORITHM_UNSPECIFIED,
    "inline": types_pb2.ALGORITHM_INLINE,
    "recursive_doubling": types_pb2.ALGORITHM_RECURSIVE_DOUBLING,
    "ring": types_pb2.ALGORITHM_RING,
    "same_host": types_pb2.ALGORITHM_SAME_HOST,
}
_ALGORITHM_NAMES = {v: k for k, v in _ALGORITHMS.items()}
_ALGORITHM_NAMES[types_pb2.ALGORITHM_TREE] = "tree"
# Forced algorithms that only all_reduce (and barrier) can run.
_ALL_REDUCE_ONLY = ("recursive_doubling", "same_host")

_DEVICE_KINDS = {
    "cpu": types_pb2.DEVICE_KIND_CPU,
    "cuda": types_pb2.DEVICE_KIND_CUDA,
    "rocm": types_pb2.DEVICE_KIND_ROCM,
    "vulkan": types_pb2.DEVICE_KIND_VULKAN,
    "metal": types_pb2.DEVICE_KIND_METAL,
    "wgpu": types_pb2.DEVICE_KIND_WGPU,
    "tpu": types_pb2.DEVICE_KIND_TPU,
}

# The largest element count a call may carry (server/common/collective.h).
_MAX_COUNT = 1 << 40

_COLLECTIVE_METHOD = "/chorus.v1.WorkerLocal/Collective"
_CHUNKED_METHOD = "/chorus.v1.WorkerLocal/CollectiveChunked"
_HOLD_METHOD = "/chorus.v1.WorkerLocal/HoldMembership"
# How long close() waits for the daemon to take the hold's release.
_RELEASE_WAIT = 2.0


def _varint_size(value: int) -> int:
    size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


# LocalCollectiveRequest.data is field 9, length-delimited: tag (9 << 3) | 2.
_DATA_TAG = bytes([(9 << 3) | 2])
# LocalCollectiveRequest.sequence (field 12, a varint).
_SEQUENCE_TAG = bytes([12 << 3])
# LocalCollectiveRequest.shared_input and shared_output (fields 14 and 15,
# SharedBuffer messages).
_SHARED_INPUT_TAG = bytes([(14 << 3) | 2])
_SHARED_OUTPUT_TAG = bytes([(15 << 3) | 2])


def _shared_buffer(tag: bytes, region: int, offset: int, size: int) -> bytes:
    """A SharedBuffer field of a LocalCollectiveRequest, serialized: region
    (field 1), offset (2) and bytes (3), each a varint.
    """
    body = b"".join((b"\x08", _varint(region), b"\x10", _varint(offset),
                     b"\x18", _varint(size)))
    return b"".join((tag, _varint(len(body)), body))


# How many serialized request prefixes a communicator keeps.
_MAX_PREFIXES = 64
# LocalChunkedRequest.data is field 2, length-delimited.
_PIECE_TAG = bytes([(2 << 3) | 2])


def _chunked_requests(header: bytes, data: Optional[np.ndarray]
                      ) -> Iterator[bytes]:
    """Yields a CollectiveChunked stream's requests as sent: the serialized
    header, then `data` in pieces of at most _PIECE_BYTES.
    """
    yield header
    if data is None or data.nbytes == 0:
        return
    view = data.reshape(-1).view(np.uint8).data
    for at in range(0, len(view), _PIECE_BYTES):
        piece = view[at:at + _PIECE_BYTES]
        yield b"".join([_PIECE_TAG, _varint(len(piece)), piece])


def _parse_device(device: Union[str, types_pb2.Device]) -> types_pb2.Device:
    """Returns the chorus.v1.Device for "cpu", "cuda:0", "Vulkan(0)", ..."""
    if isinstance(device, types_pb2.Device):
        return device
    if not isinstance(device, str) or not device.strip():
        raise InvalidArgument(
            f"device must be a string such as 'cpu' or 'cuda:0', "
            f"got {device!r}")
    text = device.strip()
    kind_text, index_text = text, ""
    if text.endswith(")") and "(" in text:  # canonical form, Cuda(0)
        kind_text, index_text = text[:-1].split("(", 1)
    elif ":" in text:
        kind_text, index_text = text.split(":", 1)
    index = 0
    if index_text:
        if not index_text.isdigit():
            raise InvalidArgument(
                f"device {device!r} needs a non-negative index, e.g. cuda:0")
        index = int(index_text)
    kind = _DEVICE_KINDS.get(kind_text.lower())
    if kind is None:
        if not kind_text.replace("_", "").isalnum():
            raise InvalidArgument(f"device {device!r} has an invalid kind")
        return types_pb2.Device(kind=types_pb2.DEVICE_KIND_OTHER,
                                other_kind=kind_text, index=index)
    if kind == types_pb2.DEVICE_KIND_CPU and index != 0:
        raise InvalidArgument(f"the CPU device has index 0, got {device!r}")
    return types_pb2.Device(kind=kind, index=index)


def _canonical_name(device: types_pb2.Device) -> str:
    """Returns the device's canonical name as servers print it (Cuda(0))."""
    if device.kind == types_pb2.DEVICE_KIND_CPU:
        return "Cpu"
    if device.kind == types_pb2.DEVICE_KIND_OTHER:
        return f"{device.other_kind}({device.index})"
    for name, kind in _DEVICE_KINDS.items():
        if kind == device.kind:
            return f"{name.capitalize()}({device.index})"
    return f"UnknownKind{device.kind}({device.index})"


def _env_int(names: Sequence[str], given: Optional[int],
             what: str) -> int:
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, (int, np.integer)):
            raise InvalidArgument(f"{what} must be an int, got {given!r}")
        return int(given)
    for name in names:
        text = os.environ.get(name)
        if text is None or text == "":
            continue
        try:
            return int(text)
        except ValueError:
            raise InvalidArgument(
                f"{name}={text!r} is not an integer ({what})") from None
    raise InvalidArgument(
        f"no {what}: pass {what}= or set {' or '.join(names)}")


def _check_timeout(timeout: Optional[float], default: float) -> float:
    if timeout is None:
        return default
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise InvalidArgument(f"timeout must be seconds, got {timeout!r}")
    if not timeout > 0 or math.isinf(timeout):
        raise InvalidArgument(
            f"timeout must be a finite number of seconds > 0, got {timeout}")
    return float(timeout)


def join(group: Optional[str] = None, world_size: Optional[int] = None,
         rank: Optional[int] = None, *,
         worker: Union[str, EmbeddedWorker, None] = None,
         coordinator: Optional[str] = None,
         device: str = "cpu", timeout: float = DEFAULT_TIMEOUT,
         max_message_bytes: int = MAX_MESSAGE_BYTES,
         tls_dir: Optional[_connect.PathLike] = None,
         shared_memory: bool = True,
         call_socket: bool = True) -> "Communicator":
    """Joins `group` as `rank` of `world_size` ranks through the worker daemon
    at `worker` and returns the Communicator once every rank joined.

    Args:
        group: the group's name; default $CHORUS_GROUP.
        world_size: number of ranks; default $CHORUS_WORLD_SIZE, then
            $WORLD_SIZE (as torchrun sets it).
        rank: this rank, 0 .. world_size - 1; default $CHORUS_RANK, then
            $RANK.
        worker: the daemon's local API: "unix:/path" (its --local_socket)
            or "host:port" (its --listen address, which answers loopback
            callers, or with TLS a client or admin certificate); default
            $CHORUS_WORKER, else "unix:" + default_socket_path(), the
            socket a worker started without --local_socket serves
            ($XDG_RUNTIME_DIR/chorus/worker.sock, or
            /tmp/chorus-<uid>/worker.sock without XDG_RUNTIME_DIR).
            An EmbeddedWorker (chorus.embedded) makes this rank go through
            the worker runtime in this process instead of a daemon.
        coordinator: instead of a worker, the coordinator's "host:port":
            the rank goes through this process's own worker runtime
            (chorus.embedded.shared_worker(coordinator), started on first
            use), with no daemon in between: a small collective costs less
            CPU and time (bench/README.md). Needs the embedded worker (see
            chorus.embedded). That shared worker is plaintext, and tls_dir=
            is refused with it: for TLS, pass
            worker=chorus.EmbeddedWorker(coordinator, tls_dir=...).
        device: the device this rank reduces on: "cpu", "cuda:0", ...
        timeout: seconds the join may wait for the other ranks; also the
            default deadline of every collective of the communicator.
        max_message_bytes: the largest gRPC message the daemon takes and
            sends (MAX_MESSAGE_BYTES unless the daemon was built otherwise);
            calls whose messages would be larger stream their tensors.
        tls_dir: for a host:port worker started with --tls_dir, a directory
            with ca.pem (the cluster's CA), cert.pem and key.pem (this
            client's certificate, chorus://client/NAME or
            chorus://admin/NAME, and key), as scripts/dev_certs.sh makes in
            DIR/client-NAME: the channel then uses mutual TLS; default
            $CHORUS_TLS_DIR; "" means plaintext. A unix: worker is always
            reached in plaintext and tls_dir is not read.
        shared_memory: let collectives of SHARED_THRESHOLD_BYTES or more
            read and write their tensors in memory shared with the daemon
            (WorkerLocal.OpenSharedRegion) rather than in messages. It works
            when the daemon runs on this host as this user (or this process
            as root); elsewhere calls go in messages, as with False.
        call_socket: send collectives on the daemon's call socket (plain
            frames on a Unix socket, which JoinGroup names) rather than as
            gRPC calls: the same calls and errors for much less time per
            small call. It works where the daemon offers one, `worker` is
            on this host (a unix: socket or a loopback address) and this
            process can open it (this user); otherwise, or with False,
            collectives are gRPC calls. Tensors too large for one
            message go through shared memory or streams either way.

    Raises:
        FailedPrecondition: coordinator= where this installation has no
            embedded worker.
        InvalidArgument: a missing or malformed argument (nothing is sent),
            a TLS file that is missing, unreadable or not PEM, or an
            argument the coordinator refuses (rank taken, world size
            differs).
        PermissionDenied: the daemon refuses this caller: over TCP without
            TLS it answers only loopback, with TLS only client and admin
            certificates.
        DeadlineExceeded: not every rank joined in time; `missing_ranks`
            names the others.
        Unimplemented: the device cannot take part in distributed
            operations.
        Unavailable: the daemon cannot be reached (no socket at a unix:
            path, nothing listening, a TLS handshake that failed) or is not
            registered yet.
    """
    if group is None:
        group = os.environ.get("CHORUS_GROUP") or None
    if not isinstance(group, str) or not group:
        raise InvalidArgument("no group: pass group= or set CHORUS_GROUP")
    world_size = _env_int(("CHORUS_WORLD_SIZE", "WORLD_SIZE"), world_size,
                          "world_size")
    rank = _env_int(("CHORUS_RANK", "RANK"), rank, "rank")
    if world_size < 1:
        raise InvalidArgument(
            f"world_size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise InvalidArgument(
            f"rank {rank} is out of range for world size {world_size}")
    embedded: Optional[EmbeddedWorker] = None
    if coordinator is not None:
        if worker is not None:
            raise InvalidArgument("pass worker= or coordinator=, not both")
        if not isinstance(coordinator, str) or not coordinator:
            raise InvalidArgument(
                f"coordinator must be 'host:port', got {coordinator!r}")
    elif isinstance(worker, EmbeddedWorker):
        if worker.closed:
            raise InvalidArgument(f"{worker!r} is closed")
        embedded = worker
    if (embedded is not None or coordinator is not None) and tls_dir:
        raise InvalidArgument(
            "tls_dir= is for a worker daemon's TCP port (a client's "
            "certificate); an embedded worker takes a worker's: pass "
            "worker=chorus.EmbeddedWorker(coordinator, tls_dir=...)")
    if embedded is not None or coordinator is not None:
        worker, default_worker = "", False  # set once the checks passed
        tls_path, tls_source = None, ""
    else:
        worker, default_worker = _connect.resolve_worker(worker)
        tls_path, tls_source = _connect.resolve_tls_dir(tls_dir)
    if _connect.is_unix_target(worker):
        tls_path = None
    timeout = _check_timeout(timeout, DEFAULT_TIMEOUT)
    if (isinstance(max_message_bytes, bool) or
            not isinstance(max_message_bytes, int) or max_message_bytes < 1):
        raise InvalidArgument(
            f"max_message_bytes must be a positive int, got "
            f"{max_message_bytes!r}")
    device_proto = _parse_device(device)
    credentials = None
    if tls_path is not None:  # the files are checked before anything is sent
        credentials = _connect.tls_credentials(tls_path, tls_source)
    if coordinator is not None:
        embedded = _embedded_worker.shared_worker(coordinator)
    if embedded is not None:
        worker = embedded.target
    else:
        _connect.check_socket(worker, default_worker)

    channel = _connect.make_channel(worker, credentials, options=[
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ])
    try:
        # A fresh channel's first attempt can fail on a busy host; give it a
        # moment, then ask anyway so that an absent daemon fails the join.
        connected = True
        try:
            grpc.channel_ready_future(channel).result(
                timeout=min(timeout, _CONNECT_WAIT))
        except grpc.FutureTimeoutError:
            connected = False
        if connected and credentials is not None:
            # The channel took the certificate's CA and host; its role is
            # checked here (no join goes to a server that is no worker).
            _connect.check_worker_certificate(
                worker, tls_path, tls_source, min(timeout, _CONNECT_WAIT))
        stub = worker_pb2_grpc.WorkerLocalStub(channel)
        request = worker_pb2.LocalJoinRequest(
            group=group, world_size=world_size, rank=rank,
            device=device_proto)
        try:
            response = stub.JoinGroup(request, timeout=timeout)
        except grpc.RpcError as e:
            error = from_rpc_error(e)
            if isinstance(error, Unavailable):
                hint = ""
                if not connected:
                    hint = _connection_hint(worker, tls_source)
                raise Unavailable(
                    f"worker daemon at {worker}: {error.message}{hint}",
                    error.code, error.details) from None
            raise error from None
    except BaseException:
        channel.close()
        raise
    return Communicator(
        _channel=channel, _worker=worker, _group=group,
        _world_size=world_size, _rank=rank, _epoch=response.epoch,
        _device=_canonical_name(device_proto),
        _member_devices=list(response.member_devices), _timeout=timeout,
        _max_message_bytes=max_message_bytes,
        _shared_memory=bool(shared_memory),
        # A worker on another host names a path of its host: one here may
        # be another worker's.
        _call_socket=(response.call_socket
                      if call_socket and _connect.is_this_host(worker)
                      else ""),
        _embedded=embedded if call_socket else None)


def _connection_hint(worker: str, tls_source: str) -> str:
    """What to check when a channel to `worker` never connected."""
    if _connect.is_unix_target(worker):
        return (" (is the worker running, and serving this socket for this "
                "user? it is mode 0600)")
    if tls_source:
        return (f" (with TLS from {tls_source}: the worker must run with "
                "--tls_dir, its certificate must come from the same CA and "
                "name the host dialed, and it must accept this client's "
                "certificate)")
    return (" (a worker started with --tls_dir needs tls_dir= or "
            "CHORUS_TLS_DIR)")


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


class _Outcome:
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


class _Blocking:
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


class _Replied:
    """A call that ended already, as a future of it: result() returns its
    Response or raises its CallSocketError.
    """

    __slots__ = ("_reply",)

    def __init__(self, reply: Tuple[Any, ...]) -> None:
        self._reply = reply

    def result(self) -> Any:
        """The call's Response; raises its CallSocketError."""
        response, error = _outcome_of(self._reply)
        if error is not None:
            raise error
        return response


class _Unsent:
    """A blocking call of an embedded worker that was not sent, the channel
    having broken, as a future of it: result() raises UNAVAILABLE.
    """

    __slots__ = ("_calls",)

    def __init__(self, calls: CallSocket) -> None:
        self._calls = calls

    def result(self) -> Any:
        """Raises the channel's CallSocketError (UNAVAILABLE)."""
        raise self._calls.unavailable()


# What self._here (chorus._embedded.AllReduceHere) returns for a call it
# leaves to _run().
_NOT_HERE = object()

# The input or output of a call that has none, for _run_in_place(): no
# byte of it is read or written.
_NOTHING = np.empty(0, np.uint8)


class _Call:
    """What one collective sends and expects back."""

    __slots__ = ("kind", "dtype", "count", "op", "root", "data", "out_shape",
                 "out", "out_dtype")

    def __init__(self, kind: str, dtype: Optional[str], count: int,
                 op: str = "", root: int = 0,
                 data: Optional[np.ndarray] = None,
                 out_shape: Optional[Tuple[int, ...]] = None,
                 out: Optional[np.ndarray] = None) -> None:
        self.kind = kind
        self.dtype = dtype
        self.count = count
        self.op = op
        self.root = root
        self.data = data
        self.out_shape = out_shape
        self.out = out
        self.out_dtype = None if dtype is None else _dtypes.numpy_dtype(dtype)

    def output_bytes(self) -> int:
        if self.out_shape is None or self.out_dtype is None:
            return 0
        return math.prod(self.out_shape) * \
            self.out_dtype.itemsize


def _as_array(x: Buffer, dtype: Optional[str], what: str
              ) -> Tuple[np.ndarray, str]:
    """Returns (a C-contiguous numpy view of x, its Chorus dtype name).

    Raises InvalidArgument for anything that cannot be sent without a copy
    or whose dtype Chorus does not have.
    """
    want = None
    if dtype is not None:
        try:
            want = _dtypes.dtype_name(dtype)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
    raw = False  # bytes of a buffer whose format says nothing of its type
    if isinstance(x, np.ndarray):
        arr = x
    elif hasattr(x, "__dlpack__"):
        arr = _from_dlpack(x, what)
        if str(getattr(x, "dtype", "")).endswith("bfloat16") and \
                arr.dtype == np.int16:
            want = want or "bf16"
    else:
        try:
            view = memoryview(x)
        except TypeError:
            raise InvalidArgument(
                f"{what} must be a numpy array, a C-contiguous buffer or a "
                f"DLPack tensor, got {type(x).__name__}; e.g. pass "
                f"numpy.asarray({what}, dtype='float32')") from None
        if not view.c_contiguous:
            raise InvalidArgument(
                f"{what} is not C-contiguous; pass a contiguous copy "
                "(numpy.ascontiguousarray)")
        raw = view.format in ("B", "b", "c")
        arr = np.asarray(view)
    if not arr.flags.c_contiguous:
        raise InvalidArgument(
            f"{what} is not C-contiguous (strides {arr.strides} for shape "
            f"{arr.shape}); pass numpy.ascontiguousarray({what})")
    have = _dtypes.numpy_dtype_name(arr.dtype)
    if want is None:
        if have is None:
            raise InvalidArgument(
                f"{what} has dtype {arr.dtype}, which Chorus does not have; "
                f"it supports {', '.join(_dtypes.DTYPES)} (bf16 as uint16 "
                "with dtype='bf16')")
        return arr, have
    if want == have:
        return arr, want
    if want == "bf16" and arr.dtype.kind in "ui" and arr.dtype.itemsize == 2:
        return arr.view(_dtypes.numpy_dtype("bf16")), want
    if raw:
        size = _dtypes.numpy_dtype(want).itemsize
        if arr.nbytes % size:
            raise InvalidArgument(
                f"{what} has {arr.nbytes} bytes, not a whole number of "
                f"{want} elements ({size} bytes each)")
        return arr.reshape(-1).view(_dtypes.numpy_dtype(want)), want
    raise InvalidArgument(
        f"{what} holds {arr.dtype} but dtype={dtype!r} was asked for; "
        f"convert it first (e.g. {what}.astype(...)) or leave dtype out")


def _from_dlpack(x: Any, what: str) -> np.ndarray:
    try:
        return np.from_dlpack(x)
    except (TypeError, BufferError, RuntimeError, ValueError) as first:
        # numpy has no bfloat16: take a torch bfloat16 tensor's bits.
        if str(getattr(x, "dtype", "")).endswith("bfloat16"):
            import sys
            torch = sys.modules.get("torch")
            if torch is not None and hasattr(x, "view"):
                return np.from_dlpack(x.view(torch.int16))
        raise InvalidArgument(
            f"{what} cannot be read through DLPack ({first}); Chorus takes "
            "host (CPU) memory of its ten dtypes") from None


def _as_output(out: Buffer, dtype: str, size: int) -> np.ndarray:
    """Returns a writable numpy view of `out` holding `size` elements of
    `dtype`, or raises InvalidArgument.
    """
    element = _dtypes.numpy_dtype(dtype)
    if isinstance(out, np.ndarray):
        arr = out
    else:
        try:
            view = memoryview(out)
        except TypeError:
            raise InvalidArgument(
                f"out must be a writable numpy array or buffer, got "
                f"{type(out).__name__} (for a torch tensor pass "
                "out=tensor.numpy())") from None
        if view.readonly:
            raise InvalidArgument("out is read-only")
        if not view.c_contiguous:
            raise InvalidArgument("out is not C-contiguous")
        arr = np.asarray(view)
        if view.format in ("B", "b", "c"):
            if arr.nbytes != size * element.itemsize:
                raise InvalidArgument(
                    f"out has {arr.nbytes} bytes; the result takes "
                    f"{size * element.itemsize} ({size} x {dtype})")
            return arr.reshape(-1).view(element)
    if not arr.flags.writeable:
        raise InvalidArgument("out is read-only")
    if not arr.flags.c_contiguous:
        raise InvalidArgument("out is not C-contiguous")
    fits = (_dtypes.numpy_dtype_name(arr.dtype) == dtype or
            (dtype == "bf16" and arr.dtype.kind in "ui" and
             arr.dtype.itemsize == 2))
    if not fits:
        raise InvalidArgument(
            f"out holds {arr.dtype}; the result is {dtype}"
            f"{' (as uint16)' if dtype == 'bf16' else ''}")
    if arr.size != size:
        raise InvalidArgument(
            f"out has {arr.size} elements; the result has {size}")
    return arr


def _split_blocks(shape: Tuple[int, ...], world: int, what: str
                  ) -> Tuple[int, ...]:
    """Returns the shape of one of `world` blocks of an array of `shape`: the
    first axis holds the blocks, (world, *block) or (world * n, *rest).
    """
    if len(shape) == 0 or shape[0] % world:
        raise InvalidArgument(
            f"{what} of shape {shape} does not split into {world} equal "
            f"blocks along its first axis; pass shape (world_size, *block) "
            f"or (world_size * n, ...)")
    if shape[0] == world and len(shape) >= 2:
        return tuple(shape[1:])
    return (shape[0] // world,) + tuple(shape[1:])


def _shape_of(shape: Union[int, Sequence[int]]) -> Tuple[int, ...]:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (int(shape),)
    try:
        out = tuple(int(s) for s in shape)
    except TypeError:
        raise InvalidArgument(
            f"shape must be an int or a tuple of ints, got {shape!r}"
        ) from None
    if any(s < 0 for s in out):
        raise InvalidArgument(f"shape {out} has a negative size")
    return out


class Communicator:
    """One rank of a Chorus group, joined through a worker daemon. Made by
    chorus.join(); use it as a context manager or call close().

    Each collective takes this rank's input and returns its output as a new
    numpy array (or writes it into `out` and returns `out`). Inputs are numpy
    arrays, C-contiguous buffers or DLPack tensors of the ten Chorus dtypes;
    bf16 travels as its 16-bit patterns: pass a uint16 array with
    dtype="bf16" and get uint16 back (chorus.bf16_to_f32 widens it).

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
                 _embedded: Optional[EmbeddedWorker] = None) -> None:
        """Made by chorus.join(); not meant to be called directly."""
        self._channel = _channel
        self._worker = _worker
        self._group = _group
        self._world_size = _world_size
        self._rank = _rank
        self._epoch = _epoch
        self._device = _device
        self._member_devices = _member_devices
        self._timeout = _timeout
        self._max_message_bytes = _max_message_bytes
        # A call whose request or reply is larger streams.
        self._stream_limit = min(STREAM_THRESHOLD_BYTES, _max_message_bytes)
        # The request is serialized here (see _issue), so the stub takes
        # bytes as they are.
        self._collective = _channel.unary_unary(
            _COLLECTIVE_METHOD,
            request_serializer=None,
            response_deserializer=(
                worker_pb2.LocalCollectiveResponse.FromString))
        self._chunked = _channel.stream_stream(
            _CHUNKED_METHOD,
            request_serializer=None,
            response_deserializer=worker_pb2.LocalChunkedResponse.FromString)
        self._shared = SharedMemory(_channel, _group, _epoch, _rank,
                                    _shared_memory)
        self._calls: Optional[CallSocket] = None
        if _embedded is not None:
            try:
                self._calls = CallSocket(
                    connection=_embedded.calls(),
                    name=f"the call channel of {_embedded!r}")
            except OSError:
                pass  # closed meanwhile: gRPC calls, which fail alike
        elif _call_socket:
            try:
                self._calls = CallSocket(_call_socket)
            except OSError:
                pass  # not this host, or not this user: gRPC calls
        # Guards the numbering and the count of calls in flight; close()
        # waits on _lock for that count to reach 0.
        self._mutex = threading.Lock()
        self._lock = threading.Condition(self._mutex)
        self._next_sequence = 1
        self._in_flight = 0
        # Serialized requests without their number, by kind of call.
        self._prefixes: Dict[Tuple[Any, ...], bytes] = {}
        self._closed = False
        # A blocking all_reduce of numpy arrays through an embedded worker,
        # made in one call into the extension (it numbers calls under
        # _mutex as _run_in_place() does); None elsewhere.
        self._here: Optional[Callable[..., Any]] = None
        if _embedded is not None and self._calls is not None and \
                self._calls.runs_here:
            self._here = _embedded.all_reduce_here(
                self._calls.connection, self, self._calls,
                self._prepare_here, _NOT_HERE, self._timeout)
        self._release = threading.Event()
        self._hold = self._start_hold()

    # --- properties ---------------------------------------------------------

    @property
    def group(self) -> str:
        """The group's name."""
        return self._group

    @property
    def world_size(self) -> int:
        """The number of ranks in the group."""
        return self._world_size

    @property
    def rank(self) -> int:
        """This rank, 0 .. world_size - 1."""
        return self._rank

    @property
    def epoch(self) -> int:
        """The group's epoch this communicator joined; calls carry it."""
        return self._epoch

    @property
    def device(self) -> str:
        """This rank's device, by canonical name ("Cpu", "Cuda(0)")."""
        return self._device

    @property
    def member_devices(self) -> List[str]:
        """Every rank's device by canonical name, in rank order."""
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
        arr_shape = _shape_of(shape)
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
        with self._lock:
            return self._next_sequence

    def __repr__(self) -> str:
        return (f"Communicator(group={self._group!r}, rank={self._rank}, "
                f"world_size={self._world_size}, worker={self._worker!r}, "
                f"epoch={self._epoch})")

    # --- lifecycle ----------------------------------------------------------

    def close(self, timeout: Optional[float] = None) -> None:
        """Waits for the calls in flight (at most `timeout` seconds; their
        own deadlines bound the wait anyway), releases the rank's hold (so
        the daemon does not report it gone), then closes the connection to
        the daemon. Later calls raise InvalidArgument. Idempotent.
        """
        with self._lock:
            self._closed = True
            self._lock.wait_for(lambda: self._in_flight == 0, timeout)
        self._here = None  # it holds this communicator: no cycle left
        self._shared.close()
        if self._calls is not None:
            self._calls.close()
        self._release.set()
        try:
            self._hold.result(timeout=_RELEASE_WAIT)
        except (grpc.RpcError, grpc.FutureTimeoutError):
            pass  # an older daemon without holds, or one already gone
        self._channel.close()

    def _start_hold(self) -> "grpc.Future":
        """Opens this rank's hold on the daemon (WorkerLocal.HoldMembership):
        while this process lives the stream stays open; if the process dies
        it ends without a release, the daemon reports the rank gone, and the
        other ranks' calls end at once with ABORTED naming it. close()
        releases it. The stream has no deadline: nothing waits for it.
        """
        first = worker_pb2.MembershipHold(
            group=self._group, epoch=self._epoch, rank=self._rank)
        release = self._release

        def holds() -> Iterator[worker_pb2.MembershipHold]:
            yield first
            release.wait()  # on gRPC's (daemon) request thread
            yield worker_pb2.MembershipHold(release=True)

        hold = self._channel.stream_unary(
            _HOLD_METHOD,
            request_serializer=worker_pb2.MembershipHold.SerializeToString,
            response_deserializer=worker_pb2.MembershipHoldReply.FromString)
        return hold.future(holds())

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
        here = self._here
        if (here is not None and not async_op and dtype is None and
                algorithm is None and device is None):
            done = here(x, op, out, timeout)
            if done is not _NOT_HERE:
                if type(done) is tuple:  # failed: (call, number, reply)
                    call, sequence, reply = done
                    work = _Outcome(sequence)
                    self._settle(call, work, _Replied(reply), None, out)
                    return work.result()
                return done
        arr, name = _as_array(x, dtype, "x")
        call = _Call("all_reduce", name, arr.size, op=op, data=arr,
                     out_shape=arr.shape)
        return self._run(call, out, async_op, timeout, algorithm, device)

    def _prepare_here(self, x: np.ndarray, op: Any) -> Tuple[bytes, _Call]:
        """(the request's bytes but its number and data, the call) of a
        blocking all_reduce of arrays shaped as x through the embedded
        worker, for self._here (which keeps them). Raises InvalidArgument as
        _run() would.
        """
        arr, name = _as_array(x, None, "x")
        call = _Call("all_reduce", name, arr.size, op=op,
                     out_shape=arr.shape)
        return self._request(call, None, None).SerializeToString(), call

    def _left_flight(self) -> None:
        """Counts a call as no longer in flight (close() waits for none to
        be).
        """
        with self._mutex:
            self._in_flight -= 1
            if self._closed:
                self._lock.notify_all()  # close() waits for it

    def reduce(self, x: Buffer, root: int = 0, op: str = "sum", *,
               out: Optional[Buffer] = None, dtype: Any = None,
               async_op: bool = False, timeout: Optional[float] = None,
               algorithm: Optional[str] = None,
               device: Optional[str] = None) -> Any:
        """Reduces `x` elementwise across all ranks with `op`; the root gets
        the result shaped as x, every other rank gets None (and `out` is left
        alone). count = x.size; every rank passes its input.
        """
        arr, name = _as_array(x, dtype, "x")
        root = self._check_root(root)
        call = _Call("reduce", name, arr.size, op=op, root=root, data=arr,
                     out_shape=arr.shape if self._rank == root else None)
        return self._run(call, out, async_op, timeout, algorithm, device)

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
            arr, name = _as_array(x, dtype, "x")
            block = arr.shape
        else:
            name, block = self._receive_only(shape, out, dtype, "broadcast")
            arr = None
        count = math.prod(block)
        call = _Call("broadcast", name, count, root=root,
                     data=arr if self._rank == root else None,
                     out_shape=block)
        return self._run(call, out, async_op, timeout, algorithm, device)

    def all_gather(self, x: Buffer, *, out: Optional[Buffer] = None,
                   dtype: Any = None, async_op: bool = False,
                   timeout: Optional[float] = None,
                   algorithm: Optional[str] = None,
                   device: Optional[str] = None) -> Any:
        """Gathers every rank's `x`; every rank gets shape
        (world_size, *x.shape), row i from rank i. count = x.size.
        """
        arr, name = _as_array(x, dtype, "x")
        call = _Call("all_gather", name, arr.size, data=arr,
                     out_shape=(self._world_size,) + arr.shape)
        return self._run(call, out, async_op, timeout, algorithm, device)

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
        arr, name = _as_array(x, dtype, "x")
        block = _split_blocks(arr.shape, self._world_size, "x")
        call = _Call("reduce_scatter", name, arr.size // self._world_size,
                     op=op, data=arr, out_shape=block)
        return self._run(call, out, async_op, timeout, algorithm, device)

    def gather(self, x: Buffer, root: int = 0, *,
               out: Optional[Buffer] = None, dtype: Any = None,
               async_op: bool = False, timeout: Optional[float] = None,
               algorithm: Optional[str] = None,
               device: Optional[str] = None) -> Any:
        """Gathers every rank's `x` at the root, which gets shape
        (world_size, *x.shape), row i from rank i; every other rank gets None.
        count = x.size; every rank passes its input.
        """
        arr, name = _as_array(x, dtype, "x")
        root = self._check_root(root)
        out_shape = ((self._world_size,) + arr.shape
                     if self._rank == root else None)
        call = _Call("gather", name, arr.size, root=root, data=arr,
                     out_shape=out_shape)
        return self._run(call, out, async_op, timeout, algorithm, device)

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
            arr, name = _as_array(x, dtype, "x")
            block = _split_blocks(arr.shape, self._world_size, "x")
        else:
            name, block = self._receive_only(shape, out, dtype, "scatter")
            arr = None
        count = math.prod(block)
        call = _Call("scatter", name, count, root=root,
                     data=arr if self._rank == root else None,
                     out_shape=block)
        return self._run(call, out, async_op, timeout, algorithm, device)

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
        arr, name = _as_array(x, dtype, "x")
        _split_blocks(arr.shape, self._world_size, "x")
        call = _Call("all_to_all", name, arr.size // self._world_size,
                     data=arr, out_shape=arr.shape)
        return self._run(call, out, async_op, timeout, algorithm, device)

    def barrier(self, *, async_op: bool = False,
                timeout: Optional[float] = None,
                algorithm: Optional[str] = None) -> Any:
        """Returns (None) once every rank reached this barrier. count = 0."""
        call = _Call("barrier", None, 0)
        return self._run(call, None, async_op, timeout, algorithm, None)

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
        if shape is not None:
            block = _shape_of(shape)
        elif out is not None and isinstance(out, np.ndarray):
            block = out.shape
        else:
            raise InvalidArgument(
                f"rank {self._rank} is not the root of {kind}: pass x (as "
                "the root's), out, or shape= and dtype= to say what it "
                "receives")
        if name is None:
            if isinstance(out, np.ndarray):
                name = _dtypes.numpy_dtype_name(out.dtype)
            if name is None:
                raise InvalidArgument(
                    f"rank {self._rank} is not the root of {kind}: pass "
                    "dtype= (or an out array) to say what it receives")
        return name, block

    def _request(self, call: _Call, algorithm: Optional[str],
                 device: Optional[str]) -> Any:
        """Returns the LocalCollectiveRequest of `call` without its number
        and data; raises InvalidArgument for what it cannot carry.
        """
        request = worker_pb2.LocalCollectiveRequest(
            group=self._group, rank=self._rank,
            spec=types_pb2.CollectiveSpec(kind=_KINDS[call.kind]),
            epoch=self._epoch)
        spec = request.spec
        if call.dtype is not None:
            spec.dtype = _dtypes.proto_dtype(call.dtype)
        spec.count = call.count
        if call.count > _MAX_COUNT:
            raise InvalidArgument(
                f"{call.count} elements are over the maximum of {_MAX_COUNT}")
        if call.kind in ("all_reduce", "reduce", "reduce_scatter"):
            if not isinstance(call.op, str) or call.op.lower() not in _OPS:
                raise InvalidArgument(
                    f"unknown reduce op {call.op!r}; Chorus has "
                    f"{', '.join(_OPS)}")
            spec.op = _OPS[call.op.lower()]
        spec.root = call.root
        if algorithm is not None:
            if not isinstance(algorithm, str) or \
                    algorithm.lower() not in _ALGORITHMS:
                raise InvalidArgument(
                    f"unknown algorithm {algorithm!r}; Chorus has "
                    f"{', '.join(_ALGORITHMS)}")
            algorithm = algorithm.lower()
            if algorithm in _ALL_REDUCE_ONLY and \
                    call.kind not in ("all_reduce", "barrier"):
                raise InvalidArgument(
                    f"{algorithm} is available for all_reduce only, not "
                    f"{call.kind}")
            request.algorithm = _ALGORITHMS[algorithm]
        if device is not None:
            request.device.CopyFrom(_parse_device(device))
        return request

    def _run(self, call: _Call, out: Optional[Buffer], async_op: bool,
             timeout: Optional[float], algorithm: Optional[str],
             device: Optional[str]) -> Any:
        timeout = _check_timeout(timeout, self._timeout)
        output_bytes = call.output_bytes()
        data = call.data
        data_bytes = 0 if data is None else data.nbytes
        # The request's fields but its number, serialized once per kind of
        # call: repeated calls send these bytes and the number after them
        # (protobuf takes fields in any order).
        key: Optional[Tuple[Any, ...]] = (
            call.kind, call.dtype, call.count, call.op, call.root, algorithm,
            device)
        try:
            prefix = self._prefixes.get(key)
        except TypeError:  # an op or algorithm of no hashable type
            key, prefix = None, None
        if prefix is None:
            prefix = self._request(call, algorithm, device).SerializeToString()
            if key is not None:
                if len(self._prefixes) >= _MAX_PREFIXES:
                    self._prefixes.clear()
                self._prefixes[key] = prefix
        target = None
        if call.out_shape is not None and out is not None:
            target = _as_output(out, call.dtype, output_bytes //
                                call.out_dtype.itemsize)
        if self._calls is not None and self._calls.runs_here:
            if async_op:
                return self._start_in_place(call, prefix, call.data, target,
                                            timeout)
            return self._run_in_place(call, prefix, call.data, target,
                                      timeout)
        shared = None
        if data_bytes + output_bytes >= SHARED_THRESHOLD_BYTES:
            shared = self._share(data, target, output_bytes)
        # The request as sent: its fields, the sequence (at most 11 bytes)
        # and the data field.
        request_bytes = len(prefix) + 11 + (
            1 + _varint_size(data_bytes) + data_bytes if data_bytes else 0)
        streamed = shared is None and max(
            request_bytes, output_bytes + _REPLY_OVERHEAD) > self._stream_limit
        request = None
        if streamed:
            request = worker_pb2.LocalCollectiveRequest.FromString(prefix)
        elif shared is not None:
            prefix += shared[3]  # where the daemon reads and writes
        payload: Tuple[Any, ...] = ()
        if data_bytes and shared is None and not streamed:
            # The array itself: C-contiguous, so its buffer is its bytes.
            payload = (_DATA_TAG, _varint(data_bytes), data)
        with self._mutex:
            if self._closed:
                raise InvalidArgument("this communicator is closed")
            sequence = self._next_sequence
            self._next_sequence += 1
            if request is not None:
                request.sequence = sequence
            work = Work(sequence) if async_op else _Outcome(sequence)
            self._in_flight += 1
            try:
                if streamed:
                    header = worker_pb2.LocalChunkedRequest(
                        header=worker_pb2.LocalChunkedHeader(
                            call=request, input_bytes=data_bytes))
                    rpc = self._chunked(
                        _chunked_requests(header.SerializeToString(), data),
                        timeout=timeout)
                else:
                    parts = (prefix, _SEQUENCE_TAG,
                             _varint(sequence)) + payload
                    rpc = None
                    if self._calls is not None and self._calls.usable:
                        # None: the socket turned out closed, nothing sent.
                        rpc = self._calls.call(parts, timeout,
                                               blocking=not async_op)
                    if rpc is None:
                        wire = b"".join(parts)
                        if async_op:
                            rpc = self._collective.future(wire,
                                                          timeout=timeout)
                        else:
                            # Sent from this thread once the lock is
                            # released: a call that blocks needs no gRPC
                            # future (the daemon orders calls by number
                            # however they arrive).
                            rpc = _Blocking(self._collective, wire, timeout)
                        del wire
                    del parts
            except BaseException:
                self._in_flight -= 1
                if self._closed:
                    self._lock.notify_all()
                if shared is not None and shared[0] is not None:
                    self._shared.give_back(shared[0])
                raise
        receive: Optional[Callable[[Any], Tuple[Any, Any]]] = None
        if shared is not None:
            lease, out_offset, in_target, _ = shared

            def receive(done: Any) -> Tuple[Any, Any]:
                return self._receive_shared(done, call, target, sequence,
                                            lease, out_offset, in_target)
        elif streamed:
            def receive(done: Any) -> Tuple[Any, Any]:
                return self._receive_streamed(done, call, target, sequence)
        if not async_op:
            self._settle(call, work, rpc, receive, target)  # on this thread
            return work.result()
        if streamed:
            threading.Thread(
                target=self._settle, daemon=True,
                name=f"chorus-{call.kind}-{sequence}",
                args=(call, work, rpc, receive)).start()
        else:
            rpc.add_done_callback(
                lambda done: self._settle(call, work, done, receive, target))
        return work

    def _run_in_place(self, call: _Call, prefix: bytes,
                      data: Optional[np.ndarray],
                      target: Optional[np.ndarray], timeout: float) -> Any:
        """A blocking call through an embedded worker, run on this thread
        (CallSocket.run_in_place) on the arrays themselves: the runtime
        reads `data` and writes the output into `target` (or a new array
        shaped as the call's output) in place, with no copy into a message
        or shared memory. Returns the result as _run() does; raises as it
        does, leaving `target` as it was.
        """
        result = target
        if result is None and call.out_shape is not None:
            result = np.empty(call.out_shape, call.out_dtype)
        if data is None:
            data = _NOTHING
        with self._mutex:
            if self._closed:
                raise InvalidArgument("this communicator is closed")
            sequence = self._next_sequence
            self._next_sequence += 1
            self._in_flight += 1
        try:
            reply = self._calls.run_in_place(
                prefix, sequence, data, _NOTHING if result is None else result,
                timeout)
        except BaseException:
            self._left_flight()
            raise
        if reply is True:
            self._left_flight()
            return result
        work = _Outcome(sequence)
        rpc = _Replied(reply) if reply is not None else _Unsent(self._calls)
        self._settle(call, work, rpc, None, target)
        return work.result()

    def _start_in_place(self, call: _Call, prefix: bytes,
                        data: Optional[np.ndarray],
                        target: Optional[np.ndarray], timeout: float) -> Work:
        """An async_op call through an embedded worker on the arrays
        themselves (CallSocket.call with `into`): the runtime reads `data`
        and writes the output into `target` (or a new array shaped as the
        call's output) in place while the call runs on the worker's
        threads; the extension holds both until the call's reply came.
        Returns the Work, ended as _run()'s is; the caller leaves `target`
        alone until then.
        """
        result = target
        if result is None and call.out_shape is not None:
            result = np.empty(call.out_shape, call.out_dtype)
        data = _NOTHING if data is None else data
        place = _NOTHING if result is None else result
        with self._mutex:
            if self._closed:
                raise InvalidArgument("this communicator is closed")
            sequence = self._next_sequence
            self._next_sequence += 1
            work = Work(sequence)
            self._in_flight += 1
            try:
                # Sent in number order, under the lock, as _run()'s calls.
                rpc = self._calls.call((), timeout,
                                       into=(prefix, sequence, data, place))
            except BaseException as e:
                self._in_flight -= 1
                if self._closed:
                    self._lock.notify_all()
                if isinstance(e, Exception) and \
                        self._next_sequence == sequence + 1:
                    # Refused before it started: the number is free.
                    self._next_sequence = sequence
                raise
        if rpc is None:  # the channel broke: nothing sent
            self._settle(call, work, _Unsent(self._calls), None, target)
            return work

        def receive(done: Any) -> Tuple[Any, Any]:
            return done.result().plan, result

        rpc.add_done_callback(
            lambda done: self._settle(call, work, done, receive, target))
        return work

    def _share(self, data: Optional[np.ndarray],
               target: Optional[np.ndarray], output_bytes: int
               ) -> Optional[Tuple[Optional[Region], int, bool, bytes]]:
        """Prepares a call that can go through shared memory: in place for
        arrays from shared_array(), else through a pool region it borrows,
        copying the input in. Returns (the borrowed region or None, the
        output's offset in it, whether the output lands in `target` itself,
        the request's shared_input and shared_output fields serialized), or
        None when the call goes in messages.
        """
        input_bytes = 0 if data is None else data.nbytes
        at_input = self._shared.locate(data) if input_bytes else None
        at_output = None
        if target is not None and output_bytes:
            at_output = self._shared.locate(target)
        in_target = at_output is not None
        in_pool = input_bytes if at_input is None else 0
        out_offset = SharedMemory.output_offset(in_pool)
        need = out_offset + (output_bytes if at_output is None else 0)
        lease = None
        if need:
            lease = self._shared.borrow(need)
            if lease is None:
                return None
        if at_input is None:
            if lease is None:  # no input, output in a shared array
                at_input = at_output
            else:
                at_input = (lease.region, 0)
                if input_bytes:
                    lease.view[:input_bytes] = \
                        data.reshape(-1).view(np.uint8)
        if at_output is None:
            at_output = (lease.region, out_offset) if lease is not None \
                else at_input
        fields = b"".join((
            _shared_buffer(_SHARED_INPUT_TAG, *at_input, input_bytes),
            _shared_buffer(_SHARED_OUTPUT_TAG, *at_output, output_bytes)))
        return lease, out_offset, in_target, fields

    def _receive_shared(self, rpc: Any, call: _Call,
                        target: Optional[np.ndarray], sequence: int,
                        lease: Optional[Region], out_offset: int,
                        in_target: bool
                        ) -> Tuple[Any, Optional[np.ndarray]]:
        """Returns (the plan, the output) of a finished call on shared
        memory, copying the output out of the pool region unless it landed
        in `target` itself. The region goes back to the pool, or, when the
        call ended without the daemon's answer (it may still write into
        it), is released.
        """
        try:
            response = rpc.result()
        except BaseException:
            if lease is not None:
                self._shared.discard(lease)
            raise
        try:
            if response.data:
                raise Internal(f"{call.kind} #{sequence}: the worker sent "
                               "its output in the reply, not in shared "
                               "memory", grpc.StatusCode.INTERNAL)
            if call.out_shape is None:
                return response.plan, None
            if in_target:
                return response.plan, target
            size = call.output_bytes()
            assert lease is not None
            result = lease.view[out_offset:out_offset + size]
            if target is not None:
                target.reshape(-1).view(np.uint8)[...] = result
                return response.plan, target
            return response.plan, result.view(call.out_dtype).reshape(
                call.out_shape).copy()
        finally:
            if lease is not None:
                self._shared.give_back(lease)

    def _receive_streamed(self, responses: Iterator[Any], call: _Call,
                          target: Optional[np.ndarray], sequence: int
                          ) -> Tuple[Any, Optional[np.ndarray]]:
        """Reads a CollectiveChunked stream to its end and returns (the
        plan, the output), writing the pieces straight into the result.
        """
        expected = call.output_bytes()
        header = None
        buffer = np.empty(0, np.uint8)
        received = 0
        for response in responses:
            if response.WhichOneof("part") == "header":
                if header is not None:
                    raise Internal(f"{call.kind} #{sequence}: the worker "
                                   "sent a second header",
                                   grpc.StatusCode.INTERNAL)
                header = response.header
                if header.output_bytes != expected:
                    raise Internal(
                        f"{call.kind} #{sequence}: the worker returns "
                        f"{header.output_bytes} bytes; the result takes "
                        f"{expected}", grpc.StatusCode.INTERNAL)
                if target is not None:
                    buffer = target.reshape(-1).view(np.uint8)
                else:
                    buffer = np.empty(expected, np.uint8)
                continue
            piece = response.data
            if header is None or received + len(piece) > expected:
                raise Internal(
                    f"{call.kind} #{sequence}: the worker sent more output "
                    f"than the {expected} bytes it announced, or sent it "
                    "before its header", grpc.StatusCode.INTERNAL)
            buffer[received:received + len(piece)] = np.frombuffer(
                piece, np.uint8)
            received += len(piece)
        if header is None or received != expected:
            raise Internal(
                f"{call.kind} #{sequence}: the worker's stream ended after "
                f"{received} of {expected} bytes of output",
                grpc.StatusCode.INTERNAL)
        if call.out_shape is None:
            return header.plan, None
        if target is not None:
            return header.plan, target
        return header.plan, buffer.view(call.out_dtype).reshape(
            call.out_shape)

    def _settle(self, call: _Call, work: Union[Work, "_Outcome"], rpc: Any,
                receive: Optional[Callable[[Any], Tuple[Any, Any]]] = None,
                target: Optional[np.ndarray] = None) -> None:
        """Completes `work` with the outcome of `rpc`: the plan and output
        that receive(rpc) returns (for a unary call, which has none, its
        response's, written into `target` when given), or the chorus.Error
        either raises. A call refused before it took its number (a refusal
        code without `number_used`, e.g. over the daemon's
        --max_tensor_bytes) gives its number back when no later call took
        one meanwhile.
        """
        try:
            try:
                if receive is None:
                    response = rpc.result()
                    plan = response.plan
                    output = self._output(call, target, response.data,
                                          work.sequence)
                else:
                    plan, output = receive(rpc)
            except grpc.FutureCancelledError:
                raise Cancelled(f"{call.kind} #{work.sequence} was cancelled",
                                grpc.StatusCode.CANCELLED) from None
            except grpc.RpcError as e:
                error = from_rpc_error(e)
                if (isinstance(error, DeadlineExceeded) and
                        error.message == "Deadline Exceeded"):
                    # gRPC's own deadline came before the daemon's verdict.
                    error = DeadlineExceeded(
                        f"{call.kind} #{work.sequence} of group "
                        f"{self._group} got no answer from the worker daemon "
                        f"at {self._worker} within its deadline",
                        error.code, error.details)
                if error.sequence is None:
                    error.sequence = work.sequence
                if error.group is None:
                    error.group = self._group
                if not error.number_used and error.code in _REFUSALS:
                    with self._mutex:
                        if self._next_sequence == work.sequence + 1:
                            self._next_sequence = work.sequence
                raise error from None
            work.algorithm = _ALGORITHM_NAMES.get(plan.algorithm,
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
            self._left_flight()

    def _output(self, call: _Call, target: Optional[np.ndarray], data: bytes,
                sequence: int) -> Optional[np.ndarray]:
        if call.out_shape is None:
            return None
        expected = call.output_bytes()
        if len(data) != expected:
            raise Internal(
                f"{call.kind} #{sequence}: the worker returned {len(data)} "
                f"bytes; the result takes {expected}",
                grpc.StatusCode.INTERNAL)
        if target is not None:
            # C-contiguous and `expected` bytes long (_as_output).
            memoryview(target).cast("B")[:] = data
            return target
        return np.frombuffer(data, dtype=call.out_dtype).reshape(
            call.out_shape).copy()
