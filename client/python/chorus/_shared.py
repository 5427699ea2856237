"""Shared memory between a communicator and its worker daemon on one host.

The daemon makes a region (WorkerLocal.OpenSharedRegion: a sealed memfd)
and this process maps it by opening /proc/<pid>/fd/<fd>, which works when
both run on one host as one user (or this one as root). A collective then
names byte ranges of regions for its input and output
(LocalCollectiveRequest.shared_input/shared_output): the daemon reads the
input in place and writes the output there, and no tensor bytes cross gRPC.

SharedMemory keeps one communicator's regions: a pool lent to one call at a
time, and the regions behind the arrays shared_array() returns (each
released once its array and every view of it are garbage). Where the
daemon cannot share memory with this process it records why, and the
communicator streams instead.

Thread safety: every method may be called from any thread.
"""

import math
import mmap
import os
import threading
import weakref
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import grpc
import numpy as np

from chorus import _wire
from chorus.errors import from_rpc_error
from chorus.v1 import worker_pb2

__all__ = ["Place", "Region", "SharedMemory", "SHARED_THRESHOLD_BYTES"]

SHARED_THRESHOLD_BYTES: int = 64 * 1024
"""A collective whose input and output add up to at least this many bytes
goes through shared memory when the daemon shares it with this process;
smaller ones, whose bytes cost less than a region's bookkeeping, go in
messages.
"""

_OPEN_METHOD = "/chorus.v1.WorkerLocal/OpenSharedRegion"
_RELEASE_METHOD = "/chorus.v1.WorkerLocal/ReleaseSharedRegion"
# Pool regions are sized in whole MiB, and at most this many wait idle.
_GRAIN = 1 << 20
_MAX_IDLE = 4
# Where a call's output starts in a pool region: past its input, aligned.
_ALIGN = 64
# Seconds a region's open or release may take.
_RPC_TIMEOUT = 10.0


class Region:
    """One mapped region: its number, size, mapping and a uint8 view."""

    __slots__ = ("region", "nbytes", "mapping", "view", "address")

    def __init__(self, region: int, nbytes: int, mapping: mmap.mmap) -> None:
        self.region = region
        self.nbytes = nbytes
        self.mapping = mapping
        self.view = np.frombuffer(mapping, np.uint8, nbytes)
        self.address = self.view.ctypes.data


