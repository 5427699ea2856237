"""ChorusStore: torch's distributed store in the Chorus coordinator, tried
with the cases of torch's own store tests (set/get, add, compare_set, wait
and its timeout, check, delete_key, num_keys), through a PrefixStore as
torch's groups use it, and as the rendezvous of
init_process_group("chorus", init_method="chorus://...").
"""
import datetime
from typing import Any, Dict

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import chorus.torch  # noqa: E402,F401  (registers chorus://)
from chorus.errors import DeadlineExceeded, InvalidArgument  # noqa: E402
from chorus.errors import ResourceExhausted  # noqa: E402
from chorus.torch import ChorusStore  # noqa: E402
from conftest import Cluster, unique_group  # noqa: E402
from torch_support import RankContext, RankProcesses  # noqa: E402


@pytest.fixture
def store(cluster: Cluster) -> Any:
    """A ChorusStore on the cluster's coordinator, its keys under a prefix
    of this test's own (the tests share the default job's store)."""
    plain = ChorusStore(cluster.coordinator.address,
                        datetime.timedelta(seconds=10))
    # torch calls the Python store through the object: it must live on.
    yield dist.PrefixStore(unique_group("store"), plain)
    del plain


def test_set_get_overwrites_and_returns_bytes(store: Any) -> None:
    store.set("key0", "value0")
    store.set("key1", b"value1")
    store.set("key0", "value2")
    assert store.get("key0") == b"value2"
    assert store.get("key1") == b"value1"


def test_add_counts_from_zero_and_get_reads_the_number(store: Any) -> None:
    assert store.add("counter", 1) == 1
    assert store.add("counter", 5) == 6
    assert store.add("counter", -8) == -2
    assert store.get("counter") == b"-2"


def test_compare_set_follows_torch(store: Any) -> None:
    store.set("cs", "first")
    assert store.compare_set("cs", "wrong", "second") == b"first"
    assert store.compare_set("cs", "first", "second") == b"second"
    assert store.get("cs") == b"second"
    # A missing key is set only when nothing is expected.
    assert store.compare_set("missing", "x", "y") == b"x"
    assert store.compare_set("missing", "", "y") == b"y"


def test_wait_returns_once_set_and_times_out_otherwise(store: Any) -> None:
    store.set("ready", "1")
    store.wait(["ready"], datetime.timedelta(seconds=5))
    with pytest.raises(Exception) as raised:
        store.wait(["never"], datetime.timedelta(milliseconds=300))
    # torch reports the chorus error it raised (a DeadlineExceeded naming
    # the key) as its own RuntimeError on the C++ side of PrefixStore.
    assert "never" in str(raised.value)


def test_check_delete_and_num_keys(cluster: Cluster) -> None:
    plain = ChorusStore(cluster.coordinator.address,
                        datetime.timedelta(seconds=10))
    prefix = unique_group("count")
    plain.set(f"{prefix}/a", "1")
    before = plain.num_keys()
    plain.set(f"{prefix}/b", "2")
    assert plain.num_keys() == before + 1
    assert plain.check([f"{prefix}/a", f"{prefix}/b"])
    assert not plain.check([f"{prefix}/a", f"{prefix}/c"])
    assert plain.delete_key(f"{prefix}/b")
    assert not plain.delete_key(f"{prefix}/b")
    assert plain.num_keys() == before


def test_get_of_a_missing_key_ends_at_the_timeout(cluster: Cluster) -> None:
    plain = ChorusStore(cluster.coordinator.address,
                        datetime.timedelta(milliseconds=300))
    with pytest.raises(DeadlineExceeded, match="never-set"):
        plain.get(unique_group("never-set"))


def test_bad_input_is_refused_and_changes_nothing(cluster: Cluster) -> None:
    plain = ChorusStore(cluster.coordinator.address,
                        datetime.timedelta(seconds=10))
    before = plain.num_keys()
    with pytest.raises(ResourceExhausted, match="at most 4096"):
        plain.set("k" * 5000, "v")
    with pytest.raises(ResourceExhausted, match="value"):
        plain.set(unique_group("big"), b"v" * (5 << 20))
    key = unique_group("text")
    plain.set(key, "not a number")
    with pytest.raises(InvalidArgument, match="not a number"):
        plain.add(key, 1)
    assert plain.get(key) == b"not a number"
    assert plain.num_keys() == before + 1
    with pytest.raises(InvalidArgument, match="no coordinator"):
        ChorusStore(" , ")


def rank_all_reduce(ctx: RankContext) -> Dict[str, Any]:
    tensor = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(tensor)
    return {"sum": float(tensor[0]), "store": type(
        dist.distributed_c10d._get_default_store()).__name__}


def test_init_method_chorus_needs_no_master_addr(cluster: Cluster) -> None:
    addresses = [cluster.address("w0"), cluster.address("w1")]
    init_method = f"chorus://{cluster.coordinator.address}"
    ranks = RankProcesses(addresses, unique_group("chorus-init"),
                          init_method=init_method)
    try:
        values = ranks.values(rank_all_reduce)
    finally:
        assert ranks.close() == [0, 0], ranks.output()
    for value in values:
        assert value["sum"] == 3.0
        # torch wraps the rendezvous store in a PrefixStore.
        assert value["store"] in ("PrefixStore", "ChorusStore")
