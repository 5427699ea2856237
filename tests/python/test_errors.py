"""Errors from real daemons: their classes, codes and the attributes parsed
from their statuses.
"""

from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

import chorus
from conftest import (CALL_TIMEOUT, Cluster, call_with_a_rank_missing,
                      join_all, run_ranks, unique_group)

REFUSAL = "Distributed operations are not supported for device Vulkan(0)"
# Short enough to keep the suite quick, long enough that the coordinator's
# verdict (sent a little before the deadline) arrives before it.
SHORT = 3.0


def test_mismatch_gives_every_rank_the_account(pair: Any) -> None:
    sequence = pair[0].next_sequence
    errors = run_ranks([
        lambda: pair[0].all_reduce(np.zeros(3, np.float32)),
        lambda: pair[1].all_reduce(np.zeros(2, np.float32)),
    ], capture=True)
    for error in errors:
        assert isinstance(error, chorus.InvalidArgument), error
        assert isinstance(error, ValueError)
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT
        assert error.ranks == {0: "all_reduce f32[3] sum",
                               1: "all_reduce f32[2] sum"}
        assert error.sequence == sequence
        assert error.group == pair[0].group
        assert "does not match across ranks" in error.message
        # The facts come from the server's ErrorDetail, not only the text.
        assert error.reason == "MISMATCH"
        assert error.details[0][0] == "chorus.v1.ErrorDetail"
        assert error.number_used is True
    # The call used up its number on both ranks; the group goes on.
    got = run_ranks([(lambda c=c: c.all_reduce(np.ones(2, np.int32)))
                     for c in pair])
    for g in got:
        np.testing.assert_array_equal(g, [2, 2])


def test_mismatched_kinds_and_roots(pair: Any) -> None:
    errors = run_ranks([
        lambda: pair[0].broadcast(np.zeros(4, np.int8), root=0),
        lambda: pair[1].reduce(np.zeros(4, np.int8), root=1, op="max"),
    ], capture=True)
    for error in errors:
        assert isinstance(error, chorus.InvalidArgument), error
        assert error.ranks == {0: "broadcast i8[4] root 0",
                               1: "reduce i8[4] max root 1"}


def test_deadline_names_the_missing_rank(cluster: Cluster) -> None:
    errors, group = call_with_a_rank_missing(cluster, SHORT)
    for error in errors:
        assert isinstance(error, chorus.DeadlineExceeded), error
        assert isinstance(error, TimeoutError)
        assert error.missing_ranks == [2]
        assert error.reason == "RANKS_MISSING"
        assert error.sequence == 1
        assert error.number_used is True
        assert error.group == group
        assert error.message == (
            f"rank 2 of group {group} did not reach all_reduce "
            "#1 within the deadline")


def test_join_deadline_names_the_missing_ranks(cluster: Cluster) -> None:
    group = unique_group()
    errors = run_ranks([
        (lambda r=r: chorus.join(group, 4, r, worker=cluster.address("w0"),
                                 timeout=SHORT))
        for r in (0, 3)], capture=True)
    for joined, error in zip((0, 3), errors):
        assert isinstance(error, chorus.DeadlineExceeded), error
        # Ranks 1 and 2 never came. The coordinator counts a rank whose own
        # join already timed out as missing too, so the rank that times out
        # second may also name the first.
        assert {1, 2} <= set(error.missing_ranks) <= {0, 1, 2, 3} - {joined}
        assert error.reason == "RANKS_MISSING"
        assert error.group == group
        assert "did not join within the deadline" in error.message


def test_killed_worker_aborts_the_group(tmp_path: Path) -> None:
    own = Cluster(tmp_path, workers=("keep", "doomed"),
                  coordinator_flags=["--lease_timeout=2s"])
    try:
        comms = join_all([own.address("keep"), own.address("doomed")])
        run_ranks([(lambda c=c: c.barrier()) for c in comms])
        doomed_id_hint = comms[1].group
        own.workers["doomed"].kill()
        # Pending and later calls on the group are aborted, naming the lost
        # worker and its rank, once its lease runs out.
        for _ in range(2):
            with pytest.raises(chorus.Aborted) as caught:
                comms[0].all_reduce(np.ones(4, np.float32),
                                    timeout=CALL_TIMEOUT)
            error = caught.value
            assert error.code == grpc.StatusCode.ABORTED
            assert error.lost_worker == "doomed"
            assert error.reason == "WORKER_LOST"
            assert error.lost_rank == 1 and error.lost_ranks == [1]
            assert isinstance(error.lost_worker_id, int)
            assert error.group == doomed_id_hint
            assert error.epoch == comms[0].epoch
        for c in comms:
            c.close()
    finally:
        own.stop()


