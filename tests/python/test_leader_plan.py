"""The leader plan from Python: worker daemons under a coordinator run with
--leader_calls. Small calls report the plan "leader" and give the same
results and errors as under the coordinator: the mismatch account on every
rank, a missing rank named at the deadline; forcing the plan is refused.
"""

from typing import Any, Iterator, List

import numpy as np
import pytest

import chorus
from conftest import (CALL_TIMEOUT, Cluster, call_with_a_rank_missing,
                      join_all, run_ranks)

# Short enough to keep the suite quick, long enough for the coordinator's
# verdict to arrive before it.
SHORT = 3.0


@pytest.fixture(scope="module")
def leader_cluster(tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[Cluster]:
    """A coordinator with --leader_calls and workers w0 and w1; ranks wait
    for each other at the leader as long as a loaded machine may need."""
    cluster = Cluster(tmp_path_factory.mktemp("leader"),
                      coordinator_flags=["--leader_calls",
                                         "--leader_patience=10s"])
    yield cluster
    cluster.stop()


@pytest.fixture
def leader_pair(leader_cluster: Cluster) -> Iterator[List[Any]]:
    """Two ranks of a fresh group: rank 0 on w0, rank 1 on w1."""
    comms = join_all([leader_cluster.address("w0"),
                      leader_cluster.address("w1")])
    yield comms
    for comm in comms:
        comm.close()


def test_small_calls_run_at_the_leader(leader_pair: List[Any]) -> None:
    works = run_ranks([
        (lambda r=r: leader_pair[r].all_reduce(
            np.full(5, r + 1, np.int32), async_op=True))
        for r in range(2)])
    for work in works:
        np.testing.assert_array_equal(work.result(timeout=CALL_TIMEOUT),
                                      [3] * 5)
        assert work.algorithm == "leader"
    gathered = run_ranks([
        (lambda r=r: leader_pair[r].all_gather(
            np.array([r, r], np.float64), async_op=True))
        for r in range(2)])
    for work in gathered:
        got = np.asarray(work.result(timeout=CALL_TIMEOUT)).reshape(-1)
        np.testing.assert_array_equal(got, [0, 0, 1, 1])
        assert work.algorithm == "leader"


def test_mismatch_at_the_leader_gives_every_rank_the_account(
        leader_pair: List[Any]) -> None:
    sequence = leader_pair[0].next_sequence
    errors = run_ranks([
        lambda: leader_pair[0].all_reduce(np.zeros(3, np.float32)),
        lambda: leader_pair[1].all_reduce(np.zeros(2, np.float32)),
    ], capture=True)
    for error in errors:
        assert isinstance(error, chorus.InvalidArgument), error
        assert error.ranks == {0: "all_reduce f32[3] sum",
                               1: "all_reduce f32[2] sum"}
        assert error.reason == "MISMATCH"
        assert error.sequence == sequence
        assert error.number_used is True
    got = run_ranks([(lambda c=c: c.all_reduce(np.ones(2, np.int32)))
                     for c in leader_pair])
    for g in got:
        np.testing.assert_array_equal(g, [2, 2])


def test_missing_rank_is_named_at_the_deadline(
        leader_cluster: Cluster) -> None:
    errors, _ = call_with_a_rank_missing(leader_cluster, SHORT)
    for error in errors:
        assert isinstance(error, chorus.DeadlineExceeded), error
        assert error.missing_ranks == [2]
        assert error.reason == "RANKS_MISSING"


def test_forcing_the_leader_plan_is_refused(leader_pair: List[Any]) -> None:
    with pytest.raises(chorus.InvalidArgument):
        leader_pair[0].all_reduce(np.ones(2, np.float32), algorithm="leader")
