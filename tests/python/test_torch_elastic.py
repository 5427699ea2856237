"""chorus.torch.ElasticGroup through real daemons, its ranks on threads of
this process (it needs no torch default group): a rank that leaves makes
the others' dist.all_reduce raise MembershipChanged and process_group the
new membership's; a newcomer's first sync() takes rank 0's parameters and
step; with nobody waiting, sync() moves no data.
"""

import time
from typing import Any, List, Optional

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import chorus  # noqa: E402
from chorus.torch import ElasticGroup  # noqa: E402
from conftest import CALL_TIMEOUT, Cluster, run_ranks, unique_group  # noqa: E402,E501


def _model(seed: int) -> Any:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3),
                                torch.nn.BatchNorm1d(3))
    model.get_buffer("1.running_mean").fill_(float(seed))
    return model


def _state(model: Any) -> List[Any]:
    return [t.detach().clone() for t in
            list(model.parameters()) + list(model.buffers())]


def _join(cluster: Cluster, group: str, world: int,
          rank: Optional[int]) -> ElasticGroup:
    worker = cluster.address("w0" if (rank or 0) % 2 == 0 else "w1")
    return ElasticGroup(group, world, rank, worker=worker, min_world_size=1,
                        timeout=CALL_TIMEOUT)


def _all_reduce(groups: List[ElasticGroup]) -> List[Any]:
    """Every rank all-reduces ones on its process group; returns each
    rank's tensor or error."""
    def one(group: ElasticGroup) -> Any:
        tensor = torch.ones(4)
        dist.all_reduce(tensor, group=group.process_group)
        return tensor
    return run_ranks([(lambda g=g: one(g)) for g in groups], capture=True)


def test_leave_then_newcomer_process_group_follows_state_handed_out(
        cluster: Cluster) -> None:
    name = unique_group("torch-elastic")
    groups = run_ranks([(lambda r=r: _join(cluster, name, 3, r))
                        for r in range(3)])
    for got in _all_reduce(groups):
        assert got.tolist() == [3.0] * 4
    first_group = groups[0].process_group
    assert (first_group.rank(), first_group.size()) == (0, 3)

    groups[1].leave()
    survivors = [groups[0], groups[2]]
    for error in _all_reduce(survivors):
        assert isinstance(error, chorus.MembershipChanged), error
        assert error.left == [1]
    assert [(g.process_group.rank(), g.process_group.size())
            for g in survivors] == [(0, 2), (1, 2)]
    assert survivors[0].process_group is not first_group
    for got in _all_reduce(survivors):
        assert got.tolist() == [2.0] * 4

    models = [_model(10), _model(12)]
    # Nobody waits: every rank keeps its own state and step.
    steps = run_ranks([(lambda g=g, m=m, s=s: g.sync(m, step=s))
                       for g, m, s in zip(survivors, models, (5, 5))])
    assert steps == [5, 5]
    assert not torch.equal(_state(models[0])[0], _state(models[1])[0])

    joined: List[ElasticGroup] = []
    newcomer_model = _model(99)

    def newcomer() -> int:
        joined.append(_join(cluster, name, 0, None))
        return joined[0].sync(newcomer_model, step=0)

    deadline = time.monotonic() + CALL_TIMEOUT

    def member(group: ElasticGroup, model: Any) -> int:
        # The members sync until the newcomer came in.
        while True:
            assert time.monotonic() < deadline, "the newcomer never came in"
            epoch = group.epoch
            step = group.sync(model, step=7)
            if group.epoch != epoch:
                return step

    got = run_ranks([(lambda: member(survivors[0], models[0])),
                     (lambda: member(survivors[1], models[1])), newcomer])
    assert got == [7, 7, 7]
    reference = _state(models[0])
    for model in (models[1], newcomer_model):
        for mine, rank0 in zip(_state(model), reference):
            assert torch.equal(mine, rank0)
    everyone = survivors + joined
    assert [g.rank for g in everyone] == [0, 1, 2]
    for got in _all_reduce(everyone):
        assert got.tolist() == [3.0] * 4
    for group in everyone:
        group.close()
