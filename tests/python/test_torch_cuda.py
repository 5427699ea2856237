"""torch.distributed's collectives on CUDA tensors through the chorus
backend, in two rank processes (one worker daemon each, tensors staged
through pinned memory; or embedding the worker runtime and joined on their
GPUs, tensors through the device path), each rank on GPU rank modulo the
GPUs torch sees. Skipped where torch sees no GPU; bench/gpu_check.sh runs
them (pytest -m gpu).

Every tensor is written by a kernel on a side stream just before the call
and read on that stream after it: the backend must order its copies on
torch's current stream, not on the default one.
"""

from typing import Any, Dict

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from conftest import Cluster, unique_group  # noqa: E402
from torch_support import RankContext, RankProcesses  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="torch sees no CUDA device"),
]

WORLD = 2
# Elements of the large all_reduce: several chunks of the data plane, and
# sums that float32 holds exactly.
LARGE = 1 << 20


@pytest.fixture(scope="module")
def ranks(cluster: Cluster) -> Any:
    """Two chorus ranks on CUDA devices for the whole module."""
    processes = RankProcesses([cluster.address("w0"), cluster.address("w1")],
                              unique_group("torch-cuda"))
    try:
        yield processes
    finally:
        statuses = processes.close()
    assert statuses == [0] * WORLD, processes.output()


def _device(ctx: RankContext) -> Any:
    return torch.device("cuda", ctx.rank % torch.cuda.device_count())


def rank_collectives(ctx: RankContext) -> Dict[str, Any]:
    device = _device(ctx)
    side = torch.cuda.Stream(device)
    got: Dict[str, Any] = {}
    with torch.cuda.device(device), torch.cuda.stream(side):
        ramp = torch.arange(LARGE, dtype=torch.float32, device=device)
        x = ramp * (ctx.rank + 1)
        dist.all_reduce(x)
        factor = sum(r + 1 for r in range(ctx.world_size))
        got["all_reduce"] = bool(torch.equal(x, ramp * factor))

        b = torch.full((3,), float(ctx.rank), dtype=torch.bfloat16,
                       device=device)
        dist.broadcast(b, src=1)
        got["broadcast"] = b.cpu().float().tolist()

        mine = torch.tensor([ctx.rank, 100 + ctx.rank], dtype=torch.int32,
                            device=device)
        outs = [torch.zeros(2, dtype=torch.int32, device=device)
                for _ in range(ctx.world_size)]
        dist.all_gather(outs, mine)
        into = torch.zeros(2 * ctx.world_size, dtype=torch.int32,
                           device=device)
        dist.all_gather_into_tensor(into, mine)
        got["all_gather"] = [o.cpu().tolist() for o in outs]
        got["all_gather_into"] = into.cpu().tolist()

        whole = torch.arange(2.0 * ctx.world_size, device=device) * \
            (ctx.rank + 1)
        block = torch.zeros(2, device=device)
        dist.reduce_scatter_tensor(block, whole)
        got["reduce_scatter"] = block.cpu().tolist()

        sent = torch.arange(ctx.world_size, dtype=torch.int64,
                            device=device) + 10 * ctx.rank
        received = torch.zeros_like(sent)
        dist.all_to_all_single(received, sent)
        got["all_to_all"] = received.cpu().tolist()

        t = (torch.arange(12.0, device=device).reshape(3, 4) + ctx.rank).t()
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        got["non_contiguous"] = t.cpu().tolist()
    side.synchronize()
    return got


@pytest.fixture(scope="module")
def embedded_ranks(cluster: Cluster) -> Any:
    """Two chorus ranks that embed the worker runtime, joined on their
    GPUs: CUDA tensors go through the device path, unstaged.
    """
    processes = RankProcesses([None, None], unique_group("torch-cuda-dev"),
                              coordinator=cluster.coordinator.address,
                              device="cuda")
    try:
        yield processes
    finally:
        statuses = processes.close()
    assert statuses == [0] * WORLD, processes.output()


def device_arrays(ctx: RankContext) -> bool:
    """Whether the default group's tensors go through the device path."""
    return bool(ctx.group.communicator.device_arrays)


@pytest.mark.parametrize("which", ["daemon", "embedded"])
def test_collectives_on_cuda_tensors_match_the_cpu_results(
        request: Any, which: str) -> None:
    ranks = request.getfixturevalue(
        "ranks" if which == "daemon" else "embedded_ranks")
    assert ranks.values(device_arrays) == [which == "embedded"] * WORLD
    base = torch.arange(12.0).reshape(3, 4)
    summed = sum(base + r for r in range(WORLD)).t().tolist()
    for rank, got in enumerate(ranks.values(rank_collectives)):
        assert got["all_reduce"], rank
        assert got["broadcast"] == [1.0] * 3
        assert got["all_gather"] == [[r, 100 + r] for r in range(WORLD)]
        assert got["all_gather_into"] == [v for r in range(WORLD)
                                          for v in (r, 100 + r)]
        assert got["reduce_scatter"] == [
            sum(r + 1 for r in range(WORLD)) * (2.0 * rank + i)
            for i in range(2)]
        assert got["all_to_all"] == [rank + 10 * r for r in range(WORLD)]
        assert got["non_contiguous"] == summed
