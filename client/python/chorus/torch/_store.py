"""ChorusStore: torch's distributed store on the Chorus coordinator.

torch needs a key-value store to rendezvous (init_process_group, new_group,
barriers). Its TCPStore listens on MASTER_ADDR:MASTER_PORT without any
authentication; ChorusStore keeps the keys in the coordinator instead,
reached with the rank's mutual TLS certificate ($CHORUS_TLS_DIR) and kept
apart per job (the job its certificate names). With several coordinators on
etcd the keys are on etcd too, and the store follows the leader.

    import torch.distributed as dist
    import chorus.torch  # registers the chorus:// rendezvous
    dist.init_process_group("chorus", init_method="chorus://a:7000,b:7000",
                            rank=rank, world_size=world_size)

needs no MASTER_ADDR and no TCPStore.
"""

import datetime
import os
import time
from typing import Any, Iterator, List, Optional, Sequence, Tuple, Union
from urllib.parse import urlparse

import grpc
import torch.distributed as dist

from chorus import _connect
from chorus.errors import Error, InvalidArgument, from_rpc_error
from chorus.v1 import coordinator_pb2, coordinator_pb2_grpc

SCHEME = "chorus"
_DEFAULT_TIMEOUT = datetime.timedelta(minutes=5)
# How long one attempt may take while waiting for a leader.
_ATTEMPT = 10.0
# Pause between attempts while no coordinator leads (a failover).
_RETRY_PAUSE = 0.2

Bytes = Union[str, bytes]

# The stores the chorus:// rendezvous made. torch keeps only the C++ side of
# a Python store (inside the PrefixStore it wraps it in) and finds the
# Python methods through the Python object: that object must outlive it.
_RENDEZVOUS_STORES: List["ChorusStore"] = []


