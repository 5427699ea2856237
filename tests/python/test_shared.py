"""Collectives through memory shared with the worker daemon.

The daemon makes a sealed memfd (WorkerLocal.OpenSharedRegion) that the
client maps through /proc; a call names byte ranges of regions for its input
and output (shared_input/shared_output) and no tensor bytes cross gRPC.
These tests run real daemons on 127.0.0.1, as the same user as the tests,
so the client can map the daemons' regions.
"""

import gc
import os
from typing import Any, Iterator, List

import grpc
import numpy as np
import pytest

import chorus
from chorus.v1 import types_pb2, worker_pb2, worker_pb2_grpc
from conftest import CALL_TIMEOUT, join_all, run_ranks, unique_group
from numpy_reference import (KINDS, check_close, check_ramp_sums, expected,
                             ramp, rank_input)
from test_collectives import issue

MIB = 2 ** 20
WORLD = 3


@pytest.mark.parametrize("kind", KINDS)
def test_collective_through_shared_memory_matches_numpy(
        trio: Any, kind: str) -> None:
    count = 50_000  # 200 KB of i32 per block: over the shared threshold
    root = 1
    inputs = [rank_input(kind, "i32", "sum", WORLD, r, count)
              for r in range(WORLD)]
    results = run_ranks([
        (lambda r=r: issue(trio[r], kind, inputs[r], "i32", "sum", root))
        for r in range(WORLD)])
    for r in range(WORLD):
        want = expected(kind, inputs, "i32", "sum", root, r)
        if want is None:
            assert results[r] is None, f"rank {r} of {kind} got data"
        else:
            check_close(results[r], want, "i32", "sum")
        assert trio[r].shared_memory == "on"


def test_all_reduce_of_256_mib_per_rank_on_three_ranks(trio: Any) -> None:
    count = 256 * MIB // 4
    inputs = [ramp(count, r) for r in range(3)]
    got = run_ranks([
        (lambda r=r: trio[r].all_reduce(inputs[r], timeout=CALL_TIMEOUT))
        for r in range(3)])
    inputs.clear()
    check_ramp_sums(got, count, 3)
    for r in range(3):
        assert trio[r].shared_memory == "on"


@pytest.mark.parametrize("algorithm", ["same_host", "ring"])
def test_shared_array_in_place_is_written_by_the_daemon(
        pair: Any, algorithm: str) -> None:
    # same_host writes the result into the array itself; the ring writes
    # it through the daemon's buffer, then into the array.
    count = 1 << 20
    arrays = [comm.shared_array((count,), "f32") for comm in pair]
    for r, x in enumerate(arrays):
        x[...] = ramp(count, r)
    got = run_ranks([
        (lambda r=r: pair[r].all_reduce(arrays[r], out=arrays[r],
                                        algorithm=algorithm))
        for r in range(2)])
    want = ramp(count, 0) + ramp(count, 1)
    for r in range(2):
        assert got[r] is arrays[r]
        assert np.array_equal(arrays[r], want)


def test_shared_array_released_once_garbage(pair: Any) -> None:
    comm = pair[0]
    x = comm.shared_array(1000, "i32")
    region, _ = comm._shared.locate(x)
    view = x[10:20]
    del x
    gc.collect()
    assert comm._shared.locate(view) == (region, 40)  # a view keeps it
    del view
    gc.collect()
    # The next shared_array() releases it on the daemon first.
    y = comm.shared_array(10, "i32")
    stub = worker_pb2_grpc.WorkerLocalStub(comm._channel)
    with pytest.raises(grpc.RpcError) as gone:
        stub.ReleaseSharedRegion(worker_pb2.SharedRegionRelease(
            group=comm.group, epoch=comm.epoch, rank=comm.rank,
            region=region), timeout=CALL_TIMEOUT)
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND
    assert comm._shared.locate(y) is not None


def test_shared_array_as_input_with_a_plain_output(pair: Any) -> None:
    count = 300_000
    inputs = [pair[r].shared_array(count, np.int64) for r in range(2)]
    for r, x in enumerate(inputs):
        x[...] = np.arange(count, dtype=np.int64) * (r + 1)
    outs = [np.zeros((2, count), np.int64), None]
    got = run_ranks([
        (lambda r=r: pair[r].all_gather(inputs[r], out=outs[r]))
        for r in range(2)])
    want = np.stack([np.arange(count, dtype=np.int64) * (r + 1)
                     for r in range(2)])
    assert got[0] is outs[0]
    for result in got:
        assert np.array_equal(result, want)
    # The input is untouched by a call whose output went elsewhere.
    assert np.array_equal(inputs[1], want[1])


