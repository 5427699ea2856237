"""The protobuf encoding of a collective's request, as Python writes it.

A communicator serializes the fields of a LocalCollectiveRequest that stay
the same from call to call once (its prefix: group, rank, epoch, spec,
algorithm, device) and sends each call as that prefix, the call's sequence
number and its data field, or its shared-memory fields, one buffer after
the other: protobuf takes fields in any order and a later field wins, so
the parts concatenated are the request. Large calls stream their input as
LocalChunkedRequest pieces.

This is the one Python copy of that encoding (varints, tags, the
prefix+sequence+data parts), used by every Python route. The call socket's
C extension chorus._frames (_frames.c, beside this file) is the fast path
that wraps those parts in a LocalCallFrame and parses the replies; the
embedded worker's extension takes a prefix and a number as they are.
Field numbers come from the generated descriptors of worker.proto.
"""

from typing import Any, Dict, Iterator, Optional, Tuple

import numpy as np

from chorus import _dtypes, _names
from chorus.errors import InvalidArgument
from chorus.v1 import types_pb2, worker_pb2

__all__ = ["varint", "varint_size", "SEQUENCE_TAG", "DATA_TAG",
           "SHARED_INPUT_TAG", "SHARED_OUTPUT_TAG", "PIECE_TAG",
           "shared_buffer", "request_parts", "request_bytes",
           "chunked_requests", "Prefixes", "MAX_COUNT", "PIECE_BYTES"]

# The largest element count a call may carry (common/collective.h).
MAX_COUNT = 1 << 40

# The largest piece of a tensor in one CollectiveChunked message.
PIECE_BYTES = 4 * 1024 * 1024

# How many serialized request prefixes a communicator keeps.
_MAX_PREFIXES = 64

_VARINT, _LENGTH_DELIMITED = 0, 2

_ONE_BYTE = tuple(bytes([value]) for value in range(0x80))