def _map(answer: Any) -> Region:
    """Maps the region the daemon described; raises OSError when this
    process cannot open it or finds another file there.
    """
    path = f"/proc/{answer.pid}/fd/{answer.fd}"
    expected = f"/memfd:{answer.name} (deleted)"
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        # The link is checked on the descriptor this process holds, so a
        # daemon gone and its PID reused cannot hand it another file.
        found = os.readlink(f"/proc/self/fd/{fd}")
        if found != expected:
            raise OSError(f"{path} is {found!r}, not the daemon's region "
                          f"{expected!r}")
        size = os.fstat(fd).st_size
        if size != answer.bytes:
            raise OSError(f"{path} holds {size} bytes, not {answer.bytes}")
        mapping = mmap.mmap(fd, answer.bytes, mmap.MAP_SHARED,
                            mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    return Region(answer.region, answer.bytes, mapping)


class Place(NamedTuple):
    """Where one call's input and output lie in shared memory."""

    lease: Optional[Region]
    """The pool region lent to the call, or None (both in shared arrays)."""
    out_offset: int
    """Where the output starts in the lent region."""
    in_target: bool
    """Whether the output lands in the caller's `out` itself."""
    fields: bytes
    """The request's shared_input and shared_output fields, serialized."""


class SharedMemory:
    """The shared regions of one communicator (one rank of one group)."""

    def __init__(self, channel: grpc.Channel, group: str, epoch: int,
                 rank: int, enabled: bool) -> None:
        self._open = channel.unary_unary(
            _OPEN_METHOD,
            request_serializer=(
                worker_pb2.SharedRegionRequest.SerializeToString),
            response_deserializer=worker_pb2.SharedRegion.FromString)
        self._release = channel.unary_unary(
            _RELEASE_METHOD,
            request_serializer=(
                worker_pb2.SharedRegionRelease.SerializeToString),
            response_deserializer=worker_pb2.SharedRegionReleased.FromString)
        self._group = group
        self._epoch = epoch
        self._rank = rank
        self._lock = threading.Lock()
        self._usable: Optional[bool] = None if enabled else False
        self._why_not = "" if enabled else "turned off (shared_memory=False)"
        self._idle: List[Region] = []
        # Regions behind arrays from array(): region -> (address, bytes, a
        # weak reference to the mapping the array keeps alive).
        self._arrays: Dict[int, Tuple[int, int, "weakref.ref[Any]"]] = {}
        # Regions whose arrays were collected, to release on the next call:
        # a finalizer may run inside any code, so it only appends here.
        self._dead: List[int] = []

    @property
    def usable(self) -> Optional[bool]:
        """True once a region was mapped, False when the daemon cannot share
        memory with this process, None before the first try.
        """
        return self._usable

    @property
    def why_not(self) -> str:
        """Why shared memory is not used ("" while it is, or untried)."""
        return self._why_not

    def _make(self, nbytes: int) -> Optional[Region]:
        """Opens and maps a region of `nbytes`. Returns None (and, when the
        daemon cannot share memory with this process at all, turns shared
        memory off) where it cannot.
        """
        request = worker_pb2.SharedRegionRequest(
            group=self._group, epoch=self._epoch, rank=self._rank,
            bytes=nbytes)
        try:
            answer = self._open(request, timeout=_RPC_TIMEOUT)
        except grpc.RpcError as e:
            code = e.code()
            if code in (grpc.StatusCode.UNIMPLEMENTED,
                        grpc.StatusCode.PERMISSION_DENIED):
                self._turn_off(f"the daemon: {from_rpc_error(e).message}")
            return None  # e.g. over its --max_shared_bytes: this call streams
        try:
            return _map(answer)
        except (OSError, ValueError) as e:
            self._turn_off(f"cannot map the daemon's region: {e}")
            self._drop(answer.region)
            return None

    def _turn_off(self, why: str) -> None:
        with self._lock:
            if self._usable is None:
                self._usable = False
                self._why_not = why

    def _drop(self, region: int) -> None:
        """Releases region `region` on the daemon; best effort (the daemon
        drops it anyway when the rank leaves).
        """
        request = worker_pb2.SharedRegionRelease(
            group=self._group, epoch=self._epoch, rank=self._rank,
            region=region)
        try:
            self._release(request, timeout=_RPC_TIMEOUT)
        except grpc.RpcError:
            pass

    def _release_dead(self) -> None:
        """Releases the regions whose arrays were collected."""
        while self._dead:
            region = self._dead.pop()
            with self._lock:
                self._arrays.pop(region, None)
            self._drop(region)

    def borrow(self, nbytes: int) -> Optional[Region]:
        """Lends a pool region of at least `nbytes` to one call; returns None
        when shared memory is off or no region can be had (the call then
        goes in messages). Give it back with give_back() or discard().
        """
        self._release_dead()
        with self._lock:
            if self._usable is False:
                return None
            fits = [r for r in self._idle if r.nbytes >= nbytes]
            if fits:
                region = min(fits, key=lambda r: r.nbytes)
                self._idle.remove(region)
                return region
        size = -(-max(nbytes, 1) // _GRAIN) * _GRAIN
        region = self._make(size)
        if region is not None:
            with self._lock:
                self._usable = True
        return region

    def give_back(self, region: Region) -> None:
        """Returns a lent region to the pool once its call has ended with the
        daemon's answer; the smallest idle ones beyond a few are released.
        """
        with self._lock:
            self._idle.append(region)
            surplus = []
            while len(self._idle) > _MAX_IDLE:
                smallest = min(self._idle, key=lambda r: r.nbytes)
                self._idle.remove(smallest)
                surplus.append(smallest)
        for extra in surplus:
            self._drop(extra.region)

    def discard(self, region: Region) -> None:
        """Releases a lent region without reuse: its call ended without the
        daemon's answer, so the daemon may still write into it.
        """
        self._drop(region.region)

    def array(self, shape: Tuple[int, ...], dtype: np.dtype
              ) -> Optional[np.ndarray]:
        """Returns a new array of `shape` and `dtype` in a region of its own,
        or None when shared memory is off.
        """
        self._release_dead()
        nbytes = math.prod(shape) * dtype.itemsize
        with self._lock:
            if self._usable is False:
                return None
        region = self._make(max(nbytes, 1))
        if region is None:
            return None
        count = nbytes // dtype.itemsize
        arr = np.frombuffer(region.mapping, dtype, count).reshape(shape)
        with self._lock:
            self._usable = True
            self._arrays[region.region] = (
                region.address, region.nbytes, weakref.ref(region.mapping))
        weakref.finalize(region.mapping, self._dead.append, region.region)
        return arr

    def locate(self, arr: np.ndarray) -> Optional[Tuple[int, int]]:
        """Returns (region, offset) when `arr`'s bytes lie in an array made
        by array(), else None.
        """
        start = arr.ctypes.data
        end = start + arr.nbytes
        with self._lock:
            regions = list(self._arrays.items())
        for region, (address, nbytes, mapping) in regions:
            if address <= start and end <= address + nbytes and \
                    mapping() is not None:
                return region, start - address
        return None

    def place(self, data: Optional[np.ndarray],
              target: Optional[np.ndarray], output_bytes: int
              ) -> Optional[Place]:
        """Finds a call's place in shared memory: its input and `target`
        in place where they are arrays from array(), else in a pool region
        it borrows (copying `data` in). Returns None when the call goes in
        messages (shared memory is off, or no region can be had). The
        caller gives a lent region back (give_back() or discard()).
        """
        input_bytes = 0 if data is None else data.nbytes
        at_input = self.locate(data) if input_bytes else None
        at_output = None
        if target is not None and output_bytes:
            at_output = self.locate(target)
        in_target = at_output is not None
        in_pool = input_bytes if at_input is None else 0
        out_offset = self.output_offset(in_pool)
        need = out_offset + (output_bytes if at_output is None else 0)
        lease = None
        if need:
            lease = self.borrow(need)
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
            _wire.shared_buffer(_wire.SHARED_INPUT_TAG, *at_input,
                                input_bytes),
            _wire.shared_buffer(_wire.SHARED_OUTPUT_TAG, *at_output,
                                output_bytes)))
        return Place(lease, out_offset, in_target, fields)

    @staticmethod
    def output_offset(input_bytes: int) -> int:
        """Where a call's output starts in a pool region after an input of
        `input_bytes`.
        """
        return -(-input_bytes // _ALIGN) * _ALIGN

    def close(self) -> None:
        """Forgets every region (the daemon drops them when the rank
        leaves); arrays made by array() stay usable memory until they are
        garbage.
        """
        with self._lock:
            self._idle.clear()
            self._arrays.clear()
            self._dead.clear()
            self._usable = False
            self._why_not = "the communicator is closed"

