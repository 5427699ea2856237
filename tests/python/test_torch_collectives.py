"""torch.distributed's collectives on the chorus backend, in three rank
processes (ranks 0 and 2 on worker w0, rank 1 on w1), against numpy.

Each rank_... function runs in every rank process (see torch_support.py);
the test next to it checks what the ranks returned.
"""

import re
from typing import Any, Dict, List

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from conftest import Cluster, unique_group  # noqa: E402
from torch_support import RankContext, RankProcesses  # noqa: E402

WORLD = 3

DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "uint8",
          "int32", "int64"]


@pytest.fixture(scope="module")
def ranks(cluster: Cluster) -> Any:
    """Three chorus ranks for the whole module."""
    w0, w1 = cluster.address("w0"), cluster.address("w1")
    processes = RankProcesses([w0, w1, w0], unique_group("torch-test"))
    try:
        yield processes
    finally:
        statuses = processes.close()
    # Each rank exits cleanly, even with gRPC's threads finishing calls.
    assert statuses == [0] * WORLD, processes.output()


def _dtype(name: str) -> Any:
    return getattr(torch, name)


# --- init_process_group ------------------------------------------------------


def rank_describe(ctx: RankContext) -> Dict[str, Any]:
    return {"backend": dist.get_backend(), "rank": dist.get_rank(),
            "size": dist.get_world_size(),
            "class": type(ctx.group).__name__,
            "group": ctx.group.chorus_group,
            "name": ctx.group.getBackendName()}


def test_init_process_group_chorus_joins_one_chorus_group(
        ranks: RankProcesses) -> None:
    for rank, d in enumerate(ranks.values(rank_describe)):
        assert d == {"backend": "chorus", "rank": rank, "size": WORLD,
                     "class": "ProcessGroupChorus", "group": ranks.group,
                     "name": "chorus"}


def test_init_process_group_without_chorus_group_shares_rank_0s_name(
        cluster: Cluster) -> None:
    addresses = [cluster.address("w0"), cluster.address("w1")]
    pair = RankProcesses(addresses, None)
    try:
        described = pair.values(rank_describe)
        sums = pair.values(rank_all_reduce_once)
    finally:
        assert pair.close() == [0, 0], pair.output()
    names = {d["group"] for d in described}
    assert len(names) == 1
    assert re.fullmatch(r"torch-[0-9a-f]{12}", next(iter(names))), names
    assert sums == [2.0, 2.0]


def rank_all_reduce_once(ctx: RankContext) -> float:
    x = torch.ones(1)
    dist.all_reduce(x)
    return x.item()


# --- all_reduce --------------------------------------------------------------

OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG"]


def _op_input(rank: int) -> List[float]:
    return [rank + 1.0, -2.0 * (rank + 1), 0.5 * (rank + 1), 7.0]


def rank_all_reduce_ops(ctx: RankContext) -> Dict[str, List[float]]:
    got = {}
    for name in OPS:
        x = torch.tensor(_op_input(ctx.rank), dtype=torch.float64)
        dist.all_reduce(x, op=getattr(dist.ReduceOp, name))
        got[name] = x.tolist()
    return got


def test_all_reduce_every_chorus_op_matches_numpy(
        ranks: RankProcesses) -> None:
    inputs = np.array([_op_input(r) for r in range(WORLD)])
    expected = {"SUM": inputs.sum(0), "PRODUCT": inputs.prod(0),
                "MIN": inputs.min(0), "MAX": inputs.max(0),
                "AVG": inputs.mean(0)}
    for got in ranks.values(rank_all_reduce_ops):
        for name in OPS:
            np.testing.assert_allclose(got[name], expected[name],
                                       rtol=1e-12, err_msg=name)


def rank_all_reduce_dtypes(ctx: RankContext) -> Dict[str, List[float]]:
    got = {}
    for name in DTYPES:
        x = torch.arange(5).to(_dtype(name)) + ctx.rank
        dist.all_reduce(x)
        assert x.dtype == _dtype(name)
        got[name] = x.tolist()
    return got


def test_all_reduce_every_dtype_sums_exactly(ranks: RankProcesses) -> None:
    expected = sum(np.arange(5) + r for r in range(WORLD)).tolist()
    for got in ranks.values(rank_all_reduce_dtypes):
        for name in DTYPES:
            assert got[name] == expected, name