def varint(value: int) -> bytes:
    """`value` (>= 0) as a protobuf varint."""
    if value < 0x80:
        return _ONE_BYTE[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def varint_size(value: int) -> int:
    """How many bytes varint(value) takes."""
    size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


def _tag(message: Any, field: str, wire_type: int) -> bytes:
    """The tag of `message`'s field `field`, as its descriptor numbers it."""
    number = message.DESCRIPTOR.fields_by_name[field].number
    return varint((number << 3) | wire_type)


SEQUENCE_TAG: bytes = _tag(worker_pb2.LocalCollectiveRequest, "sequence",
                           _VARINT)
"""LocalCollectiveRequest.sequence's tag (a varint follows)."""
DATA_TAG: bytes = _tag(worker_pb2.LocalCollectiveRequest, "data",
                       _LENGTH_DELIMITED)
"""LocalCollectiveRequest.data's tag (its length, then its bytes)."""
SHARED_INPUT_TAG: bytes = _tag(worker_pb2.LocalCollectiveRequest,
                               "shared_input", _LENGTH_DELIMITED)
"""LocalCollectiveRequest.shared_input's tag (a SharedBuffer)."""
SHARED_OUTPUT_TAG: bytes = _tag(worker_pb2.LocalCollectiveRequest,
                                "shared_output", _LENGTH_DELIMITED)
"""LocalCollectiveRequest.shared_output's tag (a SharedBuffer)."""
PIECE_TAG: bytes = _tag(worker_pb2.LocalChunkedRequest, "data",
                        _LENGTH_DELIMITED)
"""LocalChunkedRequest.data's tag: one piece of a streamed input."""
_REGION_TAG, _OFFSET_TAG, _BYTES_TAG = (
    _tag(worker_pb2.SharedBuffer, name, _VARINT)
    for name in ("region", "offset", "bytes"))


def shared_buffer(tag: bytes, region: int, offset: int, size: int) -> bytes:
    """A SharedBuffer field of a LocalCollectiveRequest (SHARED_INPUT_TAG or
    SHARED_OUTPUT_TAG), serialized.
    """
    body = b"".join((_REGION_TAG, varint(region), _OFFSET_TAG,
                     varint(offset), _BYTES_TAG, varint(size)))
    return b"".join((tag, varint(len(body)), body))


def request_parts(prefix: bytes, sequence: int,
                  data: Optional[np.ndarray] = None) -> Tuple[Any, ...]:
    """The buffers of a LocalCollectiveRequest, one after the other: its
    prefix, number `sequence`, and the C-contiguous array `data` as its data
    field (none for None or an empty array).
    """
    if data is None or not data.nbytes:
        return (prefix, SEQUENCE_TAG, varint(sequence))
    return (prefix, SEQUENCE_TAG, varint(sequence), DATA_TAG,
            varint(data.nbytes), data)


def request_bytes(prefix: bytes, data_bytes: int) -> int:
    """The size of a request of `prefix` and `data_bytes` of data, at most
    (its number takes at most 11 bytes).
    """
    data_field = 1 + varint_size(data_bytes) + data_bytes if data_bytes else 0
    return len(prefix) + 11 + data_field


def chunked_requests(header: bytes, data: Optional[np.ndarray]
                     ) -> Iterator[bytes]:
    """Yields a CollectiveChunked stream's requests as sent: the serialized
    header, then `data` in pieces of at most PIECE_BYTES.
    """
    yield header
    if data is None or data.nbytes == 0:
        return
    view = data.reshape(-1).view(np.uint8).data
    for at in range(0, len(view), PIECE_BYTES):
        piece = view[at:at + PIECE_BYTES]
        yield b"".join([PIECE_TAG, varint(len(piece)), piece])


class Prefixes:
    """The serialized prefixes of one rank's requests, by kind of call.

    Thread safety: any thread may call prefix(); two threads may build the
    same prefix once each.
    """

    def __init__(self, group: str, rank: int, epoch: int) -> None:
        """Prefixes of rank `rank` of `group` at `epoch`."""
        self._group = group
        self._rank = rank
        self._epoch = epoch
        self._kept: Dict[Tuple[Any, ...], bytes] = {}

    def prefix(self, kind: str, dtype: Optional[str], count: int, op: Any,
               root: int, algorithm: Any, device: Any) -> bytes:
        """The LocalCollectiveRequest of such a call without its number and
        data, serialized; kept for the next call of its kind. Raises
        InvalidArgument for what it cannot carry (a count over MAX_COUNT, an
        unknown op or algorithm, an algorithm the kind cannot force, a
        malformed device).
        """
        key: Optional[Tuple[Any, ...]] = (kind, dtype, count, op, root,
                                          algorithm, device)
        try:
            kept = self._kept.get(key)
        except TypeError:  # an op or algorithm of no hashable type
            key, kept = None, None
        if kept is not None:
            return kept
        built = self.request(kind, dtype, count, op, root, algorithm,
                             device).SerializeToString()
        if key is not None:
            if len(self._kept) >= _MAX_PREFIXES:
                self._kept.clear()
            self._kept[key] = built
        return built

    def request(self, kind: str, dtype: Optional[str], count: int, op: Any,
                root: int, algorithm: Any, device: Any
                ) -> worker_pb2.LocalCollectiveRequest:
        """The LocalCollectiveRequest that prefix() serializes; raises as it
        does.
        """
        request = worker_pb2.LocalCollectiveRequest(
            group=self._group, rank=self._rank,
            spec=types_pb2.CollectiveSpec(kind=_names.KINDS[kind]),
            epoch=self._epoch)
        spec = request.spec
        if dtype is not None:
            spec.dtype = _dtypes.proto_dtype(dtype)
        spec.count = count
        if count > MAX_COUNT:
            raise InvalidArgument(
                f"{count} elements are over the maximum of {MAX_COUNT}")
        if kind in ("all_reduce", "reduce", "reduce_scatter"):
            if not isinstance(op, str) or op.lower() not in _names.OPS:
                raise InvalidArgument(
                    f"unknown reduce op {op!r}; Chorus has "
                    f"{', '.join(_names.OPS)}")
            spec.op = _names.OPS[op.lower()]
        spec.root = root
        if algorithm is not None:
            request.algorithm = _algorithm(algorithm, kind)
        if device is not None:
            request.device.CopyFrom(_names.parse_device(device))
        return request


# Forced algorithms that only all_reduce (and barrier) can run.
_ALL_REDUCE_ONLY = ("recursive_doubling", "same_host")


def _algorithm(algorithm: Any, kind: str) -> int:
    """The chorus.v1.Algorithm a call of `kind` forces by name."""
    if not isinstance(algorithm, str) or \
            algorithm.lower() not in _names.ALGORITHMS:
        raise InvalidArgument(
            f"unknown algorithm {algorithm!r}; Chorus has "
            f"{', '.join(_names.ALGORITHMS)}")
    algorithm = algorithm.lower()
    if algorithm in _ALL_REDUCE_ONLY and kind not in ("all_reduce",
                                                      "barrier"):
        raise InvalidArgument(
            f"{algorithm} is available for all_reduce only, not {kind}")
    return _names.ALGORITHMS[algorithm]
