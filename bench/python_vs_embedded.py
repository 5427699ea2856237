#!/usr/bin/env python3
r"""All-reduce through the Python client next to chorus-bench's embedded ranks.

One invocation measures all_reduce, f32, sum over the same sizes twice, on
127.0.0.1, and prints one table:

- python: a chorus-coordinator and one chorus-worker daemon per rank are
  started from the build tree, each serving its own Unix socket in a
  scratch folder (--local_socket, not the default one they would share);
  each rank is a Python process that joins with
  ``chorus.join(..., worker="unix:...")`` through its own daemon, sends its
  calls on the daemon's call socket (--call_socket=on, the default) or as
  gRPC calls (off), and times ``comm.all_reduce(x, out=out)``; x and out
  are numpy arrays (--buffers=numpy: the client copies them into and out
  of memory it shares with the daemon), arrays from comm.shared_array()
  (--buffers=shared: the daemon reads and writes them in place), or numpy
  arrays with shared memory off (--buffers=stream). With --worker=embedded
  no worker daemon runs: each Python rank joins with
  ``chorus.join(..., coordinator=...)`` and so runs the worker runtime in
  its own process (chorus.embedded; the package must have been installed
  with CHORUS_BUILD_DIR naming the build); there the rank's runtime reads x
  and writes out in place, whatever --buffers says.
- embedded: ``chorus-bench --collective=all_reduce --dtype=f32 --op=sum
  --format=csv`` once per size, whose ranks embed a WorkerRuntime in their own
  processes (no hop to a daemon).

Both follow chorus-bench's rules (bench/README.md, "How each size is
measured"): warm-up, iterations adapted to --time_per_size, a barrier, the
timed calls back to back; each rank times every call, and a size's time is
the median over the iterations of the slowest rank's time. The table marks
the targets of issue 16: from 64 MiB up the Python time within 1.25x of the
embedded one, at 8 B within 2x.

From the top of a built checkout, with the package installed into
build/python (client/python/README.md):

    /usr/bin/python3 bench/python_vs_embedded.py --ranks=2
    /usr/bin/python3 bench/python_vs_embedded.py --ranks=4 --sizes=8,64M \
        --time_per_size=1s
    /usr/bin/python3 bench/python_vs_embedded.py --worker=embedded \
        --same_host_plan=off --sizes=64M

Every RPC has a deadline (--timeout), the whole run is bounded by --max_time,
and every process it starts is stopped on success, error or Ctrl-C.
"""

import argparse
import ctypes
import math
import multiprocessing
import multiprocessing.connection
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
MIB = 1 << 20
F32_BYTES = 4
# Issue 16, item 5: (smallest size the target applies to, largest, ratio).
TARGETS: Tuple[Tuple[int, Optional[int], float], ...] = (
    (8, 8, 2.0),
    (64 * MIB, None, 1.25),
)
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10,
          "M": MIB, "MB": MIB, "MIB": MIB, "G": 1 << 30, "GB": 1 << 30,
          "GIB": 1 << 30}


# --buffers: what the Python ranks pass to all_reduce.
_BUFFERS = {
    "numpy": "numpy arrays, copied into and out of memory shared with the "
             "daemon (where it shares none: streamed); embedded ranks' "
             "runtimes read and write them in place",
    "shared": "x and out from comm.shared_array(), read and written by the "
              "daemon in place",
    "stream": "numpy arrays, shared memory off: messages, or "
              "CollectiveChunked streams over 4 MiB",
}


class BenchError(Exception):
    """A failure that ends the run: a daemon that did not start, a rank that
    failed or went silent, chorus-bench failing, the time limit."""


# --- parsing ----------------------------------------------------------------


def parse_size(text: str) -> int:
    """Parses a byte count such as "8", "64K", "1M" or "256MiB" (binary
    units)."""
    match = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).upper() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}")
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def parse_sizes(text: str) -> List[int]:
    """Parses a comma-separated size list; every size must be a positive
    multiple of 4 bytes (whole f32 elements)."""
    sizes = [parse_size(part) for part in text.split(",") if part.strip()]
    if not sizes:
        raise argparse.ArgumentTypeError("no sizes")
    for size in sizes:
        if size <= 0 or size % F32_BYTES:
            raise argparse.ArgumentTypeError(
                f"{size} B is not a positive multiple of {F32_BYTES} B")
    return sorted(set(sizes))