def rank_all_reduce_bitwise(ctx: RankContext) -> Dict[str, Any]:
    refused = {}
    for name in ("BAND", "BOR", "BXOR"):
        try:
            dist.all_reduce(torch.ones(2, dtype=torch.int32),
                            op=getattr(dist.ReduceOp, name))
            refused[name] = None
        except ValueError as e:
            refused[name] = f"{type(e).__name__}: {e}"
    x = torch.ones(2)
    dist.all_reduce(x)  # the refusals took no number: the ranks still match
    return {"refused": refused, "after": x.tolist()}


def test_all_reduce_bitwise_ops_are_refused_before_sending(
        ranks: RankProcesses) -> None:
    for got in ranks.values(rank_all_reduce_bitwise):
        for name, error in got["refused"].items():
            assert error is not None, name
            assert error.startswith("InvalidArgument"), error
            assert f"ReduceOp.{name}" in error and "ReduceOp.AVG" in error
        assert got["after"] == [WORLD, WORLD]


# --- broadcast, reduce -------------------------------------------------------


def rank_broadcast(ctx: RankContext) -> List[Any]:
    got = []
    for root in range(ctx.world_size):
        t = torch.full((2, 3), 10.0 * ctx.rank, dtype=torch.float64)
        dist.broadcast(t, src=root)
        got.append(t.tolist())
    b = torch.full((4,), float(ctx.rank), dtype=torch.bfloat16)
    dist.broadcast(b, src=2)
    got.append(b.tolist())
    return got


def test_broadcast_from_every_root_reaches_every_rank(
        ranks: RankProcesses) -> None:
    for got in ranks.values(rank_broadcast):
        for root in range(WORLD):
            assert got[root] == [[10.0 * root] * 3] * 2
        assert got[WORLD] == [2.0] * 4


def rank_reduce(ctx: RankContext) -> List[int]:
    x = torch.tensor([ctx.rank + 1, 10 * (ctx.rank + 1)], dtype=torch.int64)
    dist.reduce(x, dst=1, op=dist.ReduceOp.MAX)
    return x.tolist()


def test_reduce_gives_the_root_the_result_and_leaves_others_alone(
        ranks: RankProcesses) -> None:
    got = ranks.values(rank_reduce)
    assert got == [[1, 10], [WORLD, 10 * WORLD], [3, 30]]


# --- all_gather, reduce_scatter ----------------------------------------------


def rank_all_gather(ctx: RankContext) -> Dict[str, Any]:
    mine = torch.tensor([ctx.rank, 100 + ctx.rank], dtype=torch.int32)
    outs = [torch.zeros(2, dtype=torch.int32) for _ in range(ctx.world_size)]
    dist.all_gather(outs, mine)
    into = torch.zeros(2 * ctx.world_size, dtype=torch.int32)
    dist.all_gather_into_tensor(into, mine)
    halves = torch.full((3,), ctx.rank + 0.5, dtype=torch.float16)
    gathered = torch.zeros(ctx.world_size, 3, dtype=torch.float16)
    dist.all_gather_into_tensor(gathered, halves)
    return {"list": [o.tolist() for o in outs], "into": into.tolist(),
            "f16": gathered.tolist()}


def test_all_gather_list_and_into_tensor_put_rank_i_in_block_i(
        ranks: RankProcesses) -> None:
    for got in ranks.values(rank_all_gather):
        assert got["list"] == [[r, 100 + r] for r in range(WORLD)]
        assert got["into"] == [v for r in range(WORLD) for v in (r, 100 + r)]
        assert got["f16"] == [[r + 0.5] * 3 for r in range(WORLD)]


def rank_reduce_scatter(ctx: RankContext) -> Dict[str, Any]:
    blocks = [torch.full((2,), 10.0 * i + ctx.rank) for i in
              range(ctx.world_size)]
    out = torch.zeros(2)
    dist.reduce_scatter(out, blocks)
    whole = torch.arange(2.0 * ctx.world_size) * (ctx.rank + 1)
    out_tensor = torch.zeros(2)
    dist.reduce_scatter_tensor(out_tensor, whole, op=dist.ReduceOp.MAX)
    return {"list": out.tolist(), "tensor": out_tensor.tolist()}


def test_reduce_scatter_list_and_tensor_give_rank_its_block(
        ranks: RankProcesses) -> None:
    for rank, got in enumerate(ranks.values(rank_reduce_scatter)):
        assert got["list"] == [10.0 * rank * WORLD + sum(range(WORLD))] * 2
        assert got["tensor"] == [WORLD * (2.0 * rank),
                                 WORLD * (2.0 * rank + 1)]


