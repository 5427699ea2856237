"""Failures in torch terms on the chorus backend: ranks that call different
collectives, and a rank lost in the middle of DDP training. Every rank
gets an exception carrying the Chorus status; nothing hangs.

Each rank_... function runs in the rank processes (see torch_support.py).
"""

import time
from pathlib import Path
from typing import Any, Dict

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from conftest import Cluster, unique_group  # noqa: E402
from torch_support import RankContext, RankProcesses  # noqa: E402

WORLD = 3
LEASE = 2.0  # seconds: --lease_timeout of the coordinator that loses a rank
# The deadline of the group whose rank process dies with its worker alive:
# short, so the test is quick; long enough for three ranks to start and
# join on a busy machine.
SHORT_TIMEOUT = 8.0
# How late after its bound a survivor's error may come: the error has to
# reach the trainer from the coordinator, through the worker and the
# backend.
SLACK = 1.0


@pytest.fixture(scope="module")
def ranks(cluster: Cluster) -> Any:
    """Three chorus ranks: 0 and 2 on worker w0, 1 on w1."""
    w0, w1 = cluster.address("w0"), cluster.address("w1")
    with RankProcesses([w0, w1, w0], unique_group("torch")) as processes:
        yield processes


def small_model() -> Any:
    """A model whose gradients fill one DDP bucket."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 1))


# --- ranks that disagree -----------------------------------------------------


def rank_different_collectives(ctx: RankContext) -> float:
    x = torch.ones(4)
    if ctx.rank == 0:
        dist.all_reduce(x)
    elif ctx.rank == 1:
        dist.broadcast(x, src=0)
    else:
        dist.all_gather_into_tensor(torch.zeros(4 * ctx.world_size), x)
    return 0.0  # not reached: every rank raises


def rank_all_reduce_once(ctx: RankContext) -> float:
    x = torch.ones(1)
    dist.all_reduce(x)
    return x.item()


ACCOUNT = {"0": "all_reduce f32[4] sum", "1": "broadcast f32[4] root 0",
           "2": "all_gather f32[4]"}


def test_different_collectives_raise_the_per_rank_account_on_every_rank(
        ranks: RankProcesses) -> None:
    replies = ranks.run(rank_different_collectives)
    for reply in replies:
        error = reply.error
        assert error is not None, reply
        assert error["type"] == "InvalidArgument", error["traceback"]
        assert error["code"] == "INVALID_ARGUMENT"
        assert error["ranks"] == ACCOUNT
        assert "does not match across ranks" in error["message"]
        for rank, call in ACCOUNT.items():
            assert f"rank {rank}: {call}" in error["traceback"]
    # The call used its number on every rank; the group goes on.
    assert ranks.values(rank_all_reduce_once) == [float(WORLD)] * WORLD


def rank_ddp_against_a_barrier(ctx: RankContext) -> None:
    model = torch.nn.parallel.DistributedDataParallel(small_model())
    loss = model(torch.randn(4, 8)).pow(2).mean()
    if ctx.rank == 2:
        dist.barrier()  # where the others reduce their gradients
    else:
        loss.backward()


def test_ddp_backward_against_another_collective_raises_on_every_rank(
        ranks: RankProcesses) -> None:
    params = sum(p.numel() for p in small_model().parameters())
    replies = ranks.run(rank_ddp_against_a_barrier)
    account = "rank 2: barrier"
    for reply in replies[:2]:
        error = reply.error
        assert error is not None, reply
        # DDP reads the failed future in C++: a RuntimeError with the text.
        assert error["type"] == "RuntimeError", error["traceback"]
        assert "does not match across ranks" in error["message"]
        assert f"all_reduce f32[{params}] sum" in error["message"]
        assert account in error["traceback"]
    barrier = replies[2].error
    assert barrier is not None and barrier["type"] == "InvalidArgument"
    assert barrier["ranks"]["2"] == "barrier"
    assert barrier["ranks"]["0"] == f"all_reduce f32[{params}] sum"
    assert ranks.values(rank_all_reduce_once) == [float(WORLD)] * WORLD


# --- a rank lost while training ----------------------------------------------


def rank_train_until_error(ctx: RankContext, steps: int) -> int:
    model = torch.nn.parallel.DistributedDataParallel(small_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(ctx.rank)
    for step in range(steps):
        optimizer.zero_grad()
        loss = model(torch.randn(4, 8, generator=generator)).pow(2).mean()
        loss.backward()
        optimizer.step()
        ctx.report(step=step)
    return steps


def _train_and_kill(processes: RankProcesses, doomed: int,
                    kill: Any) -> Dict[int, Dict[str, Any]]:
    """Starts training on every rank, calls kill() once rank `doomed` has
    taken a few steps, and returns the survivors' errors by rank, each
    with "after": seconds from the kill to the error.
    """
    processes.start(rank_train_until_error, steps=1_000_000)
    while processes.progress(doomed)["step"] < 3:
        pass
    killed_at = time.time()
    kill()
    errors = {}
    for rank in range(processes.world_size):
        if rank == doomed:
            continue
        reply = processes.result(rank)
        assert reply.error is not None, reply
        errors[rank] = dict(reply.error, after=reply.error["at"] - killed_at)
    return errors


def test_killed_rank_and_worker_make_the_others_raise_within_the_lease(
        tmp_path: Path) -> None:
    own = Cluster(tmp_path, workers=("w0", "w1", "w2"),
                  coordinator_flags=[f"--lease_timeout={LEASE:g}s"])
    try:
        processes = RankProcesses(
            [own.address(w) for w in ("w0", "w1", "w2")],
            unique_group("torch"))
        try:
            def kill() -> None:  # the rank's host goes away
                processes.kill(2)
                own.workers["w2"].kill()

            errors = _train_and_kill(processes, 2, kill)
            for rank, error in errors.items():
                assert error["type"] == "RuntimeError", error["traceback"]
                # The worker's loss, or, when the worker saw its client's
                # hold end before it died itself, the rank's.
                assert ('rank 2 on worker "w2"' in error["message"] or
                        "rank 2 is gone" in error["message"]), error["message"]
                assert "aborted" in error["message"]
                assert error["after"] <= LEASE + SLACK, error
        finally:
            statuses = processes.close()
        assert statuses[:2] == [0, 0], processes.output()
    finally:
        own.stop()


def test_killed_rank_process_makes_the_others_raise_within_the_lease(
        cluster: Cluster) -> None:
    w0, w1 = cluster.address("w0"), cluster.address("w1")
    processes = RankProcesses([w0, w1, w0], unique_group("torch"),
                              timeout=SHORT_TIMEOUT)
    try:
        # Rank 2's worker stays up and sees its client's hold end: it
        # reports the rank gone, and the group is aborted naming it.
        errors = _train_and_kill(processes, 2, lambda: processes.kill(2))
        for rank, error in errors.items():
            assert error["type"] == "RuntimeError", error["traceback"]
            assert "rank 2 is gone" in error["message"], error["message"]
            assert "client process went away" in error["message"]
            assert error["after"] <= LEASE + SLACK, error
    finally:
        statuses = processes.close()
    assert statuses[:2] == [0, 0], processes.output()
