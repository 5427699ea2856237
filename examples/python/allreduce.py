#!/usr/bin/env python3
r"""Two ranks all-reduce numpy arrays through two Chorus worker daemons.

From the top of a built checkout (scripts/build.sh), with the package
installed into build/python (see client/python/README.md):

    PYTHONPATH=build/python /usr/bin/python3 examples/python/allreduce.py

starts a coordinator and two workers on 127.0.0.1 from build/ (or
$CHORUS_BUILD_DIR, or a folder of binaries $CHORUS_BIN_DIR), runs rank 0
and rank 1 as two processes, each through its own worker, and stops the
daemons again.

With CHORUS_WORKER, CHORUS_GROUP, CHORUS_WORLD_SIZE and CHORUS_RANK set, it
runs only that rank, against daemons you started yourself:

    CHORUS_WORKER=127.0.0.1:PORT CHORUS_GROUP=demo CHORUS_WORLD_SIZE=2 \
        CHORUS_RANK=0 PYTHONPATH=build/python /usr/bin/python3 allreduce.py
"""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List

import numpy as np

try:
    import chorus
except ImportError:
    sys.exit("the chorus package is not installed; see "
             "client/python/README.md (e.g. PYTHONPATH=build/python after "
             "installing it there)")

REPO = Path(__file__).resolve().parents[2]


def _say(line: str) -> None:
    """Prints one line in one write, so that the two ranks' lines on a
    shared stdout never interleave (print() writes the text and the newline
    separately when Python runs unbuffered).
    """
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def run_rank() -> None:
    """One rank: joins the group named by the CHORUS_* variables and runs a
    few collectives.
    """
    with chorus.join(timeout=30) as comm:
        x = np.arange(4, dtype=np.float32) * (comm.rank + 1)
        total = comm.all_reduce(x)                       # every rank: sum
        ranks = comm.all_gather(np.array([comm.rank], np.int32))
        # Calls can be in flight together; they match in issue order.
        works = [comm.all_reduce(np.full(2, i, np.int64), async_op=True)
                 for i in range(3)]
        sums = [w.result().tolist() for w in works]
        _say(f"rank {comm.rank}: all_reduce({x.tolist()}) = "
             f"{total.tolist()}; all_gather = {ranks.ravel().tolist()}; "
             f"async sums = {sums}")
        # Ranks that disagree get an error naming what each one asked for.
        try:
            comm.all_reduce(np.zeros(3 if comm.rank == 0 else 2, np.float32))
        except chorus.InvalidArgument as e:
            _say(f"rank {comm.rank}: mismatch reported: {e.ranks}")


def _binary(name: str, subdir: str) -> str:
    """The path of a Chorus binary: in $CHORUS_BIN_DIR when set, else in the
    build tree ($CHORUS_BUILD_DIR, default build/).
    """
    if os.environ.get("CHORUS_BIN_DIR"):
        path = Path(os.environ["CHORUS_BIN_DIR"]) / name
    else:
        build = Path(os.environ.get("CHORUS_BUILD_DIR", REPO / "build"))
        path = (build if build.is_absolute() else REPO / build) / subdir / name
    if not os.access(path, os.X_OK):
        sys.exit(f"{path} is missing; build Chorus first (scripts/build.sh)")
    return str(path)


def _wait_for_port(process: "subprocess.Popen[bytes]", port_file: Path,
                   name: str) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"{name} exited with status {process.returncode}")
        text = port_file.read_text().strip() if port_file.exists() else ""
        if text:
            return int(text)
        time.sleep(0.05)
    sys.exit(f"{name} did not start within 30 s")


def run_everything() -> None:
    """Starts a coordinator and two workers, runs two rank processes."""
    daemons: List["subprocess.Popen[bytes]"] = []
    with tempfile.TemporaryDirectory(prefix="chorus-example-") as folder:
        try:
            port_file = Path(folder, "coordinator.port")
            daemons.append(subprocess.Popen([
                _binary("chorus-coordinator", "server/coordinator"),
                "--listen=127.0.0.1:0", f"--port_file={port_file}"],
                stderr=subprocess.DEVNULL))
            coordinator = _wait_for_port(daemons[-1], port_file,
                                         "chorus-coordinator")
            workers = []
            for name in ("worker-a", "worker-b"):
                port_file = Path(folder, f"{name}.port")
                daemons.append(subprocess.Popen([
                    _binary("chorus-worker", "server/worker"),
                    f"--coordinator=127.0.0.1:{coordinator}",
                    "--listen=127.0.0.1:0", f"--name={name}",
                    f"--port_file={port_file}"], stderr=subprocess.DEVNULL))
                workers.append(_wait_for_port(daemons[-1], port_file, name))
            print(f"coordinator on 127.0.0.1:{coordinator}, workers on "
                  f"{', '.join(f'127.0.0.1:{p}' for p in workers)}")
            ranks = []
            for rank, port in enumerate(workers):
                env = dict(os.environ, CHORUS_WORKER=f"127.0.0.1:{port}",
                           CHORUS_GROUP="example", CHORUS_WORLD_SIZE="2",
                           CHORUS_RANK=str(rank))
                ranks.append(subprocess.Popen(
                    [sys.executable, __file__], env=env))
            failed = [p.wait(timeout=60) for p in ranks]
            if any(failed):
                sys.exit("a rank failed")
        finally:
            for daemon in reversed(daemons):
                daemon.terminate()
            for daemon in daemons:
                daemon.wait(timeout=10)


if __name__ == "__main__":
    if os.environ.get("CHORUS_RANK") is not None:
        run_rank()
    else:
        run_everything()
