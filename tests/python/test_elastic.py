"""Elastic groups through real daemons: a rank whose process is killed
(kill -9) leaves, and the survivors get MembershipChanged, already moved to
the new epoch, and redo the step; a rank that leaves cleanly likewise; a
newcomer joins without a rank and a sync() of the members admits it.
"""

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, List

import grpc
import numpy as np
import pytest

import chorus
from chorus.v1 import coordinator_pb2, coordinator_pb2_grpc
from conftest import CALL_TIMEOUT, Cluster, run_ranks, unique_group

# A rank in a process of its own: joins, says so, then all-reduces until it
# is killed.
_RANK_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import chorus
    group, world, rank, worker = sys.argv[1], int(sys.argv[2]), \\
        int(sys.argv[3]), sys.argv[4]
    # "coordinator=HOST:PORT": the rank embeds the worker runtime.
    where = ({"coordinator": worker.split("=", 1)[1]}
             if worker.startswith("coordinator=") else {"worker": worker})
    comm = chorus.join(group, world, rank, min_world_size=int(sys.argv[5]),
                       timeout=60, **where)
    print("joined", flush=True)
    comm.all_reduce(np.ones(4, np.float32))
    print("stepped", flush=True)
    sys.stdin.read()  # until killed
""")


def _rank_process(group: str, world: int, rank: int, worker: str,
                  minimum: int) -> "subprocess.Popen[str]":
    return subprocess.Popen(
        [sys.executable, "-c", _RANK_SCRIPT, group, str(world), str(rank),
         worker, str(minimum)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _join_elastic(cluster: Cluster, group: str, world: int,
                  ranks: List[int], minimum: int) -> List[Any]:
    """Joins `ranks` of `group` on this process's threads, alternating w0
    and w1.
    """
    workers = [cluster.address("w0"), cluster.address("w1")]
    return run_ranks([
        (lambda r=r: chorus.join(group, world, r, worker=workers[r % 2],
                                 min_world_size=minimum,
                                 timeout=CALL_TIMEOUT))
        for r in ranks])


def _all_reduce(comms: List[Any]) -> List[Any]:
    """Every rank all-reduces ones; returns each rank's result or error."""
    return run_ranks([
        (lambda c=c: c.all_reduce(np.ones(4, np.float32)))
        for c in comms], capture=True)


def test_killed_rank_survivors_get_membership_changed_and_go_on(
        cluster: Cluster) -> None:
    group = unique_group("elastic")
    victim = _rank_process(group, 3, 2, cluster.address("w1"), 2)
    try:
        comms = _join_elastic(cluster, group, 3, [0, 1], 2)
        assert victim.stdout is not None
        assert victim.stdout.readline() == "joined\n"
        first = _all_reduce(comms)
        assert victim.stdout.readline() == "stepped\n"
        for got in first:
            np.testing.assert_array_equal(got, [3.0] * 4)
        old_epoch = comms[0].epoch
        killed_at = time.monotonic()
        victim.kill()
        victim.wait()
        second = _all_reduce(comms)
        seen = time.monotonic() - killed_at
        for rank, error in enumerate(second):
            assert isinstance(error, chorus.MembershipChanged), error
            assert isinstance(error, chorus.Aborted)
            assert error.left == [2] and error.joined == []
            assert error.world_size == 2 and error.rank == rank
            assert error.epoch == comms[rank].epoch != old_epoch
        # Every survivor holds it within a second of the kill (the daemon
        # sees the rank's hold end and reports it at once).
        assert seen < 1.0, seen
        retried = _all_reduce(comms)
        for got in retried:
            np.testing.assert_array_equal(got, [2.0] * 4)
        assert [c.rank for c in comms] == [0, 1]
        assert [c.world_size for c in comms] == [2, 2]
        for comm in comms:
            comm.close()
    finally:
        if victim.poll() is None:
            victim.kill()


@pytest.mark.skipif(not chorus.embedded.available(),
                    reason="chorus._embedded is not installed")
