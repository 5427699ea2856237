"""Ranks that embed the worker runtime (chorus.embedded) instead of going
through a worker daemon: alone, beside daemon ranks, in processes of their
own, and when one of those processes is killed.
"""

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Sequence

import grpc
import numpy as np
import pytest

import chorus
from chorus import embedded
from conftest import (CALL_TIMEOUT, REPO, Cluster, make_certs, run_ranks,
                      short_temp_dir, unique_group)
from numpy_reference import (KINDS, REDUCING, check_close, expected,
                             rank_input, storage)
from test_collectives import issue


def _build_has_module() -> bool:
    build = Path(os.environ.get("CHORUS_BUILD_DIR", "build"))
    if not build.is_absolute():
        build = REPO / build
    folder = build / "python-embedded"
    return folder.is_dir() and any(folder.glob("_embedded*.so"))


def test_install_has_embedded_worker_when_the_build_has_it() -> None:
    # The README's test command installs from the build it tests: a module
    # left out would make every other test here skip.
    if not _build_has_module():
        pytest.skip("this build has no chorus._embedded (no python3-dev)")
    assert embedded.available()


@contextlib.contextmanager
def _joined(targets: Sequence[Any]) -> Iterator[List[chorus.Communicator]]:
    """Joins a fresh group, rank r through targets[r] (an EmbeddedWorker
    or a daemon's address); closes the communicators after.
    """
    group = unique_group()
    comms = run_ranks([
        (lambda r=r: chorus.join(group, len(targets), r, worker=targets[r],
                                 timeout=CALL_TIMEOUT))
        for r in range(len(targets))])
    try:
        yield comms
    finally:
        for c in comms:
            c.close(timeout=5)


pytestmark_embedded = pytest.mark.skipif(
    not embedded.available(), reason="chorus._embedded is not installed")


def test_worker_start_errors_take_their_attributes_from_the_status() -> None:
    # The extension raises (code, message[, serialized google.rpc.Status]);
    # the attributes come from the status's ErrorDetail.
    from chorus import _status_details
    from chorus.v1 import status_pb2
    refusal = "Distributed operations are not supported for device Npu(2)"
    status = _status_details.encode(
        grpc.StatusCode.UNIMPLEMENTED.value[0], refusal,
        [status_pb2.ErrorDetail(reason="DEVICE_UNSUPPORTED",
                                device="Npu(2)")])
    error = embedded._error_of(
        RuntimeError(grpc.StatusCode.UNIMPLEMENTED.value[0], refusal, status),
        "127.0.0.1:1")
    assert type(error) is chorus.Unimplemented
    assert error.message == f"embedded worker for coordinator 127.0.0.1:1: " \
        f"{refusal}"
    assert (error.reason, error.device) == ("DEVICE_UNSUPPORTED", "Npu(2)")
    # Without the status the words are not read.
    bare = embedded._error_of(
        RuntimeError(grpc.StatusCode.UNIMPLEMENTED.value[0],
                     refusal + ": no driver"), "127.0.0.1:1")
    assert (bare.reason, bare.device) == (None, None)
    other = embedded._error_of(
        RuntimeError(grpc.StatusCode.DEADLINE_EXCEEDED.value[0],
                     "ranks 1, 2 of group g did not join within the "
                     "deadline"), "127.0.0.1:1")
    assert type(other) is chorus.DeadlineExceeded
    assert other.missing_ranks is None and other.group is None


@pytest.fixture(scope="module")
def worker(cluster: Cluster) -> Iterator[chorus.EmbeddedWorker]:
    """An embedded worker of this process, registered with the cluster."""
    if not embedded.available():
        pytest.skip("chorus._embedded is not installed")
    w = chorus.EmbeddedWorker(cluster.coordinator.address,
                              name=f"embedded-{os.getpid()}")
    yield w
    w.close()


