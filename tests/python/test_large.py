"""Tensors over gRPC's 64 MiB message limit through the Python client.

Calls whose request or reply would be over chorus.STREAM_THRESHOLD_BYTES go
through the daemon's CollectiveChunked stream in pieces when they do not go
through shared memory; these tests turn shared memory off (test_shared.py
covers it), run such calls on real daemons and check the results against
numpy.
"""

import time
from typing import Any, Iterator, List

import numpy as np
import pytest

import chorus
from conftest import CALL_TIMEOUT, Cluster, join_all, run_ranks
from numpy_reference import check_ramp_sums, ramp

MIB = 2 ** 20


@pytest.fixture(scope="module")
def trio(cluster: Cluster) -> Iterator[List[chorus.Communicator]]:
    """Three streaming ranks: ranks 0 and 2 on w0, rank 1 on w1."""
    w0, w1 = cluster.address("w0"), cluster.address("w1")
    comms = join_all([w0, w1, w0], shared_memory=False)
    yield comms
    for comm in comms:
        comm.close()


@pytest.fixture
def pair(cluster: Cluster) -> Iterator[List[chorus.Communicator]]:
    """Two streaming ranks of a fresh group: rank 0 on w0, rank 1 on w1."""
    comms = join_all([cluster.address("w0"), cluster.address("w1")],
                     shared_memory=False)
    yield comms
    for comm in comms:
        comm.close()


def test_all_reduce_of_256_mib_per_rank_on_three_ranks(trio: Any) -> None:
    count = 256 * MIB // 4
    inputs = [ramp(count, r) for r in range(3)]
    start = time.monotonic()
    got = run_ranks([
        (lambda r=r: trio[r].all_reduce(inputs[r], timeout=CALL_TIMEOUT))
        for r in range(3)])
    elapsed = time.monotonic() - start
    inputs.clear()  # the results are what the checks need
    print(f"all_reduce f32 256 MiB x 3 ranks: {elapsed:.2f} s")
    check_ramp_sums(got, count, 3)


def test_all_gather_with_a_result_over_64_mib(pair: Any) -> None:
    count = 36 * MIB // 4  # 36 MiB in, 72 MiB out on 2 ranks
    inputs = [np.arange(count, dtype=np.uint32) ^ np.uint32((r + 1) << 28)
              for r in range(2)]
    out = np.zeros((2, count), np.uint32)
    got = run_ranks([
        (lambda: pair[0].all_gather(inputs[0], out=out,
                                    timeout=CALL_TIMEOUT)),
        (lambda: pair[1].all_gather(inputs[1], timeout=CALL_TIMEOUT)),
    ])
    assert got[0] is out
    want = np.stack(inputs)
    for result in got:
        assert result.shape == (2, count)
        assert np.array_equal(result, want)


def test_streamed_calls_in_flight_together_match_in_order(
        pair: Any) -> None:
    # Over the threshold, so each goes through the stream.
    count = chorus.STREAM_THRESHOLD_BYTES // 4 + 1
    works = [[comm.all_reduce(np.full(count, k + r, np.float32),
                              async_op=True, timeout=CALL_TIMEOUT)
              for k in range(3)] for r, comm in enumerate(pair)]
    for r in range(2):
        for k, work in enumerate(works[r]):
            assert np.array_equal(work.result(),
                                  np.full(count, 2 * k + 1, np.float32))
            assert work.sequence == k + 1