def _as_bytes(value: Bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class ChorusStore(dist.Store):
    """torch.distributed.Store whose keys live in the Chorus coordinator.

    Keep the object alive while torch uses it (e.g. inside a PrefixStore):
    torch calls its methods through it.

    Args:
        coordinators: "host:port", or several comma-separated (the store
            follows the leader among them).
        timeout: how long get() and wait() wait for their keys, and the
            deadline of every other operation.
        tls_dir: folder with ca.pem, cert.pem and key.pem (a client or
            worker certificate of the job); default $CHORUS_TLS_DIR, else
            plaintext.

    Raises:
        chorus.errors.InvalidArgument: for an empty coordinator list or an
            unreadable TLS folder.
    """

    def __init__(self, coordinators: str,
                 timeout: datetime.timedelta = _DEFAULT_TIMEOUT,
                 tls_dir: Optional[str] = None) -> None:
        super().__init__()
        self._targets = [t.strip() for t in coordinators.split(",")
                         if t.strip()]
        if not self._targets:
            raise InvalidArgument(
                f"no coordinator in {coordinators!r}; give host:port[,...]")
        tls, source = _connect.resolve_tls_dir(tls_dir)
        self._credentials = (_connect.tls_credentials(tls, source)
                             if tls else None)
        self._timeout = timeout
        self._current = 0
        self._stubs: dict = {}

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        """Sets how long get() and wait() wait from now on."""
        self._timeout = timeout

    def _stub(self, target: str) -> Any:
        if target not in self._stubs:
            channel = _connect.make_channel(target, self._credentials, [])
            self._stubs[target] = coordinator_pb2_grpc.CoordinatorStub(channel)
        return self._stubs[target]

    def _follow(self, tried: str, error: Error) -> None:
        """Moves to the leader a standby named, else to the next one."""
        for type_name, fields in error.details:
            if (type_name == "chorus.v1.ErrorDetail" and
                    isinstance(fields, dict) and fields.get("leader")):
                leader = str(fields["leader"])
                if leader not in self._targets:
                    self._targets.append(leader)
                self._current = self._targets.index(leader)
                return
        if self._targets[self._current] == tried:
            self._current = (self._current + 1) % len(self._targets)

    def _run(self, request: Any,
             timeout: Optional[datetime.timedelta] = None) -> Any:
        """Sends `request`, following the leader until the deadline.
        Raises the chorus.errors.Error of the coordinator's answer.
        """
        seconds = (timeout or self._timeout).total_seconds()
        deadline = time.monotonic() + seconds
        while True:
            target = self._targets[self._current]
            left = max(0.001, deadline - time.monotonic())
            try:
                return self._stub(target).Store(request, timeout=left)
            except grpc.RpcError as e:
                error = from_rpc_error(e)
            if (error.code != grpc.StatusCode.UNAVAILABLE or
                    time.monotonic() + _RETRY_PAUSE >= deadline):
                raise error
            self._follow(target, error)
            time.sleep(_RETRY_PAUSE)

    def _op(self, op: int, keys: Sequence[str] = (), **fields: Any) -> Any:
        return coordinator_pb2.StoreRequest(op=op, keys=list(keys), **fields)

    def set(self, key: str, value: Bytes) -> None:
        """Sets `key` to `value`."""
        self._run(self._op(coordinator_pb2.STORE_OP_SET, [key],
                           value=_as_bytes(value)))

    def get(self, key: str) -> bytes:
        """The value of `key`, once it is set (DeadlineExceeded after the
        store's timeout)."""
        return self._run(self._op(coordinator_pb2.STORE_OP_GET, [key])).value

    def add(self, key: str, amount: int) -> int:
        """Adds `amount` to the number `key` holds (0 when unset); returns
        the sum."""
        return self._run(self._op(coordinator_pb2.STORE_OP_ADD, [key],
                                  amount=int(amount))).number

    def compare_set(self, key: str, expected: Bytes, desired: Bytes) -> bytes:
        """Sets `key` to `desired` when it holds `expected` (or is unset and
        `expected` is empty); returns what it holds afterwards."""
        return self._run(self._op(
            coordinator_pb2.STORE_OP_COMPARE_SET, [key],
            expected=_as_bytes(expected), value=_as_bytes(desired))).value

    def wait(self, keys: List[str],
             timeout: Optional[datetime.timedelta] = None) -> None:
        """Returns once every key of `keys` is set (DeadlineExceeded after
        `timeout`, default the store's)."""
        self._run(self._op(coordinator_pb2.STORE_OP_WAIT, keys), timeout)

    def delete_key(self, key: str) -> bool:
        """Deletes `key`; whether it was set."""
        return self._run(self._op(coordinator_pb2.STORE_OP_DELETE_KEY,
                                  [key])).flag

    def num_keys(self) -> int:
        """How many keys the job's store holds."""
        return self._run(self._op(coordinator_pb2.STORE_OP_NUM_KEYS)).number

    def check(self, keys: List[str]) -> bool:
        """Whether every key of `keys` is set."""
        return self._run(self._op(coordinator_pb2.STORE_OP_CHECK, keys)).flag


def _query(url: str) -> dict:
    parsed = urlparse(url)
    return dict(part.split("=", 1) for part in parsed.query.split("&")
                if "=" in part)


def _coordinators_of(url: str) -> str:
    """The host:port list of a chorus:// URL (its netloc), else
    $CHORUS_COORDINATOR."""
    listed = urlparse(url).netloc or os.environ.get("CHORUS_COORDINATOR", "")
    if not listed:
        raise InvalidArgument(
            f"{url!r} names no coordinator: use chorus://host:port[,...]")
    return listed


def rendezvous_handler(
        url: str, timeout: datetime.timedelta = _DEFAULT_TIMEOUT,
        **kwargs: Any) -> Iterator[Tuple[ChorusStore, int, int]]:
    """torch's rendezvous for init_method="chorus://host:port[,...]": a
    ChorusStore on those coordinators, with the rank and world size torch
    passes (or $RANK and $WORLD_SIZE)."""
    query = _query(url)
    rank = int(query.get("rank", os.environ.get("RANK", "-1")))
    world_size = int(query.get("world_size",
                               os.environ.get("WORLD_SIZE", "-1")))
    if rank < 0 or world_size <= 0:
        raise InvalidArgument(
            f"chorus:// rendezvous needs rank and world_size (got rank "
            f"{rank}, world_size {world_size})")
    store = ChorusStore(_coordinators_of(url), timeout)
    _RENDEZVOUS_STORES.append(store)
    yield (store, rank, world_size)
    raise RuntimeError("chorus:// rendezvous cannot rendezvous again")


def register_rendezvous() -> None:
    """Lets init_process_group take init_method="chorus://...". Idempotent."""
    try:
        dist.register_rendezvous_handler(SCHEME, rendezvous_handler)
    except RuntimeError:
        pass  # already registered