@pytestmark_embedded
def test_embedded_ranks_all_reduce_with_a_daemon_rank(
        cluster: Cluster, worker: chorus.EmbeddedWorker) -> None:
    with _joined([worker, cluster.address("w0"), worker]) as comms:
        assert comms[0].call_socket and comms[2].call_socket
        assert comms[0].worker == worker.target
        for dtype in (np.float32, np.int64, np.float64):
            inputs = [np.arange(5, dtype=dtype) * (r + 1) for r in range(3)]
            got = run_ranks([(lambda c=c, x=x: c.all_reduce(x))
                             for c, x in zip(comms, inputs)])
            for out in got:
                np.testing.assert_array_equal(out, sum(inputs))
        # Larger than an inline plan: the ring between the embedded
        # worker's data plane and the daemon's.
        big = [np.full(300_000, r + 1, np.float32) for r in range(3)]
        got = run_ranks([(lambda c=c, x=x: c.all_reduce(x, algorithm="ring"))
                         for c, x in zip(comms, big)])
        for out in got:
            np.testing.assert_array_equal(out, np.full(300_000, 6))
        gathered = run_ranks([
            (lambda c=c, r=r: c.all_gather(np.array([r, -r], np.int32)))
            for r, c in enumerate(comms)])
        for out in gathered:
            np.testing.assert_array_equal(out, [[0, 0], [1, -1], [2, -2]])


@pytestmark_embedded
def test_embedded_blocking_all_reduce_shapes_outs_and_refusals(
        worker: chorus.EmbeddedWorker) -> None:
    # Blocking all_reduce of small arrays takes a shorter way through an
    # embedded worker; results, outputs and refusals are those of any call.
    with _joined([worker, worker]) as comms:
        for dtype in (np.float32, np.int32, np.float64, np.uint8):
            for shape in ((3,), (2, 3), ()):
                xs = [np.full(shape, r + 2, dtype) for r in range(2)]
                outs = [np.empty(shape, dtype) for _ in range(2)]
                got = run_ranks([
                    (lambda c=c, x=x, o=o: (c.all_reduce(x),
                                            c.all_reduce(x, out=o)))
                    for c, x, o in zip(comms, xs, outs)])
                for (fresh, into), out in zip(got, outs):
                    assert fresh.shape == shape and fresh.dtype == dtype
                    np.testing.assert_array_equal(fresh, np.full(shape, 5))
                    assert into is out
                    np.testing.assert_array_equal(out, np.full(shape, 5))
        before = comms[0].next_sequence
        with pytest.raises(chorus.InvalidArgument):
            comms[0].all_reduce(np.arange(8, dtype=np.float32)[::2])
        with pytest.raises(chorus.InvalidArgument):
            comms[0].all_reduce(np.ones(4, np.float32),
                                out=np.empty(4, np.float64))
        with pytest.raises(chorus.InvalidArgument):
            comms[0].all_reduce(np.ones(4, np.float32), op="median")
        assert comms[0].next_sequence == before  # no number was taken
        comms[0].close()
        with pytest.raises(chorus.InvalidArgument):
            comms[0].all_reduce(np.ones(4, np.float32))


@pytestmark_embedded
def test_embedded_all_reduce_lock_held_waits_then_runs_in_order(
        worker: chorus.EmbeddedWorker) -> None:
    # A blocking all_reduce of numpy arrays is one call into the extension,
    # which takes its number from the communicator's numbering (take());
    # while another thread holds the numbering's lock, it waits for it.
    with _joined([worker]) as comms:
        comm = comms[0]
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        before = comm.next_sequence
        got: List[Any] = []
        with comm._numbering.lock:
            caller = threading.Thread(
                target=lambda: got.append(comm.all_reduce(x, timeout=30.0)))
            caller.start()
            caller.join(0.2)
            assert caller.is_alive()  # waiting for the lock, no number taken
        caller.join(CALL_TIMEOUT)
        assert not caller.is_alive()
        np.testing.assert_array_equal(got[0], x)
        assert got[0].shape == (2, 3)
        # The input as the output, then the next number.
        y = x.copy()
        assert comm.all_reduce(y, out=y) is y
        np.testing.assert_array_equal(y, x)
        assert comm.next_sequence == before + 2