def test_killed_embedded_rank_survivors_told_within_the_lease(
        cluster: Cluster) -> None:
    # The victim's worker runtime dies with it: the coordinator finds the
    # worker lost when its lease (5 s, the session cluster's default)
    # runs out.
    group = unique_group("elastic")
    victim = _rank_process(group, 3, 2,
                           f"coordinator={cluster.coordinator.address}", 2)
    try:
        comms = _join_elastic(cluster, group, 3, [0, 1], 2)
        assert victim.stdout is not None
        assert victim.stdout.readline() == "joined\n"
        _all_reduce(comms)
        assert victim.stdout.readline() == "stepped\n"
        killed_at = time.monotonic()
        victim.kill()
        victim.wait()
        second = _all_reduce(comms)
        seen = time.monotonic() - killed_at
        for rank, error in enumerate(second):
            assert isinstance(error, chorus.MembershipChanged), error
            assert error.left == [2] and error.rank == rank
        print(f"survivors told {seen:.3f} s after the kill")
        assert seen < 5.0 + 1.0 + CALL_TIMEOUT / 4, seen
        for got in _all_reduce(comms):
            np.testing.assert_array_equal(got, [2.0] * 4)
        for comm in comms:
            comm.close()
    finally:
        if victim.poll() is None:
            victim.kill()


def test_leave_others_get_membership_changed(cluster: Cluster) -> None:
    group = unique_group("elastic")
    comms = _join_elastic(cluster, group, 3, [0, 1, 2], 2)
    comms[1].leave()
    errors = _all_reduce([comms[0], comms[2]])
    assert [e.left for e in errors] == [[1], [1]]
    assert [e.rank for e in errors] == [0, 1]
    for got in _all_reduce([comms[0], comms[2]]):
        np.testing.assert_array_equal(got, [2.0] * 4)
    comms[0].close()
    comms[2].close()


def test_newcomer_admitted_at_the_first_sync(cluster: Cluster) -> None:
    group = unique_group("elastic")
    comms = _join_elastic(cluster, group, 2, [0, 1], 1)
    # Without a newcomer a sync changes nothing.
    before = run_ranks([c.sync for c in comms])
    assert [(m.epoch, m.world_size, m.rank) for m in before] == [
        (comms[0].epoch, 2, 0), (comms[0].epoch, 2, 1)]
    joined: List[Any] = []
    newcomer = threading.Thread(target=lambda: joined.append(chorus.join(
        group, rank=None, worker=cluster.address("w1"),
        timeout=CALL_TIMEOUT)))
    newcomer.start()
    try:
        # The members sync at every step; the first sync after the newcomer
        # asked admits it.
        deadline = time.monotonic() + CALL_TIMEOUT
        after = run_ranks([c.sync for c in comms])
        while after[0].world_size == 2:
            assert time.monotonic() < deadline, "the newcomer never came in"
            assert [m.joined for m in after] == [[], []]
            after = run_ranks([c.sync for c in comms])
    finally:
        newcomer.join(CALL_TIMEOUT)
    assert [(m.world_size, m.rank, m.joined) for m in after] == [
        (3, 0, [2]), (3, 1, [2])]
    [third] = joined
    assert (third.rank, third.world_size, third.epoch) == (
        2, 3, after[0].epoch)
    everyone = comms + [third]
    for got in _all_reduce(everyone):
        np.testing.assert_array_equal(got, [3.0] * 4)
    for comm in everyone:
        comm.close()


@pytest.mark.skipif(not chorus.embedded.available(),
                    reason="chorus._embedded is not installed")
def test_embedded_ranks_sync_admits_newcomer(cluster: Cluster) -> None:
    # Embedded ranks run a blocking sync on their own thread; its outcome
    # (the next membership) comes back all the same.
    group = unique_group("elastic")
    coordinator = cluster.coordinator.address
    comms = run_ranks([
        (lambda r=r: chorus.join(group, 2, r, coordinator=coordinator,
                                 min_world_size=1, timeout=CALL_TIMEOUT))
        for r in (0, 1)])
    joined: List[Any] = []
    newcomer = threading.Thread(target=lambda: joined.append(chorus.join(
        group, rank=None, coordinator=coordinator, timeout=CALL_TIMEOUT)))
    newcomer.start()
    try:
        deadline = time.monotonic() + CALL_TIMEOUT
        after = run_ranks([c.sync for c in comms])
        while after[0].world_size == 2:
            assert time.monotonic() < deadline, "the newcomer never came in"
            after = run_ranks([c.sync for c in comms])
    finally:
        newcomer.join(CALL_TIMEOUT)
    assert [(m.world_size, m.rank, m.joined) for m in after] == [
        (3, 0, [2]), (3, 1, [2])]
    everyone = comms + joined
    assert [c.epoch for c in everyone] == [after[0].epoch] * 3
    for got in _all_reduce(everyone):
        np.testing.assert_array_equal(got, [3.0] * 4)
    for comm in everyone:
        comm.close()


