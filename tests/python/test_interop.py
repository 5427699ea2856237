"""A Python rank next to a C++ rank (chorusctl), two ranks on one daemon,
and joining from environment variables.
"""

import subprocess
from typing import Any, Dict, List

import numpy as np
import pytest

import chorus
from conftest import CALL_TIMEOUT, Cluster, join_all, run_ranks, unique_group


def _chorusctl(bins: Dict[str, Any], worker: str, group: str,
               args: List[str]) -> "subprocess.Popen[str]":
    return subprocess.Popen(
        [str(bins["chorusctl"]), f"--worker={worker}", f"--group={group}",
         "--world=2", "--rank=1", "--timeout=60s", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.parametrize("algorithm", ["auto", "ring"])
def test_python_and_chorusctl_all_reduce(cluster: Cluster, bins: Any,
                                         algorithm: str) -> None:
    group = unique_group()
    ctl = _chorusctl(bins, cluster.address("w1"), group,
                     ["--op=sum", "--dtype=f32", f"--algorithm={algorithm}",
                      "allreduce", "1", "2", "3"])
    try:
        with chorus.join(group, 2, 0, worker=cluster.address("w0"),
                         timeout=CALL_TIMEOUT) as comm:
            got = comm.all_reduce(np.array([10, 20, 30], np.float32),
                                  algorithm=algorithm)
        output, _ = ctl.communicate(timeout=CALL_TIMEOUT)
    finally:
        if ctl.poll() is None:
            ctl.kill()
            ctl.wait()
    np.testing.assert_array_equal(got, [11, 22, 33])
    assert ctl.returncode == 0, output
    assert "11 22 33" in output


def test_python_root_broadcasts_to_chorusctl(cluster: Cluster,
                                             bins: Any) -> None:
    group = unique_group()
    ctl = _chorusctl(bins, cluster.address("w1"), group,
                     ["--dtype=i64", "--root=0", "--count=3", "broadcast"])
    try:
        with chorus.join(group, 2, 0, worker=cluster.address("w0"),
                         timeout=CALL_TIMEOUT) as comm:
            got = comm.broadcast(np.array([-7, 8, 2 ** 40], np.int64))
        output, _ = ctl.communicate(timeout=CALL_TIMEOUT)
    finally:
        if ctl.poll() is None:
            ctl.kill()
            ctl.wait()
    assert ctl.returncode == 0, output
    assert f"-7 8 {2 ** 40}" in output
    np.testing.assert_array_equal(got, [-7, 8, 2 ** 40])


def test_two_ranks_on_one_daemon(cluster: Cluster) -> None:
    w0 = cluster.address("w0")
    comms = join_all([w0, w0])
    try:
        assert comms[0].member_devices == ["Cpu", "Cpu"]
        big = [np.full(100_000, r + 1, np.float32) for r in range(2)]

        def body(r: int) -> Any:
            c = comms[r]
            return (c.all_reduce(np.array([r, 10 * r], np.int32)),
                    c.all_gather(np.array([r], np.uint8)),
                    c.all_reduce(big[r], async_op=True).result(CALL_TIMEOUT),
                    c.all_to_all(np.array([[r, r], [r + 10, r + 10]],
                                          np.float64)))

        for r, (small, gathered, large, swapped) in enumerate(
                run_ranks([lambda r=r: body(r) for r in range(2)])):
            np.testing.assert_array_equal(small, [1, 10])
            np.testing.assert_array_equal(gathered, [[0], [1]])
            np.testing.assert_array_equal(large, np.full(100_000, 3.0))
            np.testing.assert_array_equal(
                swapped, [[r * 10, r * 10], [1 + r * 10, 1 + r * 10]])
    finally:
        for c in comms:
            c.close()


def test_join_from_environment(cluster: Cluster,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    group = unique_group()
    monkeypatch.setenv("CHORUS_WORKER", cluster.address("w0"))
    monkeypatch.setenv("CHORUS_GROUP", group)
    monkeypatch.setenv("CHORUS_WORLD_SIZE", "1")
    monkeypatch.setenv("CHORUS_RANK", "0")
    with chorus.join(timeout=CALL_TIMEOUT) as comm:
        assert (comm.group, comm.world_size, comm.rank) == (group, 1, 0)
        assert comm.worker == cluster.address("w0")
        assert comm.device == "Cpu" and comm.epoch > 0
        np.testing.assert_array_equal(comm.all_reduce(np.ones(2, np.int8)),
                                      [1, 1])
    # torchrun's WORLD_SIZE and RANK stand in for the CHORUS_ ones.
    monkeypatch.delenv("CHORUS_WORLD_SIZE")
    monkeypatch.delenv("CHORUS_RANK")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("CHORUS_GROUP", unique_group())
    with chorus.join(timeout=CALL_TIMEOUT) as comm:
        assert (comm.world_size, comm.rank) == (1, 0)