# --- gather, scatter, all_to_all ---------------------------------------------


def rank_gather_scatter(ctx: RankContext) -> Dict[str, Any]:
    mine = torch.tensor([ctx.rank * 1.5])
    gathered = ([torch.zeros(1) for _ in range(ctx.world_size)]
                if ctx.rank == 2 else None)
    dist.gather(mine, gathered, dst=2)
    out = torch.zeros(2, dtype=torch.uint8)
    pieces = ([torch.tensor([i, 200 + i], dtype=torch.uint8)
               for i in range(ctx.world_size)] if ctx.rank == 1 else None)
    dist.scatter(out, pieces, src=1)
    return {"gathered": None if gathered is None else
            [g.tolist() for g in gathered], "scattered": out.tolist()}


def test_gather_and_scatter_with_roots_other_than_zero(
        ranks: RankProcesses) -> None:
    for rank, got in enumerate(ranks.values(rank_gather_scatter)):
        if rank == 2:
            assert got["gathered"] == [[r * 1.5] for r in range(WORLD)]
        else:
            assert got["gathered"] is None
        assert got["scattered"] == [rank, 200 + rank]


def _uneven_splits(rank: int) -> List[int]:
    """Rows rank `rank` sends to each rank: rank i sends i + j + 1 rows to
    rank j.
    """
    return [rank + j + 1 for j in range(WORLD)]


def rank_all_to_all(ctx: RankContext) -> Dict[str, Any]:
    even_in = torch.arange(2.0 * ctx.world_size) + 100 * ctx.rank
    even_out = torch.zeros(2 * ctx.world_size)
    dist.all_to_all_single(even_out, even_in)
    send = _uneven_splits(ctx.rank)
    receive = [i + ctx.rank + 1 for i in range(ctx.world_size)]
    rows = torch.arange(float(sum(send))).repeat_interleave(2).reshape(-1, 2)
    uneven_in = rows + 1000 * ctx.rank
    uneven_out = torch.zeros(sum(receive), 2)
    dist.all_to_all_single(uneven_out, uneven_in, receive, send)
    outs = [torch.zeros(1, dtype=torch.int64)
            for _ in range(ctx.world_size)]
    dist.all_to_all(outs, [torch.tensor([10 * ctx.rank + j])
                           for j in range(ctx.world_size)])
    return {"even": even_out.tolist(), "uneven": uneven_out.tolist(),
            "list": [o.item() for o in outs]}


def test_all_to_all_single_even_and_uneven_splits_and_list(
        ranks: RankProcesses) -> None:
    for rank, got in enumerate(ranks.values(rank_all_to_all)):
        assert got["even"] == [100.0 * i + 2 * rank + k
                               for i in range(WORLD) for k in range(2)]
        expected = []
        for sender in range(WORLD):
            start = sum(_uneven_splits(sender)[:rank])
            for row in range(_uneven_splits(sender)[rank]):
                expected.append([1000.0 * sender + start + row] * 2)
        assert got["uneven"] == expected
        assert got["list"] == [10 * i + rank for i in range(WORLD)]


# --- barrier, async work, layouts --------------------------------------------


