"""Joining a Chorus group: chorus.join() finds the worker (a daemon's local
API, or an embedded worker runtime), checks every argument before anything
is sent, dials the worker and waits in its JoinGroup until every rank
joined, then hands the Communicator its channel and what the join returned.

Thread safety: join() may be called from any thread; each call makes its
own channel.
"""

import os
from typing import Any, Optional, Sequence, Tuple, Union

import grpc
import numpy as np

from chorus import _arrays, _connect, _membership, _names
from chorus import embedded as _embedded_worker
from chorus.communicator import (DEFAULT_TIMEOUT, MAX_MESSAGE_BYTES,
                                 Communicator)
from chorus.embedded import EmbeddedWorker
from chorus.errors import InvalidArgument, Unavailable, from_rpc_error
from chorus.v1 import types_pb2, worker_pb2, worker_pb2_grpc

__all__ = ["join"]

# How long join() waits for the channel to connect before it asks anyway.
_CONNECT_WAIT = 5.0

# join()'s rank when none is given: $CHORUS_RANK, then $RANK.
_FROM_ENVIRONMENT: Any = object()


def _env_int(names: Sequence[str], given: Optional[int],
             what: str) -> int:
    """`given` as an int, else the first of the environment variables
    `names` that is set; InvalidArgument when there is none or it is not an
    integer.
    """
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



def join(group: Optional[str] = None, world_size: Optional[int] = None,
         rank: Any = _FROM_ENVIRONMENT, *,
         worker: Union[str, EmbeddedWorker, None] = None,
         coordinator: Optional[str] = None,
         device: str = "cpu", timeout: float = DEFAULT_TIMEOUT,
         max_message_bytes: int = MAX_MESSAGE_BYTES,
         tls_dir: Optional[_connect.PathLike] = None,
         shared_memory: bool = True,
         call_socket: bool = True,
         min_world_size: Optional[int] = None,
         max_world_size: Optional[int] = None) -> "Communicator":
    """Joins `group` as `rank` of `world_size` ranks through the worker at
    `worker` and returns the Communicator once every rank joined
    (client/python/README.md says more of each argument).

    Args:
        group, world_size, rank: default $CHORUS_GROUP, $CHORUS_WORLD_SIZE
            (then $WORLD_SIZE) and $CHORUS_RANK (then $RANK). rank=None
            makes the caller a newcomer: it joins a formed elastic group
            without a rank and waits until a sync() of its members admits
            it (world_size is not needed then).
        worker: the daemon's local API, "unix:/path" (its --local_socket)
            or "host:port" (its --listen address: loopback callers, or with
            TLS client and admin certificates); default $CHORUS_WORKER, else
            "unix:" + default_socket_path(). An EmbeddedWorker makes the
            rank go through the worker runtime in this process instead.
        coordinator: instead of a worker, the coordinator's "host:port":
            the rank goes through this process's own worker runtime
            (chorus.embedded.shared_worker(), plaintext: for TLS pass
            worker=chorus.EmbeddedWorker(coordinator, tls_dir=...)).
        device: where this rank reduces: "cpu", "cuda:0", ...
        timeout: seconds the join may wait; each call's default deadline.
        max_message_bytes: the largest gRPC message the daemon takes; calls
            whose messages would be larger stream their tensors.
        tls_dir: for a host:port worker started with --tls_dir, the folder
            of this client's ca.pem, cert.pem and key.pem (mutual TLS);
            default $CHORUS_TLS_DIR; "" means plaintext; unix: workers are
            reached in plaintext.
        shared_memory: let calls of SHARED_THRESHOLD_BYTES or more put their
            tensors in memory shared with the daemon, where it runs on this
            host as this user.
        call_socket: send calls on the daemon's call socket (plain frames)
            rather than as gRPC calls, where it is on this host and this
            process can open it.
        min_world_size, max_world_size: an elastic group (every rank passes
            the same; README.md, "Elastic groups"); max None: no bound but
            the coordinator's.

    Raises:
        FailedPrecondition: coordinator= without the embedded worker; a
            newcomer for a group that is not a formed elastic group.
        InvalidArgument: a missing or malformed argument or TLS file
            (nothing is sent), or one the coordinator refuses (rank taken,
            world size or elastic bounds differ).
        PermissionDenied: the daemon refuses this caller (see worker).
        DeadlineExceeded: not every rank joined in time (`missing_ranks`).
        Unimplemented: the device cannot take part (`device` names it).
        Unavailable: the daemon cannot be reached or is not registered yet.
    """
    request = _request(group, world_size, rank, min_world_size,
                       max_world_size)
    embedded, worker, default_worker, tls_path, tls_source = _where(
        worker, coordinator, tls_dir)
    timeout, device_proto = _options(timeout, max_message_bytes, device)
    request.device.CopyFrom(device_proto)
    # The TLS files are checked before anything is sent.
    credentials = (None if tls_path is None else
                   _connect.tls_credentials(tls_path, tls_source))
    if coordinator is not None:
        embedded = _embedded_worker.shared_worker(coordinator)
    if embedded is not None:
        worker = embedded.target
    else:
        _connect.check_socket(worker, default_worker)
    channel, response = _join_group(worker, credentials, tls_path, tls_source,
                                    timeout, max_message_bytes, request)
    return _communicator(channel, worker, request, response, timeout,
                         max_message_bytes, bool(shared_memory),
                         call_socket and _connect.is_this_host(worker),
                         embedded if call_socket else None)


