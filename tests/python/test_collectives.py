"""Every collective, dtype and reduce op against numpy, on a group of three
ranks (two of them on one worker), with the inline plan and on the data
plane.
"""

from typing import Any, Optional

import numpy as np
import pytest

import chorus
from conftest import CALL_TIMEOUT, run_ranks
from numpy_reference import (KINDS, OPS, REDUCING, check_close, expected,
                             rank_input)

WORLD = 3
CASES = [(kind, dtype, op) for kind in KINDS for dtype in chorus.DTYPES
         for op in (OPS if kind in REDUCING else (None,))]


def issue(comm: chorus.Communicator, kind: str, x: np.ndarray, dtype: str,
          op: Optional[str], root: int, **options: Any) -> Any:
    """Runs `kind` on `comm` the way a user would call it."""
    options.setdefault("timeout", CALL_TIMEOUT)
    if dtype == "bf16":
        options["dtype"] = "bf16"
    if kind == "all_reduce":
        return comm.all_reduce(x, op, **options)
    if kind == "reduce":
        return comm.reduce(x, root, op, **options)
    if kind == "reduce_scatter":
        return comm.reduce_scatter(x, op, **options)
    if kind == "all_gather":
        return comm.all_gather(x, **options)
    if kind == "gather":
        return comm.gather(x, root, **options)
    if kind == "all_to_all":
        return comm.all_to_all(x, **options)
    if kind == "broadcast":
        if comm.rank == root:
            return comm.broadcast(x, root, **options)
        options["dtype"] = dtype
        return comm.broadcast(root=root, shape=x.shape, **options)
    if kind == "scatter":
        if comm.rank == root:
            return comm.scatter(x, root, **options)
        options["dtype"] = dtype
        return comm.scatter(root=root, shape=x.shape[1:], **options)
    raise ValueError(kind)


@pytest.mark.parametrize(
    "kind,dtype,op", CASES,
    ids=["-".join(p for p in case if p) for case in CASES])
def test_collective_matches_numpy(trio: Any, kind: str, dtype: str,
                                  op: Optional[str]) -> None:
    root = (chorus.DTYPES.index(dtype) + 1) % WORLD
    # A few elements ride inline with the call; the ring moves them between
    # the workers on the data plane.
    for algorithm, count in (("auto", 5), ("ring", 300)):
        inputs = [rank_input(kind, dtype, op or "sum", WORLD, r, count)
                  for r in range(WORLD)]
        results = run_ranks([
            (lambda r=r: issue(trio[r], kind, inputs[r], dtype, op, root,
                               algorithm=algorithm))
            for r in range(WORLD)])
        for r in range(WORLD):
            want = expected(kind, inputs, dtype, op, root, r)
            if want is None:
                assert results[r] is None, f"rank {r} of {kind} got data"
            else:
                check_close(results[r], want, dtype, op)


@pytest.mark.parametrize("algorithm", ["recursive_doubling", "same_host",
                                       "auto"])
@pytest.mark.parametrize("dtype", ["f32", "i64", "bf16"])
def test_all_reduce_plans(trio: Any, algorithm: str, dtype: str) -> None:
    count = 70_000  # over the 128 KiB that rides inline for every dtype
    inputs = [rank_input("all_reduce", dtype, "sum", WORLD, r, count)
              for r in range(WORLD)]
    works = run_ranks([
        (lambda r=r: issue(trio[r], "all_reduce", inputs[r], dtype, "sum", 0,
                           algorithm=algorithm, async_op=True))
        for r in range(WORLD)])
    want = expected("all_reduce", inputs, dtype, "sum", 0, 0)
    for work in works:
        check_close(work.result(timeout=CALL_TIMEOUT), want, dtype, "sum")
        assert work.algorithm != "inline"
        if algorithm == "recursive_doubling":
            assert work.algorithm == algorithm
        if algorithm == "same_host":  # or its fallback, where peers cannot
            assert work.algorithm in ("same_host", "ring")  # map memory


def test_shapes_are_as_numpy_users_expect(trio: Any) -> None:
    x = [np.full((2, 3, 4), r, dtype=np.float32) for r in range(WORLD)]
    blocks = [np.arange(6 * 4, dtype=np.int32).reshape(6, 4) * (r + 1)
              for r in range(WORLD)]
    per_rank = [np.arange(WORLD * 2 * 2, dtype=np.float64).reshape(
        WORLD, 2, 2) + 100 * r for r in range(WORLD)]

    def body(r: int) -> Any:
        c = trio[r]
        return {
            "all_reduce": c.all_reduce(x[r]),
            "scalar": c.all_reduce(np.float64(r + 1)),
            "all_gather": c.all_gather(x[r]),
            "reduce_scatter": c.reduce_scatter(blocks[r]),
            "reduce_scatter_rows": c.reduce_scatter(per_rank[r]),
            "all_to_all": c.all_to_all(per_rank[r]),
            "gather": c.gather(x[r], root=2),
            "scatter": c.scatter(per_rank[r] if r == 1 else None, root=1,
                                 shape=(2, 2), dtype=np.float64),
        }

    results = run_ranks([lambda r=r: body(r) for r in range(WORLD)])
    total_blocks = sum(blocks)
    for r, got in enumerate(results):
        np.testing.assert_array_equal(got["all_reduce"],
                                      np.full((2, 3, 4), 3, np.float32))
        assert got["scalar"].shape == () and got["scalar"] == 6.0
        assert got["all_gather"].shape == (WORLD, 2, 3, 4)
        np.testing.assert_array_equal(got["all_gather"], np.stack(x))
        assert got["reduce_scatter"].shape == (2, 4)
        np.testing.assert_array_equal(got["reduce_scatter"],
                                      total_blocks[2 * r:2 * r + 2])
        assert got["reduce_scatter_rows"].shape == (2, 2)
        np.testing.assert_array_equal(got["reduce_scatter_rows"],
                                      sum(per_rank)[r])
        np.testing.assert_array_equal(
            got["all_to_all"], np.stack([p[r] for p in per_rank]))
        if r == 2:
            np.testing.assert_array_equal(got["gather"], np.stack(x))
        else:
            assert got["gather"] is None
        np.testing.assert_array_equal(got["scatter"], per_rank[1][r])


