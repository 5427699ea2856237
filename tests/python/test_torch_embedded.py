"""The chorus backend with ranks that embed the worker runtime
($CHORUS_COORDINATOR, no worker daemon), beside a rank on a daemon:
torch's collectives, all issued without blocking, read and write the
tensors themselves, and configuring both ways is refused.

Each rank_... function runs in every rank process (see torch_support.py).
"""

from typing import Any, Dict

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import chorus  # noqa: E402
from chorus import embedded  # noqa: E402
from conftest import Cluster, unique_group  # noqa: E402
from torch_support import RankProcesses  # noqa: E402

WORLD = 3
COUNT = 300_000  # 1.2 MB of f32: over the size that goes in shared memory


def rank_collectives(ctx: Any) -> Dict[str, Any]:
    x = torch.arange(COUNT, dtype=torch.float32) + ctx.rank
    dist.all_reduce(x)
    want = torch.arange(COUNT, dtype=torch.float32) * WORLD + 3
    b = torch.full((COUNT,), float(ctx.rank))
    dist.broadcast(b, src=1)
    gathered = torch.empty(WORLD * 4, dtype=torch.int64)
    dist.all_gather_into_tensor(gathered,
                                torch.full((4,), ctx.rank, dtype=torch.int64))
    comm = ctx.group.communicator
    return {"all_reduce": bool(torch.equal(x, want)),
            "broadcast": bool(torch.equal(b, torch.ones(COUNT))),
            "all_gather": gathered.tolist(),
            "shared_memory": comm.shared_memory}


@pytest.mark.skipif(not embedded.available(),
                    reason="chorus._embedded is not installed")
def test_embedded_torch_ranks_collectives_in_place_beside_a_daemon_rank(
        cluster: Cluster) -> None:
    with RankProcesses([None, cluster.address("w0"), None],
                       unique_group("torch-embedded"),
                       coordinator=cluster.coordinator.address) as ranks:
        got = ranks.values(rank_collectives)
    for rank, values in enumerate(got):
        assert values["all_reduce"] and values["broadcast"], (rank, values)
        assert values["all_gather"] == [r for r in range(WORLD)
                                        for _ in range(4)]
    # The embedded ranks copied nothing into shared memory; the daemon
    # rank's client did.
    assert got[0]["shared_memory"] == "untried"
    assert got[2]["shared_memory"] == "untried"
    assert got[1]["shared_memory"] == "on"


def test_options_worker_and_coordinator_invalid_argument(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from chorus.torch.backend import Options, _coordinator
    with pytest.raises(chorus.InvalidArgument, match="not both"):
        _coordinator(Options(worker="unix:/nowhere",
                             coordinator="127.0.0.1:1"))
    monkeypatch.setenv("CHORUS_WORKER", "unix:/nowhere")
    monkeypatch.setenv("CHORUS_COORDINATOR", "127.0.0.1:1")
    with pytest.raises(chorus.InvalidArgument, match="unset one"):
        _coordinator(Options())
    # A field given wins over the environment.
    assert _coordinator(Options(worker="unix:/elsewhere")) is None
    assert _coordinator(Options(coordinator="127.0.0.1:2")) == "127.0.0.1:2"
    monkeypatch.delenv("CHORUS_WORKER")
    assert _coordinator(Options()) == "127.0.0.1:1"
    monkeypatch.delenv("CHORUS_COORDINATOR")
    assert _coordinator(Options()) is None
    # Fields keep their places: the second is still the group.
    assert Options("unix:/w", "train").group == "train"