def test_async_calls_in_flight_together_each_get_their_own_region(
        pair: Any) -> None:
    count = 100_000
    works = [[comm.all_reduce(np.full(count, k + r, np.float32),
                              async_op=True, timeout=CALL_TIMEOUT)
              for k in range(6)] for r, comm in enumerate(pair)]
    for r in range(2):
        for k, work in enumerate(works[r]):
            assert np.array_equal(work.result(),
                                  np.full(count, 2 * k + 1, np.float32))
            assert work.sequence == k + 1


def test_daemon_without_shared_memory_streams_instead(
        cluster: Any) -> None:
    cluster.add_worker("noshm", ["--max_shared_bytes=0"])
    comms = join_all([cluster.address("noshm"), cluster.address("w0")])
    try:
        count = 5 * MIB // 4  # over the stream threshold too
        got = run_ranks([
            (lambda r=r: comms[r].all_reduce(np.full(count, r + 1,
                                                     np.float32)))
            for r in range(2)])
        for result in got:
            assert np.array_equal(result, np.full(count, 3, np.float32))
        assert "max_shared_bytes=0" in comms[0].shared_memory
        assert comms[1].shared_memory == "on"
        # shared_array() falls back to an ordinary array there.
        plain = comms[0].shared_array(4, "f64")
        assert plain.shape == (4,) and plain.dtype == np.float64
    finally:
        for comm in comms:
            comm.close()


def test_shared_memory_off_by_the_caller_is_not_tried(cluster: Any) -> None:
    comms = join_all([cluster.address("w0")], shared_memory=False)
    try:
        x = np.arange(1 << 16, dtype=np.float64)
        assert np.array_equal(comms[0].all_reduce(x), x)
        assert comms[0].shared_memory == "turned off (shared_memory=False)"
    finally:
        comms[0].close()


# --- the protocol, as any gRPC client sees it ---------------------------------


class _Rank:
    """One rank of a world-1 group joined through raw stubs, held open."""

    def __init__(self, address: str) -> None:
        self.group = unique_group("raw")
        self.channel = grpc.insecure_channel(address)
        self.stub = worker_pb2_grpc.WorkerLocalStub(self.channel)
        joined = self.stub.JoinGroup(worker_pb2.LocalJoinRequest(
            group=self.group, world_size=1, rank=0), timeout=CALL_TIMEOUT)
        self.epoch = joined.epoch

    def open(self, nbytes: int) -> Any:
        return self.stub.OpenSharedRegion(worker_pb2.SharedRegionRequest(
            group=self.group, epoch=self.epoch, rank=0, bytes=nbytes),
            timeout=CALL_TIMEOUT)

    def map(self, region: Any) -> np.ndarray:
        fd = os.open(f"/proc/{region.pid}/fd/{region.fd}", os.O_RDWR)
        try:
            assert os.readlink(f"/proc/self/fd/{fd}") == \
                f"/memfd:{region.name} (deleted)"
            import mmap
            mapping = mmap.mmap(fd, region.bytes)
        finally:
            os.close(fd)
        return np.frombuffer(mapping, np.uint8)

    def all_reduce(self, sequence: int, count: int, **fields: Any) -> Any:
        request = worker_pb2.LocalCollectiveRequest(
            group=self.group, rank=0, epoch=self.epoch, sequence=sequence,
            spec=types_pb2.CollectiveSpec(
                kind=types_pb2.COLLECTIVE_KIND_ALL_REDUCE,
                dtype=types_pb2.DTYPE_F32, count=count,
                op=types_pb2.REDUCE_OP_SUM), **fields)
        return self.stub.Collective(request, timeout=CALL_TIMEOUT)


@pytest.fixture
def raw(cluster: Any) -> Iterator[_Rank]:
    rank = _Rank(cluster.address("w0"))
    yield rank
    rank.channel.close()


def _buffer(region: Any, offset: int, nbytes: int) -> Any:
    return worker_pb2.SharedBuffer(region=region.region, offset=offset,
                                   bytes=nbytes)


def test_raw_call_reads_and_writes_in_place_and_its_retry_rewrites(
        raw: _Rank) -> None:
    region = raw.open(1 << 16)
    memory = raw.map(region)
    values = memory[:4096].view(np.float32)
    values[...] = np.arange(1024, dtype=np.float32)
    shared = dict(shared_input=_buffer(region, 0, 4096),
                  shared_output=_buffer(region, 8192, 4096))
    reply = raw.all_reduce(1, 1024, **shared)
    assert reply.data == b"" and reply.sequence == 1
    out = memory[8192:8192 + 4096].view(np.float32)
    assert np.array_equal(out, np.arange(1024, dtype=np.float32))
    # The reply was "lost": a retry runs nothing again; one naming another
    # place for its output gets the first attempt's output copied there.
    elsewhere = dict(shared_input=_buffer(region, 0, 4096),
                     shared_output=_buffer(region, 16384, 4096))
    assert raw.all_reduce(1, 1024, **elsewhere).sequence == 1
    copy = memory[16384:16384 + 4096].view(np.float32)
    assert np.array_equal(copy, np.arange(1024, dtype=np.float32))
    # And through the unary path, in the reply.
    assert raw.all_reduce(1, 1024, shared_input=None, shared_output=None,
                          data=values.tobytes()).data == values.tobytes()
    # In place: the output over its own input.
    in_place = dict(shared_input=_buffer(region, 0, 4096),
                    shared_output=_buffer(region, 0, 4096))
    raw.all_reduce(2, 1024, **in_place)
    assert np.array_equal(values, np.arange(1024, dtype=np.float32))


