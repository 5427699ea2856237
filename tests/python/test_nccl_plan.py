"""The nccl plan from Python: two ranks of an embedded worker on the two
GPUs it emulates in host memory, under a coordinator running with
--nccl_plan. The worker relays the communicator's id, connects and runs
NCCL's collectives as it would on GPUs with NCCL (the emulation's NCCL).
"""

import os
from typing import Iterator, List

import numpy as np
import pytest

import chorus
from chorus import embedded
from conftest import CALL_TIMEOUT, Cluster, run_ranks, unique_group
from test_device_arrays import DeviceView

pytestmark = pytest.mark.skipif(not embedded.available(),
                                reason="chorus._embedded is not installed")

WORLD = 2
COUNT = 70_000  # f32: over the 128 KiB that ride with the call


@pytest.fixture(scope="module")
def nccl_worker(tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[chorus.EmbeddedWorker]:
    """An embedded worker with two emulated GPUs, registered with a
    coordinator that plans nccl."""
    cluster = Cluster(tmp_path_factory.mktemp("nccl"), workers=(),
                      coordinator_flags=["--nccl_plan"])
    worker = chorus.EmbeddedWorker(cluster.coordinator.address,
                                   name=f"nccl-{os.getpid()}",
                                   emulated_gpus=WORLD)
    yield worker
    worker.close()
    cluster.stop()


@pytest.fixture
def gpu_ranks(nccl_worker: chorus.EmbeddedWorker
              ) -> Iterator[List[chorus.Communicator]]:
    """Ranks 0 and 1 of a fresh group on Cuda(0) and Cuda(1)."""
    group = unique_group("nccl")
    comms = run_ranks([
        (lambda r=r: chorus.join(group, WORLD, r, worker=nccl_worker,
                                 device=f"cuda:{r}", timeout=CALL_TIMEOUT))
        for r in range(WORLD)])
    yield comms
    for c in comms:
        c.close(timeout=5)


def test_all_reduce_of_gpu_arrays_runs_on_nccl(
        nccl_worker: chorus.EmbeddedWorker,
        gpu_ranks: List[chorus.Communicator]) -> None:
    inputs = [np.arange(COUNT, dtype=np.float32) * (r + 1)
              for r in range(WORLD)]
    views = []
    for r, x in enumerate(inputs):
        view = DeviceView(nccl_worker, r, x.shape, np.float32)
        view.host[...] = x
        views.append(view)
    works = run_ranks([
        (lambda r=r: gpu_ranks[r].all_reduce(views[r], out=views[r],
                                             async_op=True))
        for r in range(WORLD)])
    for r, work in enumerate(works):
        assert work.result(timeout=CALL_TIMEOUT) is views[r]
        assert work.algorithm == "nccl"
        np.testing.assert_array_equal(views[r].host, inputs[0] + inputs[1])


def test_host_arrays_on_gpu_ranks_run_on_nccl(
        gpu_ranks: List[chorus.Communicator]) -> None:
    inputs = [np.full(COUNT, r + 1, dtype=np.int64) for r in range(WORLD)]
    works = run_ranks([
        (lambda r=r: gpu_ranks[r].all_gather(inputs[r], async_op=True))
        for r in range(WORLD)])
    for work in works:
        got = work.result(timeout=CALL_TIMEOUT)
        assert work.algorithm == "nccl"
        np.testing.assert_array_equal(
            np.asarray(got).reshape(-1), np.concatenate(inputs))