def _joiners_waiting(cluster: Cluster, group: str) -> int:
    """The newcomers waiting to join `group`, as the coordinator lists it."""
    channel = grpc.insecure_channel(cluster.coordinator.address)
    try:
        listed = coordinator_pb2_grpc.CoordinatorStub(channel).ListGroups(
            coordinator_pb2.ListGroupsRequest(), timeout=CALL_TIMEOUT)
    finally:
        channel.close()
    return sum(g.joiners_waiting for g in listed.groups if g.name == group)


def test_newcomer_killed_while_waiting_changes_nothing(
        cluster: Cluster) -> None:
    # The daemon withdraws the join of a newcomer whose process died while
    # it waited: the members' next sync admits nobody and they go on.
    group = unique_group("elastic")
    comms = _join_elastic(cluster, group, 2, [0, 1], 1)
    newcomer = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import chorus, sys
            chorus.join({group!r}, rank=None,
                        worker={cluster.address("w1")!r}, timeout=60)
            sys.stdin.read()""")], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + CALL_TIMEOUT
        while _joiners_waiting(cluster, group) == 0:
            assert time.monotonic() < deadline, "the newcomer never asked"
            assert newcomer.poll() is None
            time.sleep(0.05)
    finally:
        newcomer.kill()
        newcomer.wait()
    # Until the withdrawal reached the coordinator.
    deadline = time.monotonic() + CALL_TIMEOUT
    while _joiners_waiting(cluster, group) != 0:
        assert time.monotonic() < deadline, "the join was never withdrawn"
        time.sleep(0.05)
    epoch = comms[0].epoch
    synced = run_ranks([c.sync for c in comms])
    assert [(m.joined, m.epoch) for m in synced] == [([], epoch)] * 2
    for got in _all_reduce(comms):
        np.testing.assert_array_equal(got, [2.0] * 4)
    for comm in comms:
        comm.close()


def test_newcomer_for_a_group_that_is_not_elastic(cluster: Cluster) -> None:
    group = unique_group()
    comms = run_ranks([
        (lambda r=r: chorus.join(group, 2, r, worker=cluster.address("w0"),
                                 timeout=CALL_TIMEOUT)) for r in (0, 1)])
    with pytest.raises(chorus.FailedPrecondition, match="not a formed "
                       "elastic group"):
        chorus.join(group, rank=None, worker=cluster.address("w1"),
                    timeout=CALL_TIMEOUT)
    for comm in comms:
        comm.close()


def _run_example(cycles: int, steps: int) -> str:
    example = Path(__file__).resolve().parents[2] / "examples" / "python" / \
        "elastic_train.py"
    env = dict(os.environ)
    env.pop("CHORUS_WORKER", None)
    env.pop("RANK", None)
    package_root = str(Path(chorus.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_root, env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, str(example), "--cycles", str(cycles), "--steps",
         str(steps)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "every rank holds the same parameters" in done.stdout
    return done.stdout


def test_example_kill_and_replace_identical_parameters() -> None:
    pytest.importorskip("torch")
    out = _run_example(cycles=1, steps=60)
    assert "    1 | " in out, out


@pytest.mark.slow
def test_soak_kill_and_replace_cycles_never_hang() -> None:
    # $CHORUS_TEST_SOAK_CYCLES kill-and-replace cycles (20 by default): no
    # hang, every survivor told at once, identical parameters at the end.
    pytest.importorskip("torch")
    cycles = int(os.environ.get("CHORUS_TEST_SOAK_CYCLES", "20"))
    out = _run_example(cycles=cycles, steps=40 + 30 * cycles)
    assert f"{cycles:5d} | " in out, out