def _code_of(call: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def test_raw_bad_shared_requests_are_refused_and_take_no_number(
        raw: _Rank) -> None:
    region = raw.open(8192)
    good_in, good_out = _buffer(region, 0, 4096), _buffer(region, 4096, 4096)
    cases: List[Any] = [
        (grpc.StatusCode.FAILED_PRECONDITION, "holds no shared region",
         dict(shared_input=worker_pb2.SharedBuffer(region=999, bytes=4096),
              shared_output=good_out)),
        (grpc.StatusCode.INVALID_ARGUMENT, "goes past the end",
         dict(shared_input=_buffer(region, 8000, 4096),
              shared_output=good_out)),
        (grpc.StatusCode.INVALID_ARGUMENT, "goes past the end",
         dict(shared_input=good_in,
              shared_output=_buffer(region, 2 ** 64 - 1, 2))),
        (grpc.StatusCode.INVALID_ARGUMENT, "has room for 4000 bytes",
         dict(shared_input=good_in, shared_output=_buffer(region, 0, 4000))),
        (grpc.StatusCode.INVALID_ARGUMENT, "sets both",
         dict(shared_input=good_in)),
        (grpc.StatusCode.INVALID_ARGUMENT, "carries no data",
         dict(shared_input=good_in, shared_output=good_out,
              data=b"\0" * 4096)),
        (grpc.StatusCode.INVALID_ARGUMENT, "4092",  # input size vs count
         dict(shared_input=_buffer(region, 0, 4092),
              shared_output=good_out)),
    ]
    for code, words, fields in cases:
        error = _code_of(lambda: raw.all_reduce(1, 1024, **fields))
        assert error.code() == code, (fields, error.details())
        assert words in error.details(), error.details()
    # None of them used number 1.
    assert raw.all_reduce(1, 1024, shared_input=good_in,
                          shared_output=good_out).sequence == 1


def test_raw_chunked_call_naming_shared_memory_is_refused(
        raw: _Rank) -> None:
    region = raw.open(8192)
    call = worker_pb2.LocalCollectiveRequest(
        group=raw.group, rank=0, epoch=raw.epoch, sequence=1,
        spec=types_pb2.CollectiveSpec(
            kind=types_pb2.COLLECTIVE_KIND_ALL_REDUCE,
            dtype=types_pb2.DTYPE_F32, count=1024,
            op=types_pb2.REDUCE_OP_SUM),
        shared_input=_buffer(region, 0, 4096),
        shared_output=_buffer(region, 4096, 4096))
    header = worker_pb2.LocalChunkedRequest(
        header=worker_pb2.LocalChunkedHeader(call=call, input_bytes=4096))
    error = _code_of(lambda: list(raw.stub.CollectiveChunked(
        iter([header]), timeout=CALL_TIMEOUT)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "are for Collective" in error.details()


def test_raw_region_requests_are_checked(raw: _Rank, cluster: Any) -> None:
    error = _code_of(lambda: raw.open(0))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    error = _code_of(lambda: raw.open(1 << 62))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max_shared_bytes" in error.details()
    error = _code_of(lambda: raw.stub.OpenSharedRegion(
        worker_pb2.SharedRegionRequest(group=raw.group, epoch=raw.epoch + 1,
                                       rank=0, bytes=10),
        timeout=CALL_TIMEOUT))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    region = raw.open(4096)
    link = f"/proc/{region.pid}/fd/{region.fd}"
    assert os.readlink(link) == f"/memfd:{region.name} (deleted)"
    raw.stub.ReleaseSharedRegion(worker_pb2.SharedRegionRelease(
        group=raw.group, epoch=raw.epoch, rank=0, region=region.region),
        timeout=CALL_TIMEOUT)
    # Released and unused: the daemon closed it before answering.
    try:
        assert os.readlink(link) != f"/memfd:{region.name} (deleted)"
    except FileNotFoundError:
        pass
    error = _code_of(lambda: raw.stub.ReleaseSharedRegion(
        worker_pb2.SharedRegionRelease(group=raw.group, epoch=raw.epoch,
                                       rank=0, region=region.region),
        timeout=CALL_TIMEOUT))
    assert error.code() == grpc.StatusCode.NOT_FOUND
