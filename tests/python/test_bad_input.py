"""Bad input is refused with InvalidArgument before the call takes a
sequence number, so the group goes on as if it had not happened.
"""

import array
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chorus
from conftest import CALL_TIMEOUT, Cluster, run_ranks, unique_group

NOWHERE = "127.0.0.1:1"  # nothing is sent there: the checks come first


def _refused(call: Any, *words: str) -> chorus.InvalidArgument:
    with pytest.raises(chorus.InvalidArgument) as caught:
        call()
    for word in words:
        assert word in caught.value.message, caught.value.message
    assert isinstance(caught.value, ValueError)
    return caught.value


def test_bad_input_leaves_no_gap_in_the_sequence(pair: Any) -> None:
    c = pair[0]
    before = c.next_sequence
    f32 = np.ones(4, np.float32)
    # dtypes
    _refused(lambda: c.all_reduce(f32, dtype="f24"), "unknown dtype", "bf16")
    _refused(lambda: c.all_reduce(np.ones(2, np.complex64)), "complex64")
    _refused(lambda: c.all_reduce(np.ones(2, bool)), "bool")
    _refused(lambda: c.all_reduce(np.ones(2, ">f4")), ">f4")
    _refused(lambda: c.all_reduce(f32, dtype="i32"), "float32", "i32")
    _refused(lambda: c.all_reduce(f32, dtype="bf16"), "float32")
    _refused(lambda: c.all_reduce(np.ones(3, np.uint16)), "uint16", "bf16")
    _refused(lambda: c.all_reduce(bytearray(6), dtype="f32"), "6 bytes")
    # not a buffer, or not contiguous
    _refused(lambda: c.all_reduce([1.0, 2.0]), "list", "numpy.asarray")
    _refused(lambda: c.all_reduce(np.ones(8, np.float32)[::2]),
             "not C-contiguous")
    _refused(lambda: c.all_reduce(np.asfortranarray(np.ones((3, 4)))),
             "not C-contiguous")
    _refused(lambda: c.all_reduce(memoryview(bytearray(8))[::2],
                                  dtype="u8"), "not C-contiguous")
    _refused(lambda: c.all_reduce(np.ones((4, 4), np.int32).T),
             "not C-contiguous")
    # sizes
    _refused(lambda: c.reduce_scatter(np.ones(3, np.float32)),
             "2 equal blocks")
    _refused(lambda: c.all_to_all(np.ones((3, 2), np.float32)),
             "2 equal blocks")
    _refused(lambda: c.scatter(np.float32(1.0), root=0), "2 equal blocks")
    _refused(lambda: c.all_reduce(f32, out=np.empty(3, np.float32)),
             "3 elements", "4")
    _refused(lambda: c.all_reduce(f32, out=np.empty(4, np.float64)),
             "float64", "f32")
    _refused(lambda: c.all_reduce(f32, out=bytes(16)), "read-only")
    read_only = np.empty(4, np.float32)
    read_only.flags.writeable = False
    _refused(lambda: c.all_reduce(f32, out=read_only), "read-only")
    _refused(lambda: c.all_gather(f32, out=np.empty(4, np.float32)),
             "4 elements", "8")
    # roots, ops, algorithms, timeouts
    _refused(lambda: c.reduce(f32, root=2), "root 2", "world size 2")
    _refused(lambda: c.broadcast(f32, root=-1), "root -1")
    _refused(lambda: c.gather(f32, root="0"), "root must be an int")
    _refused(lambda: c.all_reduce(f32, op="mean"), "unknown reduce op",
             "avg")
    _refused(lambda: c.all_reduce(f32, op=["sum"]), "unknown reduce op")
    _refused(lambda: c.all_reduce(f32, algorithm="fastest"),
             "unknown algorithm")
    _refused(lambda: c.all_gather(f32, algorithm="recursive_doubling"),
             "all_reduce only")
    _refused(lambda: c.all_reduce(f32, timeout=0), "timeout")
    _refused(lambda: c.all_reduce(f32, timeout=-1.0), "timeout")
    _refused(lambda: c.all_reduce(f32, timeout="soon"), "timeout")
    _refused(lambda: c.all_reduce(f32, device="cuda:x"), "index")
    # what non-roots receive
    _refused(lambda: c.broadcast(root=1), "shape= and dtype=")
    _refused(lambda: c.broadcast(root=1, shape=4), "dtype=")
    _refused(lambda: c.scatter(root=0), "must pass x")
    assert c.next_sequence == before
    # The group goes on: both ranks' next calls match.
    got = run_ranks([
        (lambda r=r: pair[r].all_reduce(np.full(2, r + 1, np.int64)))
        for r in range(2)])
    for g in got:
        np.testing.assert_array_equal(g, [3, 3])


