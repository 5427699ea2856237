"""Collectives on arrays in GPU memory (__cuda_array_interface__) of ranks
that embed the worker runtime, on GPUs the embedded worker emulates in host
memory (EmbeddedWorker(emulated_gpus=N)): the worker's device path (staging,
streams, pointer checks) runs as it does on a GPU, on every machine.
"""

import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pytest

import chorus
from chorus import embedded
from conftest import CALL_TIMEOUT, Cluster, run_ranks, unique_group
from numpy_reference import (KINDS, check_close, expected, rank_input,
                             storage)

pytestmark = pytest.mark.skipif(not embedded.available(),
                                reason="chorus._embedded is not installed")

WORLD = 2
ROOT = 1


class DeviceView:
    """An array in an emulated GPU's memory, as CuPy or torch would offer
    one: its __cuda_array_interface__, and `host`, the same bytes as a
    numpy array (which an emulated GPU's memory is).
    """

    def __init__(self, worker: chorus.EmbeddedWorker, device: int,
                 shape: Sequence[int], dtype: Any) -> None:
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
        self.memory = worker.emulated_memory(device, max(1, nbytes))
        raw = np.asarray(memoryview(self.memory))[:nbytes]
        self.host = raw.view(self.dtype).reshape(self.shape)
        self.extra: Dict[str, Any] = {}

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        interface = {"shape": self.shape, "typestr": self.dtype.str,
                     "data": (self.memory.pointer, False), "version": 3,
                     "strides": None, "stream": None}
        interface.update(self.extra)
        return interface


@pytest.fixture(scope="module")
def gpu_worker(cluster: Cluster) -> Iterator[chorus.EmbeddedWorker]:
    """An embedded worker of this process with two emulated GPUs."""
    w = chorus.EmbeddedWorker(cluster.coordinator.address,
                              name=f"emulated-{os.getpid()}",
                              emulated_gpus=2)
    yield w
    w.close()


def _join(targets: Sequence[Any], devices: Sequence[str]
          ) -> List[chorus.Communicator]:
    group = unique_group("dev")
    return run_ranks([
        (lambda r=r: chorus.join(group, len(targets), r, worker=targets[r],
                                 device=devices[r], timeout=CALL_TIMEOUT))
        for r in range(len(targets))])


@pytest.fixture
def gpu_pair(gpu_worker: chorus.EmbeddedWorker
             ) -> Iterator[List[chorus.Communicator]]:
    """Ranks 0 and 1 of a fresh group on Cuda(0) and Cuda(1)."""
    comms = _join([gpu_worker, gpu_worker], ["cuda:0", "cuda:1"])
    yield comms
    for c in comms:
        c.close(timeout=5)


def _out_shape(kind: str, rank: int, x: np.ndarray) -> Optional[Tuple]:
    """The shape of `rank`'s output of `kind` with input `x`."""
    if kind in ("reduce", "gather") and rank != ROOT:
        return None
    if kind in ("all_gather", "gather"):
        return (WORLD,) + x.shape
    if kind in ("reduce_scatter", "scatter"):
        return x.shape[1:]
    return x.shape


def _issue(comm: chorus.Communicator, kind: str, x: Any, out: Any,
           dtype: str, async_op: bool) -> Any:
    """Runs `kind` on device arrays; returns its result (waited for)."""
    options: Dict[str, Any] = {"out": out, "timeout": CALL_TIMEOUT,
                               "async_op": async_op}
    if dtype == "bf16":
        options["dtype"] = "bf16"
    if kind in ("all_reduce", "reduce_scatter"):
        call = getattr(comm, kind)(x, "sum", **options)
    elif kind == "reduce":
        call = comm.reduce(x, ROOT, "sum", **options)
    elif kind in ("all_gather", "all_to_all"):
        call = getattr(comm, kind)(x, **options)
    elif kind == "gather":
        call = comm.gather(x, ROOT, **options)
    elif comm.rank == ROOT:  # broadcast, scatter
        call = getattr(comm, kind)(x, ROOT, **options)
    else:  # a non-root says what it receives by its out
        call = getattr(comm, kind)(root=ROOT, **options)
    return call.result() if async_op else call


@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
@pytest.mark.parametrize("dtype", ["f32", "i64", "bf16"])
@pytest.mark.parametrize("kind", KINDS)
def test_collective_on_device_arrays_matches_numpy(
        gpu_worker: chorus.EmbeddedWorker, gpu_pair: List[Any], kind: str,
        dtype: str, async_op: bool) -> None:
    op = "sum" if kind in ("all_reduce", "reduce", "reduce_scatter") else None
    # 300 elements go the data plane's way; 3 ride with the call.
    for count in (3, 300):
        inputs = [rank_input(kind, dtype, "sum", WORLD, r, count)
                  for r in range(WORLD)]
        xs, outs = [], []
        for r, x in enumerate(inputs):
            view = DeviceView(gpu_worker, r, x.shape, storage(dtype))
            view.host[...] = x
            xs.append(view)
            shape = _out_shape(kind, r, x)
            outs.append(None if shape is None else
                        DeviceView(gpu_worker, r, shape, storage(dtype)))
        got = run_ranks([
            (lambda r=r: _issue(gpu_pair[r], kind,
                                None if kind == "scatter" and r != ROOT
                                else xs[r], outs[r], dtype, async_op))
            for r in range(WORLD)])
        for r in range(WORLD):
            want = expected(kind, inputs, dtype, op or "sum", ROOT, r)
            if want is None:
                assert got[r] is None
                continue
            assert got[r] is outs[r]
            check_close(outs[r].host, want, dtype, op)
            # The input was read where it is, not changed.
            np.testing.assert_array_equal(xs[r].host, inputs[r])