def _communicator(channel: grpc.Channel, worker: str, request: Any,
                  response: Any, timeout: float, max_message_bytes: int,
                  shared_memory: bool, call_socket: bool,
                  embedded: Optional[EmbeddedWorker]) -> Communicator:
    """The Communicator of a join: `request` and the worker's `response`
    (a newcomer learns its rank and the group's size from the answer).
    """
    newcomer = request.newcomer
    return Communicator(
        _channel=channel, _worker=worker, _group=request.group,
        _world_size=response.world_size if newcomer else request.world_size,
        _rank=response.rank if newcomer else request.rank,
        _epoch=response.epoch,
        _device=_names.canonical_name(request.device),
        _member_devices=list(response.member_devices), _timeout=timeout,
        _max_message_bytes=max_message_bytes, _shared_memory=shared_memory,
        # A worker on another host names a path of its host: one here may
        # be another worker's.
        _call_socket=response.call_socket if call_socket else "",
        _embedded=embedded, _device_proto=request.device,
        _min_world_size=response.min_world_size,
        _max_world_size=response.max_world_size)


def _request(group: Optional[str], world_size: Optional[int],
             rank: Any, min_world_size: Optional[int],
             max_world_size: Optional[int]) -> Any:
    """The LocalJoinRequest of join()'s ranks (_ranks) and elastic bounds;
    InvalidArgument for malformed ones.
    """
    group, world_size, rank = _ranks(group, world_size, rank)
    try:
        low = _membership.optional_bound("min_world_size", min_world_size)
        high = _membership.optional_bound("max_world_size", max_world_size)
    except ValueError as e:
        raise InvalidArgument(str(e)) from None
    return worker_pb2.LocalJoinRequest(
        group=group, world_size=world_size, rank=rank or 0,
        newcomer=rank is None, min_world_size=low, max_world_size=high)


def _options(timeout: float, max_message_bytes: int,
             device: str) -> Tuple[float, types_pb2.Device]:
    """join()'s timeout (checked) and device (parsed); InvalidArgument for
    malformed ones or max_message_bytes.
    """
    timeout = _arrays.check_timeout(timeout, DEFAULT_TIMEOUT)
    if (isinstance(max_message_bytes, bool) or
            not isinstance(max_message_bytes, int) or max_message_bytes < 1):
        raise InvalidArgument(
            f"max_message_bytes must be a positive int, got "
            f"{max_message_bytes!r}")
    return timeout, _names.parse_device(device)


def _ranks(group: Optional[str], world_size: Optional[int],
           rank: Any) -> Tuple[str, int, Optional[int]]:
    """(group, world_size, rank) as given or from the environment (rank
    _FROM_ENVIRONMENT); rank None and world_size 0 for a newcomer, which has
    no rank; InvalidArgument where one is missing or out of range.
    """
    if group is None:
        group = os.environ.get("CHORUS_GROUP") or None
    if not isinstance(group, str) or not group:
        raise InvalidArgument("no group: pass group= or set CHORUS_GROUP")
    if rank is None:
        return group, 0, None  # a newcomer
    world_size = _env_int(("CHORUS_WORLD_SIZE", "WORLD_SIZE"), world_size,
                          "world_size")
    rank = _env_int(("CHORUS_RANK", "RANK"),
                    None if rank is _FROM_ENVIRONMENT else rank, "rank")
    if world_size < 1:
        raise InvalidArgument(
            f"world_size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise InvalidArgument(
            f"rank {rank} is out of range for world size {world_size}")
    return group, world_size, rank


def _where(worker: Union[str, EmbeddedWorker, None],
           coordinator: Optional[str], tls_dir: Optional[_connect.PathLike]
           ) -> Tuple[Optional[EmbeddedWorker], str, bool, Optional[str],
                      str]:
    """(the EmbeddedWorker given, the worker's target, whether it is the
    default socket, the TLS directory or None, how it was given) of join()'s
    arguments; InvalidArgument for ones that do not go together. The target
    of an embedded worker is "" until join() knows the worker.
    """
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
    return embedded, worker, default_worker, tls_path, tls_source


def _join_group(worker: str, credentials: Optional[grpc.ChannelCredentials],
                tls_path: Optional[str], tls_source: str, timeout: float,
                max_message_bytes: int,
                request: worker_pb2.LocalJoinRequest
                ) -> Tuple[grpc.Channel, Any]:
    """Dials `worker` and joins through its JoinGroup; returns (the
    channel, the LocalJoinResponse). Raises the join's chorus.Error (an
    Unavailable one with a hint where the channel never connected).
    """
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
    return channel, response


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