def test_out_receives_the_result(trio: Any) -> None:
    outs = [np.empty(4, dtype=np.float32) for _ in range(WORLD)]
    gathered = [bytearray(WORLD * 4 * 4) for _ in range(WORLD)]

    def body(r: int) -> Any:
        x = np.arange(4, dtype=np.float32) + r
        reduced = trio[r].all_reduce(x, out=outs[r])
        assert reduced is outs[r]
        trio[r].all_gather(x, out=gathered[r])
        return None

    run_ranks([lambda r=r: body(r) for r in range(WORLD)])
    want = sum(np.arange(4, dtype=np.float32) + r for r in range(WORLD))
    for r in range(WORLD):
        np.testing.assert_array_equal(outs[r], want)
        np.testing.assert_array_equal(
            np.frombuffer(gathered[r], dtype=np.float32).reshape(WORLD, 4),
            np.stack([np.arange(4, dtype=np.float32) + k
                      for k in range(WORLD)]))


def test_buffers_and_dlpack_tensors(trio: Any) -> None:
    class Tensor:
        """A tensor that offers only DLPack, as torch's CPU tensors do."""

        def __init__(self, array: np.ndarray) -> None:
            self._array = array

        def __dlpack__(self, stream: Any = None) -> Any:
            return self._array.__dlpack__()

        def __dlpack_device__(self) -> Any:
            return self._array.__dlpack_device__()

    def body(r: int) -> Any:
        c = trio[r]
        raw = bytearray(np.full(3, r + 1, dtype=np.float32).tobytes())
        return (c.all_reduce(raw, dtype="f32"),
                c.all_reduce(memoryview(np.full(2, r, dtype=np.int64))),
                c.all_reduce(Tensor(np.full(5, r, dtype=np.uint32))),
                c.barrier())

    results = run_ranks([lambda r=r: body(r) for r in range(WORLD)])
    for floats, ints, tensor, barrier in results:
        np.testing.assert_array_equal(floats, np.full(3, 6, np.float32))
        np.testing.assert_array_equal(ints, np.full(2, 3, np.int64))
        np.testing.assert_array_equal(tensor, np.full(5, 3, np.uint32))
        assert barrier is None


def test_dlpack_input_is_not_copied() -> None:
    from chorus import _arrays

    source = np.arange(6, dtype=np.float32)

    class Tensor:
        def __dlpack__(self, stream: Any = None) -> Any:
            return source.__dlpack__()

        def __dlpack_device__(self) -> Any:
            return source.__dlpack_device__()

    view, name = _arrays.as_array(Tensor(), None, "x")
    assert name == "f32" and np.shares_memory(view, source)
    raw = bytearray(8)
    view, name = _arrays.as_array(raw, "i32", "x")
    assert name == "i32" and view.shape == (2,)
    view[0] = 7
    assert raw[0] == 7


def test_bf16_helpers_round_trip() -> None:
    values = np.array([1.0, -2.5, 3.140625, 0.0, 65280.0], dtype=np.float32)
    bits = chorus.f32_to_bf16(values)
    assert bits.dtype == np.uint16
    np.testing.assert_array_equal(chorus.bf16_to_f32(bits), values)
    # Round to nearest even: 1 + 2^-8 is halfway between two bf16 values.
    assert chorus.bf16_to_f32(chorus.f32_to_bf16(
        np.float32(1 + 2 ** -8))) == 1.0
    assert np.isnan(chorus.bf16_to_f32(chorus.f32_to_bf16(np.nan)))


def test_torch_tensors(trio: Any) -> None:
    torch = pytest.importorskip("torch")
    outs = [torch.zeros(3, dtype=torch.float32) for _ in range(WORLD)]

    def body(r: int) -> Any:
        c = trio[r]
        floats = torch.full((3,), float(r + 1))
        halves = torch.tensor([0.5, 1.5, 2.5], dtype=torch.bfloat16) * (r + 1)
        c.all_reduce(floats, out=outs[r].numpy())
        return c.all_reduce(halves)

    for r, bits in enumerate(run_ranks([lambda r=r: body(r)
                                        for r in range(WORLD)])):
        assert bits.dtype == np.uint16
        np.testing.assert_array_equal(chorus.bf16_to_f32(bits),
                                      [3.0, 9.0, 15.0])
        assert outs[r].tolist() == [6.0, 6.0, 6.0]