def parse_duration(text: str) -> float:
    """Parses a duration in seconds: "2", "2s", "500ms", "1m"."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|min)?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r}")
    scale = {None: 1.0, "s": 1.0, "ms": 1e-3, "m": 60.0, "min": 60.0}
    seconds = float(match.group(1)) * scale[match.group(2)]
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"duration must be positive: {text}")
    return seconds


def default_sizes() -> List[int]:
    """8 B to 256 MiB in steps of x8, plus 64 MiB and 256 MiB, where the
    issue's large-size target starts and ends."""
    sizes = []
    size = 8
    while size <= 256 * MIB:
        sizes.append(size)
        size *= 8
    return sorted(set(sizes + [64 * MIB, 256 * MIB]))


def format_size(size: int) -> str:
    """Formats a byte count as "8 B", "64 KiB", "256 MiB"."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


# --- processes --------------------------------------------------------------


def _die_with_parent() -> None:
    """Runs in a child before it starts: SIGKILL it when this process dies,
    so that nothing outlives a killed benchmark (Linux only; best effort).
    The daemons and chorus-bench also run in sessions of their own, so that
    a Ctrl-C reaches only this process, which stops them in order."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def stop_process(process: "subprocess.Popen[bytes]", grace: float) -> None:
    """Sends SIGTERM, waits up to `grace` seconds, then SIGKILLs."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def _tail(path: Path, lines: int = 8) -> str:
    """The last lines of a log file, indented, or a note when it is absent."""
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return "    (no log)"
    return "\n".join("    " + line for line in text)


def cpu_seconds(pid: int) -> float:
    """The user and system CPU time process `pid` has used, in seconds (0
    when it is gone).
    """
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Deadline:
    """The end of the whole run (--max_time)."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self, what: str) -> float:
        """Seconds left; raises BenchError once there are none."""
        left = self.end - time.monotonic()
        if left <= 0:
            raise BenchError(f"--max_time reached while {what}")
        return left


# --- the Python ranks -------------------------------------------------------


