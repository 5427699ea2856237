#!/usr/bin/python3
"""Unauthenticated connections against a TLS cluster: what they cost it.

Starts a chorus-coordinator and two chorus-workers with mutual TLS on
127.0.0.1 (certificates from scripts/dev_certs.sh), then measures, first
quietly and then while IDLE silent and TRICKLE trickling connections (one
handshake byte a second) are held open on every TCP port (the coordinator's
gRPC, call and metrics ports; each worker's gRPC, data and metrics ports),
reopening those the daemons close:

- an authenticated all_reduce of 2 ranks (two chorusctl through the
  workers' local sockets; the call crosses the coordinator and the data
  port), wall time;
- an admin's HTTPS scrape of the coordinator's /metrics, wall time;
- each daemon's threads and resident memory.

Prints a table with the quiet and flooded figures and their ratio. Usage:
  bench/preauth_flood.py [--build_dir=build] [--idle=1000] [--trickle=200]
"""

import argparse
import http.client
import os
import resource
import select
import socket
import ssl
import statistics
import subprocess
import tempfile
import threading
import time
from typing import Callable, Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A TLS record header announcing a 512-byte handshake message; its body
# then trickles in as zero bytes.
TLS_RECORD_HEAD = bytes([0x16, 0x03, 0x01, 0x02, 0x00])
# How long a collective or a scrape may take; one that fails or takes
# longer counts as this long.
TIMEOUT_S = 30


def timed(attempt: Callable[[], float]) -> float:
    """Returns attempt(), or TIMEOUT_S when it fails (it says why)."""
    try:
        return attempt()
    except Exception as error:  # a timeout, a refusal: reported, counted
        print(f"failed, counted as {TIMEOUT_S} s: {error!r}")
        return float(TIMEOUT_S)


def free_port() -> int:
    """Returns a TCP port on 127.0.0.1 nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 30.0) -> None:
    """Waits until something accepts connections on 127.0.0.1:`port`."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port}")


def proc_status(pid: int) -> Tuple[int, int]:
    """Returns (threads, resident KiB) of process `pid`."""
    threads, rss = 0, 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                threads = int(line.split()[1])
            elif line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return threads, rss