def test_all_reduce_in_place_on_device_writes_the_input(
        gpu_worker: chorus.EmbeddedWorker, gpu_pair: List[Any]) -> None:
    views = [DeviceView(gpu_worker, r, (4, 5), np.float32)
             for r in range(WORLD)]
    for r, v in enumerate(views):
        v.host[...] = np.arange(20, dtype=np.float32).reshape(4, 5) * (r + 1)
    got = run_ranks([(lambda r=r: gpu_pair[r].all_reduce(views[r],
                                                         out=views[r]))
                     for r in range(WORLD)])
    for r, v in enumerate(views):
        assert got[r] is v
        np.testing.assert_array_equal(
            v.host, np.arange(20, dtype=np.float32).reshape(4, 5) * 3)


def test_device_arrays_bad_calls_refused_before_taking_a_number(
        gpu_worker: chorus.EmbeddedWorker, gpu_pair: List[Any]) -> None:
    comm = gpu_pair[0]
    x = DeviceView(gpu_worker, 0, (8,), np.float32)
    host = np.zeros(8, np.float32)
    number = comm.next_sequence
    with pytest.raises(chorus.InvalidArgument, match="out="):
        comm.all_reduce(x)
    with pytest.raises(chorus.InvalidArgument, match="both in GPU memory"):
        comm.all_reduce(x, out=host)
    with pytest.raises(chorus.InvalidArgument, match="both in GPU memory"):
        comm.all_reduce(host, out=x)
    with pytest.raises(chorus.InvalidArgument, match="out has 4 elements"):
        comm.all_reduce(x, out=DeviceView(gpu_worker, 0, (4,), np.float32))
    with pytest.raises(chorus.InvalidArgument, match="out="):
        comm.broadcast(x, 0)
    strided = DeviceView(gpu_worker, 0, (4, 2), np.float32)
    strided.extra["strides"] = (4, 16)
    with pytest.raises(chorus.InvalidArgument, match="not C-contiguous"):
        comm.all_reduce(strided, out=strided)
    # Memory that is not the rank's GPU's (here Cuda(1)'s) is refused by the
    # worker, whole ranges checked, before the call takes its number.
    other = DeviceView(gpu_worker, 1, (8,), np.float32)
    with pytest.raises(chorus.InvalidArgument, match="output pointer"):
        comm.all_reduce(x, out=other)
    short = DeviceView(gpu_worker, 0, (8,), np.float32)
    short.extra["shape"] = (9,)  # one element past its allocation
    with pytest.raises(chorus.InvalidArgument, match="pointer"):
        comm.all_reduce(short, out=short)
    assert comm.next_sequence == number
    # Both ranks still run the next call as number `number`.
    views = [x, DeviceView(gpu_worker, 1, (8,), np.float32)]
    views[0].host[...] = 1
    views[1].host[...] = 2
    run_ranks([(lambda r=r: gpu_pair[r].all_reduce(views[r], out=views[r]))
               for r in range(WORLD)])
    np.testing.assert_array_equal(views[0].host, np.full(8, 3, np.float32))
    assert comm.next_sequence == number + 1


def test_device_arrays_on_a_daemon_or_cpu_rank_refused(
        cluster: Cluster, gpu_worker: chorus.EmbeddedWorker) -> None:
    x = DeviceView(gpu_worker, 0, (8,), np.float32)
    comms = _join([cluster.address("w0"), gpu_worker], ["cpu", "cpu"])
    try:
        with pytest.raises(chorus.InvalidArgument, match="embed the worker"):
            comms[0].all_reduce(x, out=x)
        # An embedded rank joined on the CPU: the worker says why.
        with pytest.raises(chorus.InvalidArgument,
                           match=r"call's device is Cpu"):
            comms[1].all_reduce(x, out=x)
    finally:
        for c in comms:
            c.close(timeout=5)


def test_emulated_memory_errors_are_chorus_errors(
        gpu_worker: chorus.EmbeddedWorker) -> None:
    with pytest.raises(chorus.InvalidArgument, match="no emulated GPU 2"):
        gpu_worker.emulated_memory(2, 8)
    with pytest.raises(chorus.ResourceExhausted, match="out of memory"):
        gpu_worker.emulated_memory(0, 2 << 30)


def test_torch_backend_takes_tensors_of_the_rank_gpu_only(
        gpu_worker: chorus.EmbeddedWorker, gpu_pair: List[Any]) -> None:
    _tensors = pytest.importorskip("chorus.torch._tensors")
    assert [_tensors.gpu_of(c) for c in gpu_pair] == [0, 1]
    # Embedded ranks on the CPU (test_torch_cuda.py has daemon ranks on
    # GPUs, where there are GPUs).
    comms = _join([gpu_worker, gpu_worker], ["cpu", "cpu"])
    try:
        assert [c.device_arrays for c in comms] == [False, False]
        assert [_tensors.gpu_of(c) for c in comms] == [None, None]
    finally:
        for c in comms:
            c.close(timeout=5)