@pytestmark_embedded
def test_embedded_async_burst_completes_in_issue_order(
        worker: chorus.EmbeddedWorker) -> None:
    with _joined([worker, worker]) as comms:
        def issue(comm: chorus.Communicator) -> List[np.ndarray]:
            # Every other call writes into an out= of its own, in place.
            outs = [np.full(2, -1, np.int64) if i % 2 else None
                    for i in range(50)]
            works = [comm.all_reduce(np.array([i, comm.rank], np.int64),
                                     out=outs[i], async_op=True)
                     for i in range(50)]
            got = [w.wait() for w in works]
            for out, result in zip(outs, got):
                assert out is None or result is out
            return got

        results = run_ranks([(lambda c=c: issue(c)) for c in comms])
        for outs in results:
            for i, out in enumerate(outs):
                np.testing.assert_array_equal(out, [2 * i, 1])


@pytestmark_embedded
def test_embedded_mismatch_names_every_rank(
        worker: chorus.EmbeddedWorker) -> None:
    with _joined([worker, worker]) as comms:
        errors = run_ranks([
            (lambda: comms[0].all_reduce(np.ones(3, np.float32))),
            (lambda: comms[1].all_reduce(np.ones(4, np.float32))),
        ], capture=True)
        for error in errors:
            assert isinstance(error, chorus.Error), error
            assert error.reason == "MISMATCH", error
            assert set(error.ranks) == {0, 1}
            assert error.number_used


@pytestmark_embedded
def test_embedded_missing_rank_deadline_names_it(
        worker: chorus.EmbeddedWorker, cluster: Cluster) -> None:
    with _joined([worker, cluster.address("w1")]) as comms:
        start = time.monotonic()
        with pytest.raises(chorus.DeadlineExceeded) as caught:
            comms[0].barrier(timeout=1.0)
        assert time.monotonic() - start < 30
        assert caught.value.missing_ranks == [1]
        # Started without blocking, on out=: the worker's verdict, naming
        # the rank, ends it (not this end giving up on the worker).
        out = np.full(1000, 5.0, np.float32)
        work = comms[0].all_reduce(np.ones(1000, np.float32), out=out,
                                   async_op=True, timeout=1.0)
        with pytest.raises(chorus.DeadlineExceeded) as caught:
            work.wait(timeout=30)
        assert caught.value.missing_ranks == [1]
        assert time.monotonic() - start < 30


@pytestmark_embedded
def test_join_embedded_bad_arguments_invalid(
        worker: chorus.EmbeddedWorker) -> None:
    with pytest.raises(chorus.InvalidArgument):
        chorus.join("g", 1, 0, worker=worker, coordinator=worker.coordinator)
    with pytest.raises(chorus.InvalidArgument):
        chorus.join("g", 1, 0, coordinator="")
    with pytest.raises(chorus.InvalidArgument,
                       match=r"EmbeddedWorker\(coordinator, tls_dir"):
        chorus.join("g", 1, 0, worker=worker, tls_dir="/nonexistent")
    with pytest.raises(chorus.InvalidArgument, match="directory path"):
        chorus.EmbeddedWorker(worker.coordinator, tls_dir=42)


@pytestmark_embedded
def test_embedded_worker_no_coordinator_deadline_exceeded() -> None:
    # A port that nothing listens on.
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    start = time.monotonic()
    with pytest.raises(chorus.DeadlineExceeded) as caught:
        chorus.EmbeddedWorker(f"127.0.0.1:{port}", register_timeout=1.0)
    assert time.monotonic() - start < 20
    assert f"127.0.0.1:{port}" in caught.value.message
    # In the words of this API, not of the daemon's flags.
    assert "register timeout of 1s" in caught.value.message
    assert "--register_timeout" not in caught.value.message