def test_vulkan_join_is_refused(cluster: Cluster) -> None:
    with pytest.raises(chorus.Unimplemented) as caught:
        chorus.join(unique_group(), 1, 0, worker=cluster.address("w0"),
                    device="vulkan:0", timeout=CALL_TIMEOUT)
    assert caught.value.message == REFUSAL
    assert caught.value.device == "Vulkan(0)"
    assert caught.value.reason == "DEVICE_UNSUPPORTED"
    assert caught.value.code == grpc.StatusCode.UNIMPLEMENTED


def test_vulkan_call_is_refused_and_the_others_told(pair: Any) -> None:
    errors = run_ranks([
        lambda: pair[0].all_reduce(np.ones(2, np.float32)),
        lambda: pair[1].all_reduce(np.ones(2, np.float32),
                                   device="Vulkan(0)"),
    ], capture=True)
    refused, told = errors[1], errors[0]
    assert isinstance(refused, chorus.Unimplemented), refused
    assert refused.message.startswith(REFUSAL)
    assert refused.device == "Vulkan(0)"
    assert isinstance(told, chorus.FailedPrecondition), told
    assert told.reason == "DEVICE_REFUSED"
    assert told.device == "Vulkan(0)"
    assert list(told.ranks) == [1] and told.ranks[1].startswith(REFUSAL)


def test_unreachable_worker_is_unavailable(tmp_path: Path) -> None:
    import socket
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(chorus.Unavailable) as caught:
        chorus.join(unique_group(), 1, 0, worker=f"127.0.0.1:{port}",
                    timeout=1.0)
    assert f"127.0.0.1:{port}" in caught.value.message
    assert isinstance(caught.value, ConnectionError)


def test_rank_joined_twice(cluster: Cluster) -> None:
    group = unique_group()
    errors = run_ranks([
        (lambda: chorus.join(group, 2, 0, worker=cluster.address("w0"),
                             timeout=SHORT)),
        (lambda: chorus.join(group, 2, 0, worker=cluster.address("w1"),
                             timeout=SHORT)),
    ], capture=True)
    kinds = sorted(type(e).__name__ for e in errors)
    # One of them holds the slot until its deadline; the other is refused.
    assert kinds == ["DeadlineExceeded", "InvalidArgument"], errors
    refused = next(e for e in errors if isinstance(e, chorus.InvalidArgument))
    assert "already joined" in refused.message


def test_tensor_over_the_daemons_cap_is_refused_without_a_number(
        cluster: Cluster) -> None:
    cap = 8 * 2 ** 20
    workers = [cluster.add_worker(f"capped{r}", [f"--max_tensor_bytes={cap}"])
               for r in range(2)]
    try:
        comms = join_all([w.address for w in workers])
        big = np.zeros(cap // 4 + 1, np.float32)
        with pytest.raises(chorus.ResourceExhausted) as caught:
            comms[0].all_reduce(big, timeout=CALL_TIMEOUT)
        assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"limit of {cap} bytes per tensor (--max_tensor_bytes)" in \
            caught.value.message
        assert caught.value.number_used is False
        # A result over the cap is refused too.
        with pytest.raises(chorus.ResourceExhausted) as caught:
            comms[0].all_gather(np.zeros(cap // 8 + 1, np.float32),
                                timeout=CALL_TIMEOUT)
        assert "output of" in caught.value.message
        # Neither took a number: the next call of both ranks matches.
        assert comms[0].next_sequence == 1
        x = np.full(cap // 8, 1.5, np.float32)  # streamed, under the cap
        got = run_ranks([(lambda c=c: c.all_reduce(x, timeout=CALL_TIMEOUT))
                         for c in comms])
        for g in got:
            assert np.array_equal(g, x * 2)
        for comm in comms:
            comm.close()
    finally:
        for w in workers:
            w.stop()


def test_tensor_of_the_whole_message_limit_comes_back(
        cluster: Cluster) -> None:
    (comm,) = join_all([cluster.address("w0")])
    with comm:
        # Over what one message holds with the request's other fields.
        x = np.arange(chorus.MAX_MESSAGE_BYTES, dtype=np.uint8)
        work = comm.all_reduce(x, timeout=CALL_TIMEOUT, async_op=True)
        assert np.array_equal(work.result(), x)
        assert comm.next_sequence == 2


def test_results_over_grpc_default_limit_come_back(pair: Any) -> None:
    # 2 x 3 MiB gathered: a 6 MiB reply, over gRPC's default 4 MiB limit.
    x = [np.full(3 * 2 ** 18, r + 1, np.float32) for r in range(2)]
    got = run_ranks([
        (lambda r=r: pair[r].all_gather(x[r], timeout=CALL_TIMEOUT))
        for r in range(2)])
    for g in got:
        np.testing.assert_array_equal(g, np.stack(x))
