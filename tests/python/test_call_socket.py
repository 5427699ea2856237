"""The worker daemon's call socket (worker.proto, LocalCallFrame), against
real daemons: clients send their collectives there by default and get what
gRPC calls give, and the socket answers bad frames as the protos say,
spoken here with nothing but the generated messages.
"""

import concurrent.futures
import signal
import socket
import struct
import time
from pathlib import Path
from typing import Any, Optional, Tuple

import grpc
import numpy as np
import pytest

import chorus
from chorus import _status_details
from chorus.v1 import types_pb2, worker_pb2, worker_pb2_grpc
from conftest import CALL_TIMEOUT, Cluster, join_all, run_ranks, unique_group

HELLO = b"CHORUS-LOCAL/1\n"
LENGTH = struct.Struct("<I")


def call_socket_of(cluster: Cluster, name: str) -> str:
    """The call socket worker `name` serves, skipping without one."""
    if cluster.socket_dir is None:
        pytest.skip("CHORUS_TEST_CALL_SOCKETS=off: the workers serve none")
    return f"{cluster.workers[name].local_socket}.calls"


def connect(path: str, hello: bytes = HELLO) -> socket.socket:
    """A connection to the call socket at `path` that said `hello`."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CALL_TIMEOUT)
    sock.connect(path)
    sock.sendall(hello)
    return sock


def send_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(LENGTH.pack(len(payload)) + payload)


def read_reply(sock: socket.socket) -> Optional[Any]:
    """The next LocalCallReply, or None when the daemon closed the
    connection first.
    """
    def read(n: int) -> Optional[bytes]:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    head = read(LENGTH.size)
    if head is None:
        return None
    body = read(LENGTH.unpack(head)[0])
    assert body is not None, "the connection closed inside a frame"
    return worker_pb2.LocalCallReply.FromString(body)


def join_raw(cluster: Cluster, name: str, world: int,
             rank: int = 0) -> Tuple[str, int, Any]:
    """Joins a new group through worker `name`'s JoinGroup; returns the
    group, its epoch and the response. Only rank `rank` joins, so a world
    over 1 is joined from other threads by the caller.
    """
    group = unique_group()
    channel = grpc.insecure_channel(cluster.address(name))
    stub = worker_pb2_grpc.WorkerLocalStub(channel)
    response = stub.JoinGroup(worker_pb2.LocalJoinRequest(
        group=group, world_size=world, rank=rank), timeout=CALL_TIMEOUT)
    channel.close()
    return group, response.epoch, response


def all_reduce_frame(group: str, epoch: int, sequence: int, values: np.ndarray,
                     call_id: int = 1, timeout_us: int = 10_000_000,
                     rank: int = 0) -> bytes:
    call = worker_pb2.LocalCollectiveRequest(
        group=group, rank=rank, epoch=epoch, sequence=sequence,
        data=values.tobytes(),
        spec=types_pb2.CollectiveSpec(
            kind=types_pb2.COLLECTIVE_KIND_ALL_REDUCE,
            dtype=types_pb2.DTYPE_F32, count=values.size,
            op=types_pb2.REDUCE_OP_SUM))
    return worker_pb2.LocalCallFrame(
        call_id=call_id, timeout_us=timeout_us, call=call).SerializeToString()


def test_collectives_go_on_the_call_socket_by_default(cluster: Cluster
                                                      ) -> None:
    call_socket_of(cluster, "w0")
    comms = join_all([cluster.address("w0"), cluster.address("w1")])
    try:
        assert all(c.call_socket for c in comms)
        outs = run_ranks([
            (lambda c=c: c.all_reduce(np.full(5, c.rank + 1, np.float32)))
            for c in comms])
        for out in outs:
            np.testing.assert_array_equal(out, np.full(5, 3, np.float32))
        works = [c.all_reduce(np.ones(3, np.int32), async_op=True)
                 for c in comms]
        for work in works:
            np.testing.assert_array_equal(work.result(CALL_TIMEOUT),
                                          np.full(3, 2, np.int32))
    finally:
        for c in comms:
            c.close()


def test_call_socket_false_sends_grpc_calls(cluster: Cluster) -> None:
    comms = join_all([cluster.address("w0"), cluster.address("w1")],
                     call_socket=False)
    try:
        assert not any(c.call_socket for c in comms)
        outs = run_ranks([(lambda c=c: c.all_reduce(np.ones(4, np.float64)))
                          for c in comms])
        for out in outs:
            np.testing.assert_array_equal(out, np.full(4, 2.0))
    finally:
        for c in comms:
            c.close()


def test_a_mismatch_on_the_call_socket_carries_its_details(
        cluster: Cluster) -> None:
    call_socket_of(cluster, "w0")
    comms = join_all([cluster.address("w0"), cluster.address("w1")])
    try:
        assert all(c.call_socket for c in comms)

        def call(c: Any) -> Any:
            try:
                return c.all_reduce(np.ones(2 + c.rank, np.float32))
            except chorus.Error as e:
                return e

        errors = run_ranks([(lambda c=c: call(c)) for c in comms])
        for e in errors:
            assert isinstance(e, chorus.InvalidArgument), e
            assert e.number_used
            assert set(e.ranks or {}) == {0, 1}, e.ranks
    finally:
        for c in comms:
            c.close()


def test_a_raw_frame_runs_a_collective(cluster: Cluster) -> None:
    path = call_socket_of(cluster, "w0")
    group, epoch, joined = join_raw(cluster, "w0", 1)
    assert joined.call_socket == path
    sock = connect(path)
    try:
        values = np.array([1.5, -2.0, 3.25], np.float32)
        send_frame(sock, all_reduce_frame(group, epoch, 1, values, 7))
        reply = read_reply(sock)
        assert reply is not None
        assert (reply.call_id, reply.code) == (7, 0), reply
        assert reply.response.sequence == 1
        np.testing.assert_array_equal(
            np.frombuffer(reply.response.data, np.float32), values)
        # The same number again is a retry: the first attempt's result.
        send_frame(sock, all_reduce_frame(group, epoch, 1, values, 8))
        reply = read_reply(sock)
        assert (reply.call_id, reply.code) == (8, 0), reply
        np.testing.assert_array_equal(
            np.frombuffer(reply.response.data, np.float32), values)
        # A skipped number: refused, with Collective's message.
        send_frame(sock, all_reduce_frame(group, epoch, 3, values, 9,
                                          timeout_us=300_000))
        reply = read_reply(sock)
        assert (reply.call_id, reply.code) == (9, 3), reply
        assert "#2" in reply.message, reply.message
    finally:
        sock.close()


def test_a_verdict_carries_the_status_details(cluster: Cluster) -> None:
    path = call_socket_of(cluster, "w0")
    group = unique_group()

    def join(rank: int) -> Any:
        channel = grpc.insecure_channel(cluster.address("w0"))
        try:
            return worker_pb2_grpc.WorkerLocalStub(channel).JoinGroup(
                worker_pb2.LocalJoinRequest(group=group, world_size=2,
                                            rank=rank), timeout=CALL_TIMEOUT)
        finally:
            channel.close()

    joined = run_ranks([lambda: join(0), lambda: join(1)])
    sock = connect(path)
    try:
        # Rank 1 never calls: rank 0's call ends at its deadline naming it.
        send_frame(sock, all_reduce_frame(group, joined[0].epoch, 1,
                                          np.ones(2, np.float32), 5,
                                          timeout_us=500_000))
        reply = read_reply(sock)
        assert reply is not None
        assert (reply.call_id, reply.code) == (5, 4), reply  # DEADLINE
        decoded = _status_details.decode(
            [(_status_details.DETAILS_KEY, reply.status_details)])
        assert decoded is not None
        code, message, details = decoded
        assert code == 4 and "rank 1" in message, decoded
        error = chorus.errors.from_rpc_error(
            chorus._call_socket.CallSocketError(
                grpc.StatusCode.DEADLINE_EXCEEDED, reply.message,
                reply.status_details))
        assert error.missing_ranks == [1], error
    finally:
        sock.close()


def test_bad_frames_are_refused_and_close_the_connection(
        cluster: Cluster) -> None:
    path = call_socket_of(cluster, "w0")
    group, epoch, _ = join_raw(cluster, "w0", 1)
    # Not a LocalCallFrame.
    sock = connect(path)
    send_frame(sock, b"\xff\xff\xff")
    reply = read_reply(sock)
    assert (reply.call_id, reply.code) == (0, 3), reply
    assert read_reply(sock) is None
    sock.close()
    # call_id 0.
    sock = connect(path)
    send_frame(sock, all_reduce_frame(group, epoch, 1, np.ones(1, np.float32),
                                      call_id=0))
    reply = read_reply(sock)
    assert (reply.call_id, reply.code) == (0, 3), reply
    assert read_reply(sock) is None
    sock.close()
    # Over the message limit: refused from the length alone.
    sock = connect(path)
    sock.sendall(LENGTH.pack(100 << 20))
    reply = read_reply(sock)
    assert (reply.call_id, reply.code) == (0, 8), reply  # RESOURCE_EXHAUSTED
    assert read_reply(sock) is None
    sock.close()
    # Not the hello: closed without a word.
    sock = connect(path, hello=b"GET / HTTP/1.1\r\n")
    assert read_reply(sock) is None
    sock.close()
    # timeout_us 0: refused under its id; the connection stays, and the
    # number was not used.
    sock = connect(path)
    send_frame(sock, all_reduce_frame(group, epoch, 1, np.ones(1, np.float32),
                                      call_id=4, timeout_us=0))
    reply = read_reply(sock)
    assert (reply.call_id, reply.code) == (4, 3), reply
    send_frame(sock, all_reduce_frame(group, epoch, 1, np.ones(1, np.float32),
                                      call_id=6))
    reply = read_reply(sock)
    assert (reply.call_id, reply.code, reply.response.sequence) == (6, 0, 1)
    sock.close()


def test_a_stopped_daemon_fails_waiting_calls_at_once(tmp_path: Path) -> None:
    c = Cluster(tmp_path / "cluster", workers=("a", "b"))
    try:
        if c.socket_dir is None:
            pytest.skip("CHORUS_TEST_CALL_SOCKETS=off: the workers serve "
                        "none")
        comms = join_all([c.address("a"), c.address("b")])
        assert comms[0].call_socket
        # Rank 0's call waits for rank 1, which never calls; its daemon
        # stops.
        work = comms[0].all_reduce(np.ones(2, np.float32), async_op=True,
                                   timeout=60)
        started = time.monotonic()
        c.workers["a"].stop()
        with pytest.raises(chorus.Error) as raised:
            work.result(30)
        assert time.monotonic() - started < 20
        assert isinstance(raised.value, (chorus.Unavailable,
                                         chorus.Aborted)), raised.value
        comms[1].close(timeout=1)
    finally:
        c.stop()


def test_blocking_and_async_calls_from_many_threads_all_complete(
        cluster: Cluster) -> None:
    # Whichever thread reads the socket completes the others' calls: the
    # blocking callers' own threads and the reader thread take turns.
    comms = join_all([cluster.address("w0"), cluster.address("w1")])
    for comm in comms:
        if not comm.call_socket:
            pytest.skip("CHORUS_TEST_CALL_SOCKETS=off")
    threads = 4
    per_thread = 25

    def rank(comm: Any) -> None:
        def issue(t: int) -> None:
            for i in range(per_thread):
                # The ranks' threads pair their calls in whatever order
                # they take numbers: each gets the larger of two values.
                value = np.array([t * 1000 + i], np.int64)
                if (t + i) % 3 == 2:
                    got = comm.all_reduce(value, op="max", async_op=True)
                    got = got.result(CALL_TIMEOUT)
                else:
                    got = comm.all_reduce(value, op="max")
                assert got[0] >= value[0]
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(issue, range(threads)))

    try:
        run_ranks([lambda c=c: rank(c) for c in comms])
        # Numbers were taken in call order on each rank, so the two ranks'
        # calls matched whatever thread made them; every one completed.
        assert [c.next_sequence for c in comms] == \
            [threads * per_thread + 1] * 2
    finally:
        for c in comms:
            c.close()


def test_a_blocking_call_to_a_stuck_daemon_ends_at_its_deadline(
        tmp_path: Path) -> None:
    c = Cluster(tmp_path / "cluster", workers=("a",))
    try:
        if c.socket_dir is None:
            pytest.skip("CHORUS_TEST_CALL_SOCKETS=off: the workers serve "
                        "none")
        (comm,) = join_all([c.address("a")])
        assert comm.call_socket
        daemon = c.workers["a"].process
        daemon.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(chorus.DeadlineExceeded):
                comm.all_reduce(np.ones(1, np.float32), timeout=1.0)
            assert time.monotonic() - started < 10
        finally:
            daemon.send_signal(signal.SIGCONT)
        # The late reply to the call that ended is dropped; the next call
        # gets its own.
        assert comm.all_reduce(np.full(1, 2, np.float32))[0] == 2
        comm.close(timeout=5)
    finally:
        c.stop()


@pytest.mark.parametrize("target,here", [
    ("unix:/run/chorus/worker.sock", True), ("127.0.0.1:7100", True),
    ("127.0.0.9:7100", True), ("[::1]:7100", True), ("localhost:7100", True),
    ("dns:///127.0.0.1:7100", True), ("10.0.0.2:7100", False),
    ("[fe80::1]:7100", False), ("worker-3.example:7100", False)])
def test_only_a_worker_on_this_host_lends_its_call_socket(target: str,
                                                          here: bool) -> None:
    # A worker on another host names a path of its host; the same path here
    # may be another worker's, so its joins keep gRPC calls.
    assert chorus._connect.is_this_host(target) is here