@pytestmark_embedded
def test_embedded_worker_bad_listen_invalid_argument(
        cluster: Cluster) -> None:
    with pytest.raises(chorus.InvalidArgument):
        chorus.EmbeddedWorker(cluster.coordinator.address, listen="nonsense")


@pytestmark_embedded
def test_closing_embedded_worker_ends_waiting_call(cluster: Cluster) -> None:
    w = chorus.EmbeddedWorker(cluster.coordinator.address)
    # Rank 1 joins through a daemon and never calls: rank 0's call waits.
    with _joined([w, cluster.address("w0")]) as comms:
        work = comms[0].all_reduce(np.ones(2, np.float32), async_op=True,
                                   timeout=CALL_TIMEOUT)
        closer = threading.Timer(0.5, w.close)
        closer.start()
        start = time.monotonic()
        with pytest.raises(chorus.Error) as caught:
            work.wait()
        closer.join()
        assert time.monotonic() - start < CALL_TIMEOUT / 2
        assert caught.value.code in (grpc.StatusCode.UNAVAILABLE,
                                     grpc.StatusCode.ABORTED,
                                     grpc.StatusCode.CANCELLED), caught.value
        # A blocking call after that fails at once, whichever way it goes.
        for call in (lambda: comms[0].barrier(timeout=CALL_TIMEOUT),
                     lambda: comms[0].all_reduce(np.ones(2, np.float32))):
            start = time.monotonic()
            with pytest.raises(chorus.Unavailable):
                call()
            assert time.monotonic() - start < CALL_TIMEOUT / 2


_RANK_PROGRAM = textwrap.dedent("""
    import sys
    import numpy as np
    import chorus
    coordinator, group, rank, rounds = sys.argv[1:5]
    comm = chorus.join(group, 2, int(rank), coordinator=coordinator,
                       timeout=60)
    print("joined", flush=True)
    for i in range(int(rounds)):
        out = comm.all_reduce(np.array([i, int(rank)], np.int64))
        assert out.tolist() == [2 * i, 1], out
    print("done", flush=True)
    sys.stdin.readline()  # held until the test says so (or kills it)
    comm.close()
""")