class Cluster:
    """A TLS coordinator and workers w0, w1 on loopback; stop() ends them."""

    def __init__(self, build: str, scratch: str) -> None:
        """Makes certificates in `scratch` and starts the daemons of `build`."""
        subprocess.run(
            [os.path.join(ROOT, "scripts/dev_certs.sh"), f"--out={scratch}/tls",
             "--workers=w0,w1", "--admins=admin", "--hosts=127.0.0.1"],
            check=True, capture_output=True)
        self.tls = f"{scratch}/tls"
        self.ports: Dict[str, int] = {}
        self.procs: Dict[str, subprocess.Popen] = {}
        c = {k: free_port() for k in ("grpc", "call", "metrics")}
        self.ports.update({f"coordinator {k}": v for k, v in c.items()})
        self._start("coordinator", [
            f"{build}/server/coordinator/chorus-coordinator",
            f"--listen=127.0.0.1:{c['grpc']}", f"--call_port={c['call']}",
            f"--metrics_listen=127.0.0.1:{c['metrics']}",
            f"--tls_dir={self.tls}/coordinator"], scratch)
        wait_port(c["grpc"])
        self.sockets = {}
        for name in ("w0", "w1"):
            w = {k: free_port() for k in ("grpc", "data", "metrics")}
            self.ports.update({f"{name} {k}": v for k, v in w.items()})
            self.sockets[name] = f"{scratch}/{name}.sock"
            self._start(name, [
                f"{build}/server/worker/chorus-worker", f"--name={name}",
                f"--coordinator=127.0.0.1:{c['grpc']}",
                f"--listen=127.0.0.1:{w['grpc']}", f"--data_port={w['data']}",
                f"--metrics_listen=127.0.0.1:{w['metrics']}",
                f"--local_socket={self.sockets[name]}",
                f"--tls_dir={self.tls}/worker-{name}"], scratch)
            wait_port(w["data"])
        self.build = build

    def _start(self, name: str, argv: List[str], scratch: str) -> None:
        log = open(f"{scratch}/{name}.log", "w")
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=log)

    def all_reduce_seconds(self) -> float:
        """Runs one 2-rank all_reduce through the workers; returns its time."""
        group = f"g{time.monotonic_ns()}"
        start = time.monotonic()
        ranks = [subprocess.Popen(
            [f"{self.build}/client/chorusctl", f"--worker=unix:{self.sockets[w]}",
             f"--group={group}", "--world=2", f"--rank={r}",
             f"--timeout={TIMEOUT_S}s",
             "allreduce", "1", "2"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for r, w in enumerate(("w0", "w1"))]
        outs = [p.communicate(timeout=TIMEOUT_S)[0] for p in ranks]
        elapsed = time.monotonic() - start
        for p, out in zip(ranks, outs):
            if p.returncode != 0 or "2 4" not in out:
                raise RuntimeError(f"all_reduce failed: {out}")
        return elapsed

    def scrape_seconds(self) -> float:
        """Scrapes the coordinator's /metrics as the admin; returns the time."""
        context = ssl.create_default_context(cafile=f"{self.tls}/admin-admin/ca.pem")
        context.load_cert_chain(f"{self.tls}/admin-admin/cert.pem",
                                f"{self.tls}/admin-admin/key.pem")
        start = time.monotonic()
        conn = http.client.HTTPSConnection(
            "127.0.0.1", self.ports["coordinator metrics"], context=context,
            timeout=TIMEOUT_S)
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        response.read()
        conn.close()
        if response.status != 200:
            raise RuntimeError(f"scrape answered {response.status}")
        return time.monotonic() - start

    def stop(self) -> None:
        """Ends every daemon."""
        for p in self.procs.values():
            p.terminate()
        for p in self.procs.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


class Flood:
    """Holds idle and trickling connections open on ports until stop()."""

    def __init__(self, ports: List[int], idle: int, trickle: int) -> None:
        """Opens `idle` + `trickle` connections to each of `ports`."""
        self.conns: List[List] = []  # [socket, port, trickles, bytes sent]
        for port in ports:
            for i in range(idle + trickle):
                self.conns.append([self._open(port), port, i >= idle, 0])
        self.reopened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    @staticmethod
    def _open(port: int) -> socket.socket:
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        return s

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            poller = select.poll()
            by_fd = {}
            for c in self.conns:
                poller.register(c[0], select.POLLIN)
                by_fd[c[0].fileno()] = c
            closed = {fd for fd, _ in poller.poll(0)}
            for fd, c in by_fd.items():
                if fd in closed:  # the daemon closed it: open another
                    c[0].close()
                    c[0], c[3] = self._open(c[1]), 0
                    self.reopened += 1
                elif c[2]:
                    byte = TLS_RECORD_HEAD[c[3]:c[3] + 1] or b"\0"
                    try:
                        c[0].send(byte)
                        c[3] += 1
                    except OSError:
                        pass

    def stop(self) -> None:
        """Closes every connection."""
        self._stop.set()
        self._thread.join()
        for c in self.conns:
            c[0].close()


def measure(cluster: Cluster, rounds: int) -> Dict[str, float]:
    """Median collective and scrape times, and each daemon's threads/memory."""
    out = {"all_reduce s": statistics.median(
        timed(cluster.all_reduce_seconds) for _ in range(rounds)),
        "scrape s": statistics.median(
            timed(cluster.scrape_seconds) for _ in range(rounds))}
    for name, p in cluster.procs.items():
        threads, rss = proc_status(p.pid)
        out[f"{name} threads"] = threads
        out[f"{name} MiB"] = rss / 1024
    return out


def main() -> None:
    """Runs the quiet and flooded measurements and prints the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build_dir", default=os.path.join(ROOT, "build"))
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--trickle", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=8.0,
                        help="seconds the flood runs before measuring")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory(prefix="chorus-flood-") as scratch:
        cluster = Cluster(os.path.abspath(args.build_dir), scratch)
        try:
            cluster.all_reduce_seconds()  # the first join warms up
            quiet = measure(cluster, args.rounds)
            flood = Flood(list(cluster.ports.values()), args.idle, args.trickle)
            time.sleep(args.settle)
            flooded = measure(cluster, args.rounds)
            reopened = flood.reopened
            flood.stop()
        finally:
            cluster.stop()
    print(f"{args.idle} idle + {args.trickle} trickling connections on each of "
          f"{len(cluster.ports)} ports ({reopened} reopened after the daemons "
          f"closed them); medians of {args.rounds}")
    print(f"{'':22s} {'quiet':>10s} {'flooded':>10s} {'ratio':>7s}")
    for key, value in quiet.items():
        ratio = flooded[key] / value if value else float("nan")
        print(f"{key:22s} {value:10.3f} {flooded[key]:10.3f} {ratio:7.2f}")


if __name__ == "__main__":
    main()
