"""chorus._frames over a real socket pair: the frames send_call() writes
parse as worker.proto's LocalCallFrame, and a Reader reads every
LocalCallReply the generated messages write, however the bytes arrive.
"""

import socket
import struct
import threading
import time
from typing import Any, Iterator, List, Tuple

import numpy as np
import pytest

from chorus import _frames
from chorus._wire import varint
from chorus.v1 import types_pb2, worker_pb2

LENGTH = struct.Struct("<I")
WAIT = 10.0


@pytest.fixture
def pair() -> Iterator[Tuple[socket.socket, socket.socket]]:
    """A connected pair of Unix stream sockets: (client end, daemon end)."""
    client, daemon = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    daemon.settimeout(WAIT)
    yield client, daemon
    client.close()
    daemon.close()


def read_frame(sock: socket.socket) -> bytes:
    """The next length-prefixed frame's body from `sock`."""
    def read(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            assert chunk, "the stream ended inside a frame"
            data += chunk
        return data

    (length,) = LENGTH.unpack(read(LENGTH.size))
    return read(length)


def reply_bytes(call_id: int, code: int = 0, message: str = "",
                details: bytes = b"", data: bytes = b"",
                algorithm: int = 0, chunk_bytes: int = 0) -> bytes:
    """A LocalCallReply as the daemon writes it, length prefix included."""
    reply = worker_pb2.LocalCallReply(call_id=call_id, code=code,
                                      message=message,
                                      status_details=details)
    if code == 0:
        reply.response.data = data
        reply.response.sequence = 7
        reply.response.plan.algorithm = algorithm
        reply.response.plan.chunk_bytes = chunk_bytes
    body = reply.SerializeToString()
    return LENGTH.pack(len(body)) + body


def test_send_call_parts_arrive_as_one_local_call_frame(pair: Any) -> None:
    client, daemon = pair
    request = worker_pb2.LocalCollectiveRequest(
        group="g", rank=1, epoch=3,
        spec=types_pb2.CollectiveSpec(
            kind=types_pb2.COLLECTIVE_KIND_ALL_REDUCE,
            dtype=types_pb2.DTYPE_F32, count=2))
    data = np.array([1.5, -2.0], np.float32)
    parts = (request.SerializeToString(), b"\x60", b"\x2a", b"\x4a",
             bytes([data.nbytes]), data.view(np.uint8).data)
    _frames.send_call(client.fileno(), 300, 2_500_000, parts)
    frame = worker_pb2.LocalCallFrame.FromString(read_frame(daemon))
    assert frame.call_id == 300
    assert frame.timeout_us == 2_500_000
    assert frame.call.group == "g" and frame.call.epoch == 3
    assert frame.call.sequence == 42
    assert np.frombuffer(frame.call.data, np.float32).tolist() == [1.5, -2.0]


def test_send_call_large_request_arrives_whole(pair: Any) -> None:
    client, daemon = pair
    payload = np.arange(3 << 18, dtype=np.uint32)  # 3 MiB: partial writes
    body = payload.view(np.uint8).data
    parts = (b"\x4a", varint(payload.nbytes), body)
    received: List[bytes] = []
    reader = threading.Thread(target=lambda: received.append(
        read_frame(daemon)))
    reader.start()
    _frames.send_call(client.fileno(), 1, 1, parts)
    reader.join(WAIT)
    frame = worker_pb2.LocalCallFrame.FromString(received[0])
    assert np.array_equal(np.frombuffer(frame.call.data, np.uint32), payload)


def test_send_call_too_many_parts_raises_value_error(pair: Any) -> None:
    client, _ = pair
    with pytest.raises(ValueError):
        _frames.send_call(client.fileno(), 1, 1, (b"x",) * 9)


def test_send_call_closed_peer_raises_os_error(pair: Any) -> None:
    client, daemon = pair
    daemon.close()
    with pytest.raises(OSError):
        _frames.send_call(client.fileno(), 1, 1, (b"\x08\x01",))


def test_wait_own_reply_returns_its_fields(pair: Any) -> None:
    client, daemon = pair
    daemon.sendall(reply_bytes(5, data=b"12345678", algorithm=2,
                               chunk_bytes=4096))
    reader = _frames.Reader(client.fileno())
    got = reader.wait(5, WAIT, _no_other_reply)
    assert got == (5, 0, "", b"", b"12345678", 2, 4096)


def test_wait_error_reply_returns_code_message_and_details(
        pair: Any) -> None:
    client, daemon = pair
    daemon.sendall(reply_bytes(9, code=3, message="bad \u00e9",
                               details=b"\x08\x03"))
    got = _frames.Reader(client.fileno()).wait(9, WAIT, _no_other_reply)
    assert got == (9, 3, "bad \u00e9", b"\x08\x03", b"", 0, 0)


def test_wait_negative_code_parses_as_int32(pair: Any) -> None:
    client, daemon = pair
    daemon.sendall(reply_bytes(9, code=-2))
    got = _frames.Reader(client.fileno()).wait(9, WAIT, _no_other_reply)
    assert got[1] == -2


def test_wait_other_replies_go_to_callback_in_order(pair: Any) -> None:
    client, daemon = pair
    daemon.sendall(reply_bytes(1, data=b"a") + reply_bytes(2, data=b"b") +
                   reply_bytes(3, data=b"c"))
    others: List[Any] = []
    got = _frames.Reader(client.fileno()).wait(
        2, WAIT, lambda reply: others.append(reply) or True)
    assert got[4] == b"b"
    assert [o[0] for o in others] == [1, 3]


def test_wait_reply_in_pieces_is_reassembled(pair: Any) -> None:
    client, daemon = pair
    data = bytes(range(256)) * 8192  # 2 MiB: over the first buffer
    whole = reply_bytes(4, data=data)
    cuts = [0, 2, 7, 100, 50_000]  # each within what the socket holds
    reader = _frames.Reader(client.fileno())
    for at, end in zip(cuts, cuts[1:]):
        daemon.sendall(whole[at:end])
        # Each piece is read on its own, and is no whole reply yet.
        assert reader.drain(_no_other_reply) is True
    sender = threading.Thread(target=daemon.sendall,
                              args=(whole[cuts[-1]:],))
    sender.start()  # the rest is over what the socket holds at once
    got = reader.wait(4, WAIT, _no_other_reply)
    sender.join(WAIT)
    assert got[4] == data


def test_wait_nothing_by_deadline_returns_none(pair: Any) -> None:
    client, _ = pair
    start = time.monotonic()
    got = _frames.Reader(client.fileno()).wait(1, 0.2, _no_other_reply)
    assert got is None
    assert time.monotonic() - start >= 0.19


def test_wait_stream_ended_returns_false(pair: Any) -> None:
    client, daemon = pair
    daemon.sendall(reply_bytes(1)[:3])  # a frame cut short
    daemon.close()
    assert _frames.Reader(client.fileno()).wait(1, WAIT,
                                                _no_other_reply) is False


def test_wait_callback_says_stop_returns_false(pair: Any) -> None:
    client, daemon = pair
    daemon.sendall(reply_bytes(0, code=13, message="closing"))
    assert _frames.Reader(client.fileno()).wait(
        1, WAIT, lambda reply: False) is False


def test_wait_callback_raises_propagates(pair: Any) -> None:
    client, daemon = pair
    daemon.sendall(reply_bytes(1))

    def fail(reply: Any) -> bool:
        raise KeyError("from the callback")

    with pytest.raises(KeyError):
        _frames.Reader(client.fileno()).wait(2, WAIT, fail)


def test_wait_reply_that_does_not_parse_raises_value_error(
        pair: Any) -> None:
    client, daemon = pair
    body = b"\x08\xff"  # a varint cut short
    daemon.sendall(LENGTH.pack(len(body)) + body)
    with pytest.raises(ValueError):
        _frames.Reader(client.fileno()).wait(1, WAIT, _no_other_reply)


def test_wait_unknown_fields_are_skipped(pair: Any) -> None:
    client, daemon = pair
    # Field 9 (varint), 10 (fixed64), 11 (bytes) and 12 (fixed32) first.
    body = (b"\x48\x05" + b"\x51" + b"\0" * 8 + b"\x5a\x02hi" +
            b"\x65" + b"\0" * 4 + b"\x08\x06")
    daemon.sendall(LENGTH.pack(len(body)) + body)
    got = _frames.Reader(client.fileno()).wait(6, WAIT, _no_other_reply)
    assert got == (6, 0, "", b"", b"", 0, 0)


def test_drain_passes_whole_replies_keeps_the_rest(pair: Any) -> None:
    client, daemon = pair
    second = reply_bytes(2, data=b"xy")
    daemon.sendall(reply_bytes(1) + second[:5])
    reader = _frames.Reader(client.fileno())
    seen: List[Any] = []
    # A Unix socket pair holds what was sent: drain() reads it all.
    assert reader.drain(lambda reply: seen.append(reply) or True) is True
    assert [s[0] for s in seen] == [1]
    daemon.sendall(second[5:])
    got = reader.wait(2, WAIT, _no_other_reply)
    assert got[4] == b"xy"


def test_drain_nothing_there_returns_true(pair: Any) -> None:
    client, _ = pair
    assert _frames.Reader(client.fileno()).drain(_no_other_reply) is True


def _no_other_reply(reply: Any) -> bool:
    raise AssertionError(f"unexpected reply {reply!r}")


def test_wait_random_replies_parse_or_raise_value_error(pair: Any) -> None:
    client, daemon = pair
    rng = np.random.default_rng(16)
    reader = _frames.Reader(client.fileno())
    valid = reply_bytes(1, code=5, message="m", details=b"d", data=b"x" * 40,
                        algorithm=3, chunk_bytes=9)[LENGTH.size:]
    for trial in range(2000):
        body = bytearray(valid)
        for _ in range(int(rng.integers(1, 6))):  # damage a few bytes
            body[int(rng.integers(len(body)))] = int(rng.integers(256))
        body = body[:int(rng.integers(1, len(body) + 1))]
        daemon.sendall(LENGTH.pack(len(body)) + bytes(body))
        seen: List[Any] = []
        try:
            # A Unix socket pair holds what was sent: drain() reads it all.
            assert reader.drain(lambda reply: seen.append(reply) or True)
        except ValueError:
            reader = _frames.Reader(client.fileno())  # its buffer is spent
            continue
        assert len(seen) == 1 and len(seen[0]) == 7, trial