def rank_main(conn: multiprocessing.connection.Connection, python_dir: str,
              worker: str, coordinator: str, group: str, world: int,
              rank: int, timeout: float, buffers: str,
              call_socket: bool) -> None:
    """One Python rank (a spawned process): joins through its daemon (or,
    with `coordinator`, through a worker runtime of its own), then
    runs the parent's commands, one size at a time, and reports its times.

    Commands (tuples over `conn`): ("size", nbytes) starts a size; the
    parent answers each report with the next step ("extra", n), then
    ("iters", n); anything else, e.g. ("close",), ends the rank.
    """
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent cleans up
    if python_dir:
        sys.path.insert(0, python_dir)
    try:
        import numpy as np
        import chorus
    except ImportError as e:
        conn.send(("error", f"rank {rank}: cannot import ({e}); install the "
                   f"package into build/python (client/python/README.md)"))
        return
    try:
        comm = chorus.join(group, world, rank, worker=worker or None,
                           coordinator=coordinator or None,
                           timeout=timeout,
                           shared_memory=buffers != "stream",
                           call_socket=call_socket)
    except chorus.Error as e:
        conn.send(("error", f"rank {rank}: join: {e}"))
        return
    conn.send(("joined", rank))

    def expect(kind: str) -> Tuple[Any, ...]:
        message = conn.recv()
        if message[0] != kind:
            raise EOFError(f"told {message[0]!r}")  # e.g. close: stop
        return message

    pattern = np.arange(1, 8, dtype=np.float32)
    total = world * (world + 1) / 2
    try:
        while True:
            _, nbytes = expect("size")
            count = nbytes // F32_BYTES
            x = np.resize(pattern * (rank + 1), count)
            expected = np.resize(pattern * total, count)
            out = np.empty(count, dtype=np.float32)
            if buffers == "shared":
                x, given = comm.shared_array(count, np.float32), x
                x[...] = given
                out = comm.shared_array(count, np.float32)

            def timed() -> int:
                start = time.perf_counter_ns()
                comm.all_reduce(x, out=out, timeout=timeout)
                return time.perf_counter_ns() - start

            # The first warm-up call goes async once to learn the plan.
            start = time.perf_counter_ns()
            work = comm.all_reduce(x, out=out, timeout=timeout,
                                   async_op=True)
            work.result(timeout=timeout)
            first = time.perf_counter_ns() - start
            plan = str(work.algorithm or "?")
            wrong = int(np.count_nonzero(out != expected))
            conn.send(("first", first, plan, comm.shared_memory,
                       comm.call_socket))
            extra = expect("extra")[1]
            if extra > 0:
                conn.send(("extra", sum(timed() for _ in range(extra))
                           // extra))
            iters = expect("iters")[1]
            out.fill(np.nan)  # what is checked below is a timed result
            comm.barrier(timeout=timeout)
            times = [timed() for _ in range(iters)]
            wrong += int(np.count_nonzero(out != expected))
            conn.send(("times", times, wrong))
            del x, expected, out
    except chorus.Error as e:
        conn.send(("error", f"rank {rank}: {type(e).__name__}: {e}"))
    except EOFError:
        pass  # told to close, or the parent is gone
    finally:
        comm.close(timeout=timeout)


@dataclass
class Row:
    """One size's result on one side."""

    plan: str
    iters: int
    time_us: float
    wrong: int
    # CPU per timed call (us) of each process of the Python side, by name
    # ("rank 0", "worker 0", "coordinator"); empty for the embedded side.
    cpu_us: Dict[str, float] = field(default_factory=dict)


class PythonSide:
    """A coordinator, one worker daemon per rank (none for embedded ranks)
    and one Python process per rank; stops all of them on exit."""

    def __init__(self, build_dir: Path, ranks: int, timeout: float,
                 deadline: Deadline, folder: Path, buffers: str,
                 call_socket: bool, embedded: bool = False,
                 coordinator_flags: Sequence[str] = ()) -> None:
        self.build_dir = build_dir
        self.coordinator_flags = list(coordinator_flags)
        self.embedded = embedded
        self.call_socket_wanted = call_socket
        self.buffers = buffers
        self.ranks = ranks
        self.timeout = timeout
        self.deadline = deadline
        self.folder = folder
        self.daemons: List[Tuple[str, "subprocess.Popen[bytes]", Path]] = []
        self.procs: List[Any] = []
        self.conns: List[multiprocessing.connection.Connection] = []

    def __enter__(self) -> "PythonSide":
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _daemon(self, name: str, binary: Path, flags: List[str]) -> int:
        """Starts a daemon with --listen=127.0.0.1:0 and returns its port."""
        if not os.access(binary, os.X_OK):
            raise BenchError(f"{binary} is missing; build Chorus first")
        port_file = self.folder / f"{name}.port"
        log = self.folder / f"{name}.log"
        with open(log, "wb") as log_file:
            process = subprocess.Popen(
                [str(binary), "--listen=127.0.0.1:0",
                 f"--port_file={port_file}", *flags],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                start_new_session=True, preexec_fn=_die_with_parent)
        self.daemons.append((name, process, log))
        end = time.monotonic() + min(30.0, self.deadline.left(f"starting "
                                                              f"{name}"))
        while time.monotonic() < end:
            if process.poll() is not None:
                raise BenchError(f"{name} exited with status "
                                 f"{process.returncode}:\n{_tail(log)}")
            text = port_file.read_text().strip() if port_file.exists() else ""
            if text:
                return int(text)
            time.sleep(0.05)
        raise BenchError(f"{name} did not write its port in time:\n"
                         f"{_tail(log)}")

    def _start(self) -> None:
        coordinator = self._daemon(
            "coordinator",
            self.build_dir / "server/coordinator/chorus-coordinator",
            self.coordinator_flags)
        workers = [
            self._daemon(f"worker-{r}",
                         self.build_dir / "server/worker/chorus-worker",
                         [f"--coordinator=127.0.0.1:{coordinator}",
                          f"--name=pyvsemb-{r}",
                          # Workers on one host must not all serve the
                          # default socket.
                          f"--local_socket={self.folder}/w{r}.sock"])
            for r in range(self.ranks) if not self.embedded]
        context = multiprocessing.get_context("spawn")
        python_dir = str(self.build_dir / "python")
        for rank in range(self.ranks):
            worker = "" if self.embedded else f"unix:{self.folder}/w{rank}.sock"
            parent, child = context.Pipe()
            process = context.Process(
                target=rank_main, name=f"rank-{rank}",
                args=(child, python_dir, worker,
                      f"127.0.0.1:{coordinator}" if self.embedded else "",
                      f"pyvsemb-{os.getpid()}", self.ranks, rank,
                      self.timeout, self.buffers, self.call_socket_wanted))
            process.start()
            child.close()
            self.procs.append(process)
            self.conns.append(parent)
        self._gather("joined", self.timeout + 30)

    def _gather(self, kind: str, wait: float) -> List[Tuple[Any, ...]]:
        """One message of `kind` from every rank, within `wait` seconds."""
        end = time.monotonic() + min(wait, self.deadline.left(
            f"waiting for the Python ranks ({kind})"))
        messages: List[Optional[Tuple[Any, ...]]] = [None] * self.ranks
        while any(m is None for m in messages):
            pending = [c for c, m in zip(self.conns, messages) if m is None]
            left = end - time.monotonic()
            if left <= 0:
                missing = [r for r, m in enumerate(messages) if m is None]
                raise BenchError(f"Python ranks {missing} sent no {kind!r} "
                                 f"in time")
            for conn in multiprocessing.connection.wait(pending, left):
                rank = self.conns.index(conn)  # type: ignore[arg-type]
                try:
                    message = conn.recv()  # type: ignore[union-attr]
                except EOFError:
                    raise BenchError(
                        f"Python rank {rank} exited (status "
                        f"{self.procs[rank].exitcode})") from None
                if message[0] == "error":
                    raise BenchError(message[1])
                if message[0] != kind:
                    raise BenchError(f"rank {rank} sent {message[0]!r}, "
                                     f"expected {kind!r}")
                messages[rank] = message
        return [m for m in messages if m is not None]

    def _send(self, message: Tuple[Any, ...]) -> None:
        for conn in self.conns:
            conn.send(message)

    def measure(self, nbytes: int, warmup: int, time_per_size: float,
                min_iters: int, max_iters: int) -> Row:
        """Runs one size on every rank with chorus-bench's rules."""
        # A call may take up to --timeout; a step waits for a few calls.
        call_wait = self.timeout + 30
        self._send(("size", nbytes))
        first = self._gather("first", call_wait)
        estimate = max(1, max(m[1] for m in first))
        plans = sorted({m[2] for m in first})
        self.shared_memory = sorted({m[3] for m in first})
        self.call_socket = sorted({"call socket" if m[4] else "gRPC"
                                   for m in first})
        if warmup > 0:
            extra = warmup - 1
        else:
            extra = min(4, int(time_per_size * 1e9 / 10) // estimate)
        self._send(("extra", extra))
        if extra > 0:
            means = self._gather("extra", call_wait * extra)
            estimate = max(1, max(m[1] for m in means))
        iters = int(min(max(int(time_per_size * 1e9) // estimate, min_iters),
                        max_iters))
        pids = self._pids()
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        self._send(("iters", iters))
        reports = self._gather("times", call_wait * (iters + 1))
        cpu_us = {name: (cpu_seconds(pid) - before[name]) * 1e6 / iters
                  for name, pid in pids.items()}
        slowest = [max(r[1][i] for r in reports) for i in range(iters)]
        return Row(plan="/".join(plans), iters=iters,
                   time_us=statistics.median(slowest) / 1e3,
                   wrong=sum(r[2] for r in reports), cpu_us=cpu_us)

    def _pids(self) -> Dict[str, int]:
        """The process ids of the ranks and daemons, by name."""
        pids = {f"rank {r}": process.pid
                for r, process in enumerate(self.procs)}
        for name, process, _ in self.daemons:
            pids[name.replace("-", " ")] = process.pid
        return pids

    def close(self) -> None:
        """Closes the ranks (they leave their communicators), then stops the
        daemons; kills whatever does not stop in time."""
        for conn in self.conns:
            try:
                conn.send(("close",))
            except (OSError, ValueError):
                pass
        end = time.monotonic() + 10
        for process in self.procs:
            process.join(max(0.1, end - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join(5)
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []
        for _, process, _ in reversed(self.daemons):
            stop_process(process, grace=10)

    def logs(self) -> str:
        """The ends of the daemons' logs, for an error report."""
        return "\n".join(f"  {name} ({log}):\n{_tail(log)}"
                         for name, _, log in self.daemons)


# --- the embedded ranks -----------------------------------------------------


def run_embedded(bench: Path, ranks: int, nbytes: int, warmup: int,
                 time_per_size: float, min_iters: int, max_iters: int,
                 timeout: float, deadline: Deadline,
                 coordinator_flags: Sequence[str] = ()) -> Row:
    """Runs chorus-bench for one size and returns its csv row; its
    coordinator gets `coordinator_flags`."""
    if not os.access(bench, os.X_OK):
        raise BenchError(f"{bench} is missing; build Chorus first")
    command = [str(bench), "--collective=all_reduce", "--dtype=f32",
               "--op=sum", f"--ranks={ranks}", "--format=csv",
               f"--min_bytes={nbytes}", f"--max_bytes={nbytes}",
               f"--warmup={warmup}",
               f"--time_per_size={max(1, round(time_per_size * 1e3))}ms",
               f"--min_iters={min_iters}", f"--max_iters={max_iters}",
               f"--timeout={max(1, round(timeout))}s"]
    if coordinator_flags:
        command.append(f"--coordinator_args={' '.join(coordinator_flags)}")
    # Warm-up, the timed calls (each within --timeout, but usually the time
    # budget) and the start of the coordinator and the ranks.
    limit = min(deadline.left("starting chorus-bench"),
                60 + 5 * time_per_size + timeout * (warmup + min_iters + 2))
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True,
                               preexec_fn=_die_with_parent)
    try:
        stdout, stderr = process.communicate(timeout=limit)
    except BaseException:
        # chorus-bench cleans up its coordinator and ranks on SIGINT.
        process.send_signal(signal.SIGINT)
        try:
            process.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate(timeout=10)
        raise
    if process.returncode != 0:
        tail = "\n".join("    " + line
                         for line in stderr.splitlines()[-8:])
        raise BenchError(f"chorus-bench failed (status "
                         f"{process.returncode}) at {nbytes} B:\n{tail}")
    header: Optional[List[str]] = None
    for line in stdout.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        fields = line.split(",")
        if header is None:
            header = fields
            continue
        row: Dict[str, str] = dict(zip(header, fields))
        if int(row["bytes"]) == nbytes:
            return Row(plan=row["plan"], iters=int(row["iters"]),
                       time_us=float(row["time_us"]),
                       wrong=int(row["wrong"]))
    raise BenchError(f"chorus-bench printed no row for {nbytes} B:\n{stdout}")


# --- the table --------------------------------------------------------------


def target_for(nbytes: int) -> Optional[float]:
    """The issue's largest Python/embedded ratio at this size, if any."""
    for low, high, ratio in TARGETS:
        if nbytes >= low and (high is None or nbytes <= high):
            return ratio
    return None


def print_table(ranks: int, args: argparse.Namespace, started: str,
                load: str,
                rows: Sequence[Tuple[int, Row, Row]]) -> None:
    """Prints the header lines and one line per size."""
    print(f"# python_vs_embedded: all_reduce f32 sum, {ranks} ranks, one "
          f"process per rank, 127.0.0.1")
    print(f"# {started}, {os.cpu_count()} cores, load average {load}")
    how = ("with a worker runtime in process (join(coordinator=...))"
           if args.worker == "embedded" else
           "through its own chorus-worker daemon")
    print(f"# python: chorus package, each rank {how}; embedded: "
          "chorus-bench ranks (WorkerRuntime in process)")
    if args.same_host_plan == "off":
        print("# both coordinators: --same_host_plan=false (planned as for "
              "ranks on different hosts)")
    print(f"# rules (both): warm-up "
          f"{args.warmup if args.warmup >= 0 else 'auto (1..5)'}, iterations "
          f"clamp({args.time_per_size:g}s / warm-up estimate, "
          f"{args.min_iters}, {args.max_iters})")
    print("# time = median over iterations of the slowest rank's time per "
          "call; ratio = python / embedded")
    print(f"# python buffers: {args.buffers}: {_BUFFERS[args.buffers]}; "
          f"shared memory: "
          f"{', '.join(getattr(args, 'shared_memory', ['?']))}; calls: "
          f"{', '.join(getattr(args, 'calls_used', ['?']))}")
    print("# targets (issue 16): >= 64 MiB within 1.25x; 8 B within 2x")
    print(f"{'size':<9} {'py plan':<18} {'iters':>5} {'python (us)':>13} "
          f"{'emb plan':<18} {'iters':>5} {'embedded (us)':>13} "
          f"{'ratio':>7}  {'target':<14} {'#wrong':>6}")
    for nbytes, py, emb in rows:
        ratio = py.time_us / emb.time_us if emb.time_us > 0 else math.inf
        limit = target_for(nbytes)
        if limit is None:
            target = "-"
        else:
            target = (f"<={limit:g}x " +
                      ("met" if ratio <= limit else "not met"))
        print(f"{format_size(nbytes):<9} {py.plan:<18} {py.iters:>5} "
              f"{py.time_us:>13.1f} {emb.plan:<18} {emb.iters:>5} "
              f"{emb.time_us:>13.1f} {ratio:>6.2f}x  {target:<14} "
              f"{py.wrong + emb.wrong:>6}")
    # Where the Python side's time goes: on a machine with fewer cores than
    # processes, their CPU per call bounds the time per call.
    print(f"# python side, CPU per timed call (us; {os.cpu_count()} cores "
          f"shared by {args.ranks * (1 if args.worker == 'embedded' else 2) + 1}"
          " daemons and ranks):")
    for nbytes, py, _ in rows:
        parts = ", ".join(f"{name} {us:.0f}"
                          for name, us in sorted(py.cpu_us.items()))
        print(f"#   {format_size(nbytes)}: {parts}; total "
              f"{sum(py.cpu_us.values()):.0f}")
    sys.stdout.flush()


# --- main -------------------------------------------------------------------


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        description="all_reduce f32 sum through the Python client next to "
        "chorus-bench's embedded C++ ranks, in one run.")
    parser.add_argument("--ranks", type=int, default=2,
                        help="number of ranks (default 2)")
    parser.add_argument("--sizes", type=parse_sizes, default=default_sizes(),
                        help="comma-separated bytes per rank, e.g. 8,1M,256M "
                        "(default 8 B to 256 MiB in x8 steps, plus 64M and "
                        "256M)")
    parser.add_argument("--time_per_size", type=parse_duration, default=2.0,
                        help="time budget of one size's timed iterations, "
                        "per side (default 2s)")
    parser.add_argument("--warmup", type=int, default=-1,
                        help="warm-up calls per size; -1 (default): one, "
                        "plus up to four that fit in a tenth of "
                        "--time_per_size, as chorus-bench does")
    parser.add_argument("--min_iters", type=int, default=3,
                        help="timed iterations per size, at least "
                        "(default 3)")
    parser.add_argument("--max_iters", type=int, default=1000,
                        help="timed iterations per size, at most "
                        "(default 1000)")
    parser.add_argument("--timeout", type=parse_duration, default=120.0,
                        help="deadline of every join and collective "
                        "(default 120s)")
    parser.add_argument("--max_time", type=parse_duration, default=1800.0,
                        help="bound on the whole run (default 30m)")
    parser.add_argument("--buffers", choices=sorted(_BUFFERS),
                        default="numpy",
                        help="the Python ranks' tensors: " + "; ".join(
                            f"{k}: {v}" for k, v in sorted(_BUFFERS.items()))
                        + " (default numpy)")
    parser.add_argument("--call_socket", choices=["on", "off"],
                        default="on",
                        help="send the Python ranks' calls on the daemon's "
                        "call socket (plain frames) or, off, as gRPC calls "
                        "(default on)")
    parser.add_argument("--worker", choices=["daemon", "embedded"],
                        default="daemon",
                        help="how the Python ranks reach the coordinator: "
                        "each through a chorus-worker daemon of its own, or "
                        "with a worker runtime in its process "
                        "(chorus.join(coordinator=...); the package must "
                        "have chorus._embedded) (default daemon)")
    parser.add_argument("--same_host_plan", choices=["on", "off"],
                        default="on",
                        help="off: both coordinators plan as for ranks on "
                        "different hosts (recursive doubling or the ring "
                        "above inline sizes) "
                        "instead of same_host (default on)")
    parser.add_argument("--build_dir", default="build",
                        help="the build tree, relative to the repository "
                        "(default build)")
    args = parser.parse_args(argv)
    if args.ranks < 1:
        parser.error("--ranks must be at least 1")
    if args.warmup < -1 or args.warmup == 0:
        parser.error("--warmup must be -1 or at least 1")
    if not 1 <= args.min_iters <= args.max_iters:
        parser.error("want 1 <= --min_iters <= --max_iters")
    return args


def _raise_interrupt(signum: int, _frame: Any) -> None:
    """SIGTERM and SIGHUP end the run like Ctrl-C, through the cleanup."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs both sides over every size and prints the table; 0 when every
    size ran and every checked element was right."""
    args = parse_args(argv)
    build_dir = Path(args.build_dir)
    if not build_dir.is_absolute():
        build_dir = REPO / build_dir
    # Also where SIGINT came in ignored (a background job of a shell).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_interrupt)
    deadline = Deadline(args.max_time)
    started = time.strftime("%a %b %d %H:%M:%S UTC %Y", time.gmtime())
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rows: List[Tuple[int, Row, Row]] = []
    coordinator_flags = (["--same_host_plan=false"]
                         if args.same_host_plan == "off" else [])
    with tempfile.TemporaryDirectory(prefix="chorus-pyvsemb-") as folder:
        side: Optional[PythonSide] = None
        try:
            side = PythonSide(build_dir, args.ranks, args.timeout, deadline,
                              Path(folder), args.buffers,
                              args.call_socket == "on",
                              embedded=args.worker == "embedded",
                              coordinator_flags=coordinator_flags)
            with side:
                for nbytes in args.sizes:
                    py = side.measure(nbytes, args.warmup,
                                      args.time_per_size, args.min_iters,
                                      args.max_iters)
                    emb = run_embedded(
                        build_dir / "bench/chorus-bench", args.ranks, nbytes,
                        args.warmup, args.time_per_size, args.min_iters,
                        args.max_iters, args.timeout, deadline,
                        coordinator_flags)
                    rows.append((nbytes, py, emb))
                    args.shared_memory = side.shared_memory
                    args.calls_used = side.call_socket
                    print(f"# {format_size(nbytes)}: python "
                          f"{py.time_us:.1f} us, embedded {emb.time_us:.1f} "
                          f"us", file=sys.stderr, flush=True)
        except BenchError as e:
            logs = side.logs() if side is not None else ""
            print(f"python_vs_embedded: {e}", file=sys.stderr)
            if logs:
                print(logs, file=sys.stderr)
            if rows:
                print_table(args.ranks, args, started, load, rows)
            return 1
        except KeyboardInterrupt:
            print("python_vs_embedded: interrupted; stopped every process "
                  "it started", file=sys.stderr)
            return 130
    print_table(args.ranks, args, started, load, rows)
    return 0 if all(py.wrong + emb.wrong == 0 for _, py, emb in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
