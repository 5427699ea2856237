"""Python ranks and chorus-bench through a coordinator failover.

Two coordinators elected on a real etcd (Debian's etcd-server, started here
on loopback); embedded ranks given both (coordinator="a,b") run
all-reduces while the leader is killed with SIGKILL: every result is right,
the application sees no error. chorus-bench given a list whose first entry
is gone runs against the leader. Skipped where etcd or the embedded worker
is not installed.
"""

import json
import shutil
import socket
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Dict, Iterator, List

import numpy as np
import pytest

import chorus
from chorus import embedded
from conftest import Daemon, run_ranks, unique_group

LEASE = "2s"
ROUNDS_BEFORE, ROUNDS_AFTER = 5, 5

pytestmark = [
    pytest.mark.skipif(shutil.which("etcd") is None,
                       reason="etcd is not installed (scripts/setup.sh "
                              "installs Debian's etcd-server)"),
    pytest.mark.skipif(not embedded.available(),
                       reason="chorus._embedded is not installed"),
]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[str]:
    """A one-member etcd on loopback; yields its client URL."""
    client = f"http://127.0.0.1:{free_port()}"
    peer = f"http://127.0.0.1:{free_port()}"
    with open(tmp_path / "etcd.log", "wb") as log:
        process = subprocess.Popen(
            ["etcd", "--name=py", f"--data-dir={tmp_path / 'etcd-data'}",
             f"--listen-client-urls={client}",
             f"--advertise-client-urls={client}",
             f"--listen-peer-urls={peer}",
             f"--initial-advertise-peer-urls={peer}",
             f"--initial-cluster=py={peer}"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, (tmp_path / "etcd.log").read_text()
            try:
                with urllib.request.urlopen(f"{client}/health",
                                            timeout=2) as answer:
                    if json.load(answer).get("health") == "true":
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "etcd is not healthy"
            time.sleep(0.1)
        yield client
    finally:
        process.kill()
        process.wait(timeout=30)


def wait_for_log(daemon: Daemon, text: str, timeout: float = 60) -> None:
    """Waits until `text` is in the daemon's log."""
    deadline = time.monotonic() + timeout
    while text not in daemon.log_path.read_text(errors="replace"):
        assert time.monotonic() < deadline, (
            f"{daemon.name} never logged {text!r}:\n{daemon.log_tail()}")
        time.sleep(0.05)


@pytest.fixture
def coordinators(etcd: str, bins: Dict[str, Path],
                 tmp_path: Path) -> Iterator[List[Daemon]]:
    """Two coordinators on `etcd`, the first leading."""
    prefix = f"/py-{uuid.uuid4().hex[:8]}"
    started: List[Daemon] = []

    def start(i: int) -> Daemon:
        daemon = Daemon(f"coordinator{i}", [
            str(bins["chorus-coordinator"]), "--listen=127.0.0.1:0",
            f"--etcd={etcd}", f"--etcd_prefix={prefix}",
            f"--lease_timeout={LEASE}"], tmp_path)
        started.append(daemon)
        return daemon

    try:
        wait_for_log(start(0), "leading the cluster")
        wait_for_log(start(1), "coordinator leader: ")
        yield started
    finally:
        for daemon in started:
            daemon.stop()


def test_embedded_ranks_leader_killed_every_result_right(
        coordinators: List[Daemon]) -> None:
    listing = ",".join(d.address for d in coordinators)
    workers = [chorus.EmbeddedWorker(listing, name=f"failover-{r}")
               for r in range(2)]
    group = unique_group("failover")
    try:
        comms = run_ranks([
            (lambda r=r: chorus.join(group, 2, r, worker=workers[r]))
            for r in range(2)])
        for round_ in range(1, ROUNDS_BEFORE + ROUNDS_AFTER + 1):
            if round_ == ROUNDS_BEFORE + 1:
                coordinators[0].kill()
            got = run_ranks([
                (lambda c=c, r=r: c.all_reduce(
                    np.full(4, (r + 1) * round_, np.int64)))
                for r, c in enumerate(comms)])
            for out in got:
                np.testing.assert_array_equal(out, np.full(4, 3 * round_))
        for comm in comms:
            comm.close()
    finally:
        for worker in workers:
            worker.close()
    wait_for_log(coordinators[1], "leading the cluster", timeout=5)


def test_chorus_bench_first_coordinator_gone_runs_on_the_leader(
        coordinators: List[Daemon], bins: Dict[str, Path]) -> None:
    bench = bins["chorusctl"].parent.parent / "bench" / "chorus-bench"
    if not bench.exists():
        pytest.skip("chorus-bench is not built (CHORUS_BENCH=OFF)")
    coordinators[0].kill()
    wait_for_log(coordinators[1], "leading the cluster")
    listing = ",".join(d.address for d in coordinators)
    done = subprocess.run(
        [str(bench), f"--coordinator={listing}", "--ranks=2",
         "--min_bytes=8", "--max_bytes=1K", "--iters=5", "--warmup=1",
         "--check", "--format=csv", "--timeout=60s"],
        capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    sizes = [line.split(",")[0] for line in done.stdout.splitlines()[1:]]
    assert "8" in sizes and "1024" in sizes, done.stdout