def _start_rank(cluster: Cluster, group: str, rank: int,
                rounds: int) -> "subprocess.Popen[str]":
    return subprocess.Popen(
        [sys.executable, "-c", _RANK_PROGRAM, cluster.coordinator.address,
         group, str(rank), str(rounds)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def _read_until(process: "subprocess.Popen[str]", word: str) -> str:
    seen = []
    assert process.stdout is not None
    for line in process.stdout:
        seen.append(line)
        if line.strip() == word:
            return "".join(seen)
    raise AssertionError(f"rank ended before {word!r}:\n{''.join(seen)}")


@pytestmark_embedded
def test_embedded_rank_processes_run_and_exit(cluster: Cluster) -> None:
    group = unique_group()
    ranks = [_start_rank(cluster, group, r, 200) for r in range(2)]
    try:
        for p in ranks:
            _read_until(p, "done")
        for p in ranks:
            p.communicate("\n", timeout=CALL_TIMEOUT)
            assert p.returncode == 0
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytestmark_embedded
def test_killed_embedded_rank_aborts_the_daemon_rank(tmp_path: Path) -> None:
    own = Cluster(tmp_path, workers=("keep",),
                  coordinator_flags=["--lease_timeout=2s"])
    group = unique_group()
    doomed = _start_rank(own, group, 1, 1)
    try:
        with chorus.join(group, 2, 0, worker=own.address("keep"),
                         timeout=CALL_TIMEOUT) as comm:
            comm.all_reduce(np.array([0, 0], np.int64))
            _read_until(doomed, "done")
            doomed.kill()
            doomed.wait()
            with pytest.raises(chorus.Aborted) as caught:
                comm.all_reduce(np.ones(4, np.float32), timeout=CALL_TIMEOUT)
            error = caught.value
            assert error.reason == "WORKER_LOST"
            assert error.lost_rank == 1 and error.lost_ranks == [1]
            assert error.lost_worker
    finally:
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait()
        own.stop()


def _u32_prefix(group: str, epoch: int, count: int = 1) -> bytes:
    """A serialized LocalCollectiveRequest with no sequence and no data:
    all_reduce u32[count] sum.
    """
    from chorus.v1 import types_pb2, worker_pb2
    return worker_pb2.LocalCollectiveRequest(
        group=group, rank=0, epoch=epoch,
        spec=types_pb2.CollectiveSpec(kind=types_pb2.COLLECTIVE_KIND_ALL_REDUCE,
                                      dtype=types_pb2.DTYPE_U32, count=count,
                                      op=types_pb2.REDUCE_OP_SUM)
    ).SerializeToString()


def _u32_fields(sequence: int, values: np.ndarray) -> bytes:
    """The sequence and data fields of a LocalCollectiveRequest, serialized
    (appended to a prefix, protobuf merges them in).
    """
    from chorus.v1 import worker_pb2
    return worker_pb2.LocalCollectiveRequest(
        sequence=sequence, data=values.tobytes()).SerializeToString()


def _u32_sum(group: str, epoch: int, sequence: int, value: int) -> bytes:
    """A serialized LocalCollectiveRequest: all_reduce u32[1] sum."""
    return _u32_prefix(group, epoch) + _u32_fields(
        sequence, np.array([value], np.uint32))


@pytestmark_embedded
def test_calls_run_into_in_place_writes_out_and_refuses_retries(
        worker: chorus.EmbeddedWorker) -> None:
    group = unique_group()
    invalid = grpc.StatusCode.INVALID_ARGUMENT.value[0]
    with chorus.join(group, 1, 0, worker=worker, timeout=CALL_TIMEOUT) as comm:
        calls = worker.calls()
        prefix = _u32_prefix(group, comm.epoch, 3)
        x = np.array([4, 5, 6], np.uint32)
        try:
            # Refused before taking a number: data in the request, an output
            # too small, an output that cannot be written.
            reply = calls.run_into(1, 10_000_000, _u32_sum(group, comm.epoch,
                                                           1, 7),
                                   1, np.ones(1, np.uint32),
                                   np.empty(1, np.uint32))
            assert reply[1] == invalid and "no data" in reply[2], reply
            small = np.full(2, 9, np.uint32)
            reply = calls.run_into(2, 10_000_000, prefix, 1, x, small)
            assert reply[1] == invalid and "room for 8" in reply[2], reply
            assert small.tolist() == [9, 9]
            frozen = np.empty(3, np.uint32)
            frozen.flags.writeable = False
            with pytest.raises((BufferError, ValueError)):  # numpy: ValueError
                calls.run_into(3, 10_000_000, prefix, 1, x, frozen)
            # #1 in place: the result lands in out.
            out = np.zeros(3, np.uint32)
            assert calls.run_into(4, 10_000_000, prefix, 1, x, out) is True
            assert out.tolist() == [4, 5, 6]  # world 1: the sum is x
            # Its retry is refused: no copy of its output was kept.
            reply = calls.run_into(5, 10_000_000, prefix, 1, x,
                                   np.empty(3, np.uint32))
            assert reply[1] == grpc.StatusCode.FAILED_PRECONDITION.value[0]
            assert "keeps no copy" in reply[2], reply
            # #2 through a message: its retry gets the kept result again.
            message = prefix + _u32_fields(2, x)
            for call_id in (6, 7):
                calls.send_call(call_id, 10_000_000, (message,))
                reply = calls.wait(call_id, 10.0, lambda r: True)
                assert reply is not None and reply[:2] == (call_id, 0), reply
                assert np.frombuffer(reply[4], np.uint32).tolist() == [4, 5, 6]
        finally:
            calls.close()


@pytestmark_embedded
def test_embedded_large_all_reduce_in_place_beside_a_daemon_rank(
        cluster: Cluster, worker: chorus.EmbeddedWorker) -> None:
    # Past the size where a daemon rank goes through shared memory, the
    # embedded ranks' blocking all_reduce runs on their arrays themselves.
    n = 1_000_003
    with _joined([worker, cluster.address("w0"), worker]) as comms:
        xs = [np.full(n, r + 1, np.float32) for r in range(3)]
        xs[0][-1] = 10
        fresh = run_ranks([(lambda c=c, x=x: c.all_reduce(x))
                           for c, x in zip(comms, xs)])
        want = np.full(n, 6, np.float32)
        want[-1] = 15
        for got in fresh:
            np.testing.assert_array_equal(got, want)
        # out=x: each rank's x becomes the sum.
        same = run_ranks([(lambda c=c, x=x: c.all_reduce(x, out=x))
                          for c, x in zip(comms, xs)])
        for got, x in zip(same, xs):
            assert got is x
            np.testing.assert_array_equal(x, want)
        assert comms[0].shared_memory == "untried"  # no copies into regions
        assert comms[1].shared_memory == "on"
        # A mismatch fails on every rank and leaves every out alone.
        outs = [np.full(n, -1, np.float32) for _ in range(3)]
        sizes = [n, n, n - 1]
        errors = run_ranks([
            (lambda c=c, o=o, k=k: _raised(
                lambda: c.all_reduce(np.ones(k, np.float32),
                                     out=o[:k])))
            for c, o, k in zip(comms, outs, sizes)])
        for error in errors:
            assert isinstance(error, chorus.InvalidArgument), error
        for out in outs:
            assert (out == -1).all()


@pytestmark_embedded
@pytest.mark.parametrize("async_op", [False, True],
                         ids=["blocking", "async"])
@pytest.mark.parametrize("kind", KINDS)
def test_embedded_every_collective_runs_in_place(
        cluster: Cluster, worker: chorus.EmbeddedWorker, kind: str,
        async_op: bool) -> None:
    # Calls of embedded ranks, blocking or not, read and write the arrays
    # themselves, beside a daemon rank that goes through messages and
    # shared memory.
    root = 1
    op = "sum" if kind in REDUCING else None
    with _joined([worker, cluster.address("w0"), worker]) as comms:
        for count, dtype in ((5, "f32"), (100_003, "bf16"), (70_001, "i64")):
            inputs = [rank_input(kind, dtype, "sum", 3, r, count)
                      for r in range(3)]
            wants = [expected(kind, inputs, dtype, "sum", root, r)
                     for r in range(3)]
            # Rank 2 passes out= where it gets a result.
            outs: List[Any] = [None, None, None]
            if wants[2] is not None:
                outs[2] = np.full(wants[2].shape, 7, storage(dtype))
            def call(r: int) -> Any:
                options: Dict[str, Any] = {}
                if outs[r] is not None:
                    options["out"] = outs[r]
                if async_op and r != 1:  # the daemon rank blocks
                    work = issue(comms[r], kind, inputs[r], dtype, op, root,
                                 async_op=True, **options)
                    return work.wait(timeout=CALL_TIMEOUT)
                return issue(comms[r], kind, inputs[r], dtype, op, root,
                             **options)

            got = run_ranks([(lambda r=r: call(r)) for r in range(3)])
            for r in range(3):
                if wants[r] is None:
                    assert got[r] is None, (kind, r)
                    continue
                check_close(got[r], wants[r], dtype, op)
            if outs[2] is not None:
                assert got[2] is outs[2]
        assert run_ranks([(lambda c=c: c.barrier(timeout=CALL_TIMEOUT))
                          for c in comms]) == [None, None, None]
        assert comms[0].shared_memory == "untried"  # no copies into regions
        assert comms[2].shared_memory == "untried"


def _raised(fn: Any) -> BaseException:
    """The exception fn() raises (fails the test when it raises none)."""
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - returned to the test
        return e
    raise AssertionError("no exception")


@pytestmark_embedded
def test_calls_here_skipped_number_refused_by_its_deadline(
        worker: chorus.EmbeddedWorker) -> None:
    group = unique_group()
    with chorus.join(group, 1, 0, worker=worker, timeout=CALL_TIMEOUT) as comm:
        calls = worker.calls()
        try:
            # Number 2 before 1, run on this thread: it waits for #1 here
            # and is refused at its deadline, not left hanging.
            prefix = _u32_prefix(group, comm.epoch)
            five, out = np.array([5], np.uint32), np.zeros(1, np.uint32)
            start = time.monotonic()
            reply = calls.run_into(7, 300_000, prefix, 2, five, out)
            assert time.monotonic() - start < 20
            assert reply is not True and reply[0] == 7
            assert reply[1] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
            assert "#1" in reply[2], reply
            # #1 then runs, here, with its result in out.
            assert calls.run_into(8, 10_000_000, prefix, 1, five, out) is True
            assert out.tolist() == [5]
        finally:
            calls.close()


@pytestmark_embedded
def test_calls_later_number_queued_earlier_run_here_both_answer(
        worker: chorus.EmbeddedWorker) -> None:
    group = unique_group()
    with chorus.join(group, 1, 0, worker=worker, timeout=CALL_TIMEOUT) as comm:
        calls = worker.calls()
        try:
            # #2 sent without waiting waits for its number; #1 run here
            # ends first, then #2's reply comes through the queue.
            calls.send_call(2, 10_000_000, (_u32_sum(group, comm.epoch, 2, 3),))
            out = np.zeros(1, np.uint32)
            assert calls.run_into(1, 10_000_000, _u32_prefix(group, comm.epoch),
                                  1, np.array([4], np.uint32), out) is True
            assert out.tolist() == [4]
            other = calls.wait(2, 10.0, lambda r: True)
            assert other is not None and other[:2] == (2, 0), other
            assert np.frombuffer(other[4], np.uint32).tolist() == [3]
        finally:
            calls.close()
        # The channel is closed: sending fails, waiting ends.
        with pytest.raises(OSError):
            calls.send_call(3, 1000, (b"",))
        assert calls.wait(3, 1.0, lambda r: True) is False


_FORK_PROGRAM = textwrap.dedent("""
    import os, sys
    import numpy as np
    import chorus
    from chorus import embedded
    coordinator, group = sys.argv[1:3]
    comm = chorus.join(group, 1, 0, coordinator=coordinator, timeout=60)
    parent = embedded.shared_worker(coordinator)
    spare = chorus.EmbeddedWorker(coordinator)
    pid = os.fork()
    if pid == 0:
        # The child has none of the runtimes' threads: the parent's workers
        # are closed here, their channels refuse, and closing or dropping
        # them neither waits for those threads nor removes the parent's
        # sockets. (The child leaves with os._exit, as multiprocessing's
        # do: Python's gRPC channels are not fork-safe.)
        assert parent.closed and spare.closed
        assert coordinator not in embedded._shared  # a child starts its own
        try:
            comm._calls._conn.send_call(99, 1000, (b"",))
        except OSError as e:
            print("child refused:", e, flush=True)
        parent.close()
        spare.close()
        dropped, spare._worker = spare._worker, None
        del dropped  # the last reference: deallocated here
        print("child done", flush=True)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    for worker in (parent, spare):
        assert os.path.exists(worker.target[len("unix:"):])
    out = comm.all_reduce(np.array([2, 3], np.int64))
    assert out.tolist() == [2, 3], out
    spare.close()
    print("parent ok", flush=True)
    comm.close()
""")


@pytestmark_embedded
def test_fork_of_embedded_rank_leaves_parent_worker_alone(
        cluster: Cluster) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _FORK_PROGRAM, cluster.coordinator.address,
         unique_group()],
        capture_output=True, text=True, timeout=CALL_TIMEOUT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "child refused:" in done.stdout and "fork" in done.stdout
    assert "child done" in done.stdout and "parent ok" in done.stdout


_TLS_PROGRAM = textwrap.dedent("""
    import sys
    import numpy as np
    import chorus
    coordinator, certs, group = sys.argv[1:4]

    def outcome(fn):
        try:
            fn()
        except chorus.Error as e:
            return f"{type(e).__name__}: {e.message}"
        return "ok"

    # TLS is process-wide: what may go on first, and what may not after.
    print("client cert:", outcome(lambda: chorus.EmbeddedWorker(
        coordinator, tls_dir=f"{certs}/client-app")), flush=True)
    print("plaintext:", outcome(lambda: chorus.EmbeddedWorker(
        coordinator, register_timeout=1)), flush=True)
    with chorus.EmbeddedWorker(coordinator,
                               tls_dir=f"{certs}/worker-emb") as worker:
        print("name:", worker.name, flush=True)
        print("plaintext after:", outcome(lambda: chorus.EmbeddedWorker(
            coordinator, register_timeout=1)), flush=True)
        print("other files:", outcome(lambda: chorus.EmbeddedWorker(
            coordinator, tls_dir=f"{certs}/worker-w0")), flush=True)
        with chorus.join(group, 2, 0, worker=worker, timeout=60) as comm:
            big = comm.all_reduce(np.full(300_000, 1, np.float32),
                                  algorithm="ring")
            small = comm.all_reduce(np.array([1, 2], np.int64))
            print("sums:", float(big.min()), float(big.max()),
                  small.tolist(), flush=True)
""")


@pytestmark_embedded
def test_embedded_worker_with_tls_dir_joins_a_tls_cluster(
        tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs", workers=("w0", "emb"))
    sockets = short_temp_dir()
    cluster = Cluster(tmp_path / "cluster", workers=(), tls_dir=certs)
    try:
        daemon = cluster.add_worker("w0",
                                    local_socket=str(sockets / "w0.sock"))
        group = unique_group()
        program = subprocess.Popen(
            [sys.executable, "-c", _TLS_PROGRAM, cluster.coordinator.address,
             str(certs), group],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        try:
            # Rank 1 through the daemon: the ring between the two data
            # planes goes over TLS.
            with chorus.join(group, 2, 1, worker="unix:" + daemon.local_socket,
                             timeout=CALL_TIMEOUT) as comm:
                big = comm.all_reduce(np.full(300_000, 2, np.float32),
                                      algorithm="ring")
                np.testing.assert_array_equal(big, np.full(300_000, 3))
                small = comm.all_reduce(np.array([10, 20], np.int64))
                assert small.tolist() == [11, 22]
            output, _ = program.communicate(timeout=CALL_TIMEOUT)
        finally:
            program.kill()
            program.wait()
        assert program.returncode == 0, output
        lines = dict(line.split(": ", 1) for line in output.splitlines()
                     if ": " in line)
        assert lines["client cert"].startswith("InvalidArgument"), output
        assert "chorus://client/app" in lines["client cert"], output
        # The coordinator requires TLS: a plaintext worker is not let in,
        # and is told what to give.
        assert lines["plaintext"].startswith("FailedPrecondition"), output
        assert "uses mutual TLS" in lines["plaintext"], output
        assert "tls_dir=" in lines["plaintext"], output
        assert lines["name"] == "emb", output
        assert lines["plaintext after"].startswith("FailedPrecondition"), output
        assert "tls_dir" in lines["plaintext after"], output
        assert lines["other files"].startswith("FailedPrecondition"), output
        assert lines["sums"] == "3.0 3.0 [11, 22]", output
    finally:
        cluster.stop()
        shutil.rmtree(sockets, ignore_errors=True)