def test_raw_buffers_need_a_dtype_only_when_untyped(pair: Any) -> None:
    got = run_ranks([
        lambda: pair[0].all_reduce(array.array("d", [1.0, 2.0])),
        lambda: pair[1].all_reduce(bytearray(np.array(
            [3.0, 4.0]).tobytes()), dtype="float64"),
    ])
    for g in got:
        assert g.dtype == np.float64
        np.testing.assert_array_equal(g, [4.0, 6.0])


@pytest.mark.parametrize("kwargs,words", [
    (dict(group="g", world_size=2, rank=2), ["rank 2", "world size 2"]),
    (dict(group="g", world_size=2, rank=-1), ["rank -1"]),
    (dict(group="g", world_size=0, rank=0), ["world_size"]),
    (dict(group="", world_size=1, rank=0), ["group"]),
    (dict(group="g", world_size="2", rank=0), ["world_size must be an int"]),
    (dict(group="g", world_size=1, rank=0, device="cpu:1"), ["index 0"]),
    (dict(group="g", world_size=1, rank=0, device="gp u"), ["invalid kind"]),
    (dict(group="g", world_size=1, rank=0, timeout=0), ["timeout"]),
    (dict(group="g", world_size=1, rank=0, max_message_bytes=0),
     ["max_message_bytes"]),
])
def test_join_checks_its_arguments_first(kwargs: Any, words: Any) -> None:
    _refused(lambda: chorus.join(worker=NOWHERE, **kwargs), *words)


def test_join_needs_its_environment(monkeypatch: pytest.MonkeyPatch,
                                    tmp_path: Path) -> None:
    for name in ("CHORUS_WORKER", "CHORUS_GROUP", "CHORUS_WORLD_SIZE",
                 "CHORUS_RANK", "WORLD_SIZE", "RANK", "CHORUS_TLS_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    _refused(lambda: chorus.join(), "CHORUS_GROUP")
    monkeypatch.setenv("CHORUS_GROUP", "g")
    _refused(lambda: chorus.join(), "CHORUS_WORLD_SIZE")
    monkeypatch.setenv("CHORUS_WORLD_SIZE", "two")
    _refused(lambda: chorus.join(), "CHORUS_WORLD_SIZE='two'")
    monkeypatch.setenv("CHORUS_WORLD_SIZE", "2")
    _refused(lambda: chorus.join(), "CHORUS_RANK")
    monkeypatch.setenv("CHORUS_RANK", "1")
    # Without a worker, join looks for the default socket, and says where
    # it looked and how to point at a worker instead.
    with pytest.raises(chorus.Unavailable) as caught:
        chorus.join()
    message = caught.value.message
    assert f"{tmp_path}/chorus/worker.sock" in message, message
    assert "CHORUS_WORKER" in message and "unix:" in message, message
    monkeypatch.setenv("CHORUS_WORKER", "/run/chorus/worker.sock")
    _refused(lambda: chorus.join(), "unix:/run/chorus/worker.sock")


def test_world_sizes_that_disagree(cluster: Cluster) -> None:
    group = unique_group()
    errors = run_ranks([
        (lambda: chorus.join(group, 2, 0, worker=cluster.address("w0"),
                             timeout=3.0)),
        (lambda: chorus.join(group, 3, 1, worker=cluster.address("w1"),
                             timeout=3.0)),
    ], capture=True)
    refused = [e for e in errors if isinstance(e, chorus.InvalidArgument)]
    assert len(refused) == 1, errors
    assert "world size" in refused[0].message


def test_dtype_names(pair: Any) -> None:
    assert chorus.DTYPES == ("f16", "bf16", "f32", "f64", "i8", "u8", "i32",
                             "i64", "u32", "u64")
    assert chorus.dtype_name("bfloat16") == "bf16"
    assert chorus.dtype_name(np.float16) == "f16"
    assert chorus.dtype_name(np.dtype("uint64")) == "u64"
    with pytest.raises(ValueError):
        chorus.dtype_name("float128")
    timeout_default = pair[0].timeout
    assert timeout_default == CALL_TIMEOUT
