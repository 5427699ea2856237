"""Asynchronous collectives: many in flight at once, matched in issue order."""

import concurrent.futures
from typing import Any, List

import numpy as np

import chorus
from conftest import CALL_TIMEOUT, join_all, run_ranks

BURST = 50


def _burst(comm: chorus.Communicator) -> List[chorus.Work]:
    """Issues BURST collectives of several kinds without waiting."""
    r = comm.rank
    works = []
    for i in range(BURST):
        if i % 5 == 0:
            works.append(comm.all_reduce(np.full(3, i + r, np.float32),
                                         async_op=True))
        elif i % 5 == 1:
            works.append(comm.all_gather(np.array([i, r], np.int32),
                                         async_op=True))
        elif i % 5 == 2:
            x = np.arange(4, dtype=np.float64) * i
            works.append(comm.broadcast(x if r == 1 else None, root=1,
                                        shape=4, dtype="f64",
                                        async_op=True))
        elif i % 5 == 3:
            # Larger than the inline limit and forced onto the ring, so
            # data-plane calls are in flight next to inline ones.
            works.append(comm.all_reduce(np.full(20_000, i, np.int64),
                                         algorithm="ring", async_op=True))
        else:
            works.append(comm.barrier(async_op=True))
    return works


def test_burst_of_calls_in_flight(pair: Any) -> None:
    first = [c.next_sequence for c in pair]
    bursts = run_ranks([lambda c=c: _burst(c) for c in pair])
    for r, works in enumerate(bursts):
        assert [w.sequence for w in works] == list(
            range(first[r], first[r] + BURST))
        for i, work in enumerate(works):
            got = work.result(timeout=CALL_TIMEOUT)
            if i % 5 == 0:
                np.testing.assert_array_equal(
                    got, np.full(3, 2 * i + 1, np.float32))
            elif i % 5 == 1:
                np.testing.assert_array_equal(
                    got, np.array([[i, 0], [i, 1]], np.int32))
            elif i % 5 == 2:
                np.testing.assert_array_equal(
                    got, np.arange(4, dtype=np.float64) * i)
            elif i % 5 == 3:
                np.testing.assert_array_equal(
                    got, np.full(20_000, 2 * i, np.int64))
                assert work.algorithm == "ring"
            else:
                assert got is None
    assert [c.next_sequence for c in pair] == [f + BURST for f in first]


def test_async_on_one_rank_blocking_on_the_other(pair: Any) -> None:
    def asynchronous() -> List[Any]:
        works = [pair[0].all_reduce(np.array([i], np.uint64), async_op=True)
                 for i in range(10)]
        done, _ = concurrent.futures.wait(works, timeout=CALL_TIMEOUT)
        assert len(done) == 10
        return [w.result() for w in works]

    def blocking() -> List[Any]:
        return [pair[1].all_reduce(np.array([10 * i], np.uint64))
                for i in range(10)]

    got0, got1 = run_ranks([asynchronous, blocking])
    for i in range(10):
        assert got0[i][0] == got1[i][0] == 11 * i


def test_calls_from_many_threads_of_one_rank(cluster: Any) -> None:
    # A group of one rank: calls issued from several threads at once each
    # take their own number and come back with their own data.
    (comm,) = join_all([cluster.address("w0")])
    with comm:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(
                lambda i: comm.all_gather(np.array([i], np.int8))[0, 0],
                range(64)))
        assert results == list(range(64))
        assert comm.next_sequence == 65


def test_work_is_a_future_that_cannot_be_cancelled(pair: Any) -> None:
    works = run_ranks([
        (lambda c=c: c.all_reduce(np.ones(2, np.float32), async_op=True))
        for c in pair])
    for work in works:
        assert isinstance(work, concurrent.futures.Future)
        assert not work.cancel()
        np.testing.assert_array_equal(work.wait(CALL_TIMEOUT),
                                      np.full(2, 2, np.float32))
        assert work.done() and work.exception() is None


def test_close_waits_for_calls_in_flight(cluster: Any) -> None:
    comms = join_all([cluster.address("w0"), cluster.address("w1")])
    early = comms[0].all_reduce(np.ones(1, np.float32), async_op=True)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        # Rank 0 closes while its call waits for rank 1; the call still
        # ends, and close() returns after it.
        closer = pool.submit(comms[0].close)
        late = comms[1].all_reduce(np.ones(1, np.float32), async_op=True)
        np.testing.assert_array_equal(early.result(CALL_TIMEOUT), [2.0])
        np.testing.assert_array_equal(late.result(CALL_TIMEOUT), [2.0])
        closer.result(timeout=CALL_TIMEOUT)
    comms[1].close()
    try:
        comms[0].barrier()
    except chorus.InvalidArgument as e:
        assert "closed" in e.message
    else:
        raise AssertionError("a closed communicator ran a call")