def rank_async(ctx: RankContext) -> Dict[str, Any]:
    tensors = [torch.full((3,), float(i + ctx.rank)) for i in range(4)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    waited = [w.wait() for w in works]
    future_values = [w.get_future().wait()[0].tolist() for w in works]
    into = torch.zeros(ctx.world_size)
    gather_work = dist.all_gather_into_tensor(
        into, torch.tensor([float(ctx.rank)]), async_op=True)
    gathered = gather_work.get_future().wait()[0].tolist()
    barrier = dist.barrier(async_op=True)
    barrier.wait()
    dist.barrier()
    return {"waited": waited, "values": [t.tolist() for t in tensors],
            "future_values": future_values, "gathered": gathered,
            "completed": [w.is_completed() and w.is_success()
                          for w in works + [gather_work, barrier]]}


def test_async_work_wait_and_get_future_give_the_results(
        ranks: RankProcesses) -> None:
    sums = [[float(WORLD * i + sum(range(WORLD)))] * 3 for i in range(4)]
    for got in ranks.values(rank_async):
        assert got["waited"] == [True] * 4
        assert got["values"] == sums and got["future_values"] == sums
        assert got["gathered"] == [float(r) for r in range(WORLD)]
        assert all(got["completed"])


def rank_non_contiguous(ctx: RankContext) -> Dict[str, Any]:
    t = (torch.arange(12.0).reshape(3, 4) + ctx.rank).t()  # a transpose
    assert not t.is_contiguous()
    dist.all_reduce(t)
    out = torch.zeros(4, ctx.world_size).t()
    dist.all_gather_into_tensor(out, torch.full((4,), float(ctx.rank)))
    return {"sum": t.tolist(), "gathered": out.tolist()}


def test_non_contiguous_tensors_get_their_results_in_place(
        ranks: RankProcesses) -> None:
    base = np.arange(12.0).reshape(3, 4)
    expected = sum(base + r for r in range(WORLD)).T.tolist()
    for got in ranks.values(rank_non_contiguous):
        assert got["sum"] == expected
        assert got["gathered"] == [[float(r)] * 4 for r in range(WORLD)]


# --- subgroups ---------------------------------------------------------------


def rank_new_group(ctx: RankContext) -> Dict[str, Any]:
    first = dist.new_group([0, 2])
    second = dist.new_group([1, 2])
    got: Dict[str, Any] = {}
    for name, group in (("first", first), ("second", second)):
        if group == dist.GroupMember.NON_GROUP_MEMBER:
            got[name] = None
            continue
        x = torch.tensor([ctx.rank + 1.0])
        dist.all_reduce(x, group=group)
        b = torch.tensor([float(ctx.rank)])
        dist.broadcast(b, src=2, group=group)  # a global rank
        got[name] = {"chorus_group": group.chorus_group,
                     "rank": group.rank(), "size": group.size(),
                     "sum": x.item(), "broadcast": b.item()}
    got["default"] = ctx.group.chorus_group
    return got


def test_new_group_is_its_own_chorus_group_named_alike_on_every_rank(
        ranks: RankProcesses) -> None:
    got = ranks.values(rank_new_group)
    base = got[0]["default"]
    assert got[1]["first"] is None and got[0]["second"] is None
    first = {got[r]["first"]["chorus_group"] for r in (0, 2)}
    second = {got[r]["second"]["chorus_group"] for r in (1, 2)}
    assert len(first) == 1 and len(second) == 1 and first != second
    for name in first | second:
        assert name.startswith(base + "/")
    assert [got[r]["first"]["rank"] for r in (0, 2)] == [0, 1]
    assert {got[r]["first"]["sum"] for r in (0, 2)} == {4.0}
    assert {got[r]["second"]["sum"] for r in (1, 2)} == {5.0}
    for r, name in ((0, "first"), (2, "first"), (1, "second"),
                    (2, "second")):
        assert got[r][name]["broadcast"] == 2.0 and \
            got[r][name]["size"] == 2


# --- what the backend refuses ------------------------------------------------


def rank_refusals(ctx: RankContext) -> Dict[str, str]:
    refused = {}
    for name, call in (
            ("bool", lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool))),
            ("int16", lambda: dist.broadcast(
                torch.ones(2, dtype=torch.int16), src=0)),
            ("send", lambda: dist.send(torch.ones(1), dst=(ctx.rank + 1) %
                                       ctx.world_size)),
            ("meta", lambda: dist.all_reduce(torch.ones(2, device="meta")))):
        try:
            call()
            refused[name] = ""
        except Exception as e:  # noqa: BLE001 (the test reads the class)
            refused[name] = f"{type(e).__name__}: {e}"
    x = torch.ones(1)
    dist.all_reduce(x)  # nothing was sent: the ranks still match
    refused["after"] = str(x.item())
    return refused


def test_unsupported_dtypes_and_send_are_refused_clearly(
        ranks: RankProcesses) -> None:
    for got in ranks.values(rank_refusals):
        assert got["bool"].startswith("InvalidArgument") and \
            "torch.bool" in got["bool"] and "bfloat16" in got["bool"]
        assert got["int16"].startswith("InvalidArgument") and \
            "torch.int16" in got["int16"]
        assert got["send"].startswith("NotImplementedError") and \
            "no send" in got["send"]
        assert got["meta"].startswith("InvalidArgument") and \
            "is on meta" in got["meta"] and \
            "CPU and CUDA tensors" in got["meta"], got["meta"]
        assert got["after"] == str(float(WORLD))
