#!/usr/bin/env python3
r"""Two ranks all-reduce numpy arrays through two Chorus worker daemons.

From the top of a built checkout (scripts/build.sh), with the package
installed into build/python (see client/python/README.md):

    PYTHONPATH=build/python /usr/bin/python3 examples/python/allreduce.py

starts a coordinator and two workers on 127.0.0.1 from build/ (or
$CHORUS_BUILD_DIR, or a folder of binaries $CHORUS_BIN_DIR), each worker
serving its local API on a Unix socket of its own (--local_socket) in a
temporary folder, runs rank 0 and rank 1 as two processes, each through
its own worker's socket, and stops the daemons again.

With CHORUS_GROUP, CHORUS_WORLD_SIZE and CHORUS_RANK set, it runs only that
rank, against daemons you started yourself: through the worker at
$CHORUS_WORKER ("unix:/path" of its --local_socket, or "host:port"), or,
without CHORUS_WORKER, through the default socket of a worker on this host
started without --local_socket ($XDG_RUNTIME_DIR/chorus/worker.sock, or
/tmp/chorus-<uid>/worker.sock):

    CHORUS_GROUP=demo CHORUS_WORLD_SIZE=2 CHORUS_RANK=0 \
        PYTHONPATH=build/python /usr/bin/python3 examples/python/allreduce.py
    CHORUS_WORKER=unix:/tmp/w1.sock CHORUS_GROUP=demo CHORUS_WORLD_SIZE=2 \
        CHORUS_RANK=1 PYTHONPATH=build/python /usr/bin/python3 \
        examples/python/allreduce.py

With --embedded it starts only the coordinator, and each rank runs the
worker runtime in its own process (chorus.join(..., coordinator=...); the
package must have the embedded worker, see client/python/README.md); one
rank alone takes --coordinator=HOST:PORT instead of CHORUS_WORKER:

    PYTHONPATH=build/python /usr/bin/python3 examples/python/allreduce.py \
        --embedded
    CHORUS_GROUP=demo CHORUS_WORLD_SIZE=2 CHORUS_RANK=0 \
        PYTHONPATH=build/python /usr/bin/python3 \
        examples/python/allreduce.py --coordinator=127.0.0.1:7000
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

import numpy as np

try:
    import chorus
except ImportError:  # reported by main(), after --help
    chorus = None

REPO = Path(__file__).resolve().parents[2]


def _say(line: str) -> None:
    """Prints one line in one write, so that the two ranks' lines on a
    shared stdout never interleave (print() writes the text and the newline
    separately when Python runs unbuffered).
    """
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def run_rank(coordinator: Optional[str]) -> None:
    """One rank: joins the group named by the CHORUS_* variables (through
    a worker runtime of its own with `coordinator`) and runs a few
    collectives.
    """
    with chorus.join(timeout=30, coordinator=coordinator) as comm:
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


def _short_temp_base() -> str:
    """A folder for the temporary one holding the workers' sockets: the
    temp folder when its path is short, else /tmp (a Unix socket's path
    must stay under about 100 bytes).
    """
    base = tempfile.gettempdir()
    return base if len(base) <= 40 else "/tmp"


def run_everything(embedded: bool) -> None:
    """Starts a coordinator and two workers (none when `embedded`), runs
    two rank processes.
    """
    daemons: List["subprocess.Popen[bytes]"] = []
    with tempfile.TemporaryDirectory(prefix="chorus-example-",
                                     dir=_short_temp_base()) as folder:
        try:
            port_file = Path(folder, "coordinator.port")
            daemons.append(subprocess.Popen([
                _binary("chorus-coordinator", "server/coordinator"),
                "--listen=127.0.0.1:0", f"--port_file={port_file}"],
                stderr=subprocess.DEVNULL))
            coordinator = _wait_for_port(daemons[-1], port_file,
                                         "chorus-coordinator")
            # Each worker serves its peers on a loopback port and its local
            # API also on a socket of its own: two workers on one host must
            # not share the default socket.
            sockets = []
            for name in () if embedded else ("worker-a", "worker-b"):
                port_file = Path(folder, f"{name}.port")
                socket_path = str(Path(folder, f"{name}.sock"))
                daemons.append(subprocess.Popen([
                    _binary("chorus-worker", "server/worker"),
                    f"--coordinator=127.0.0.1:{coordinator}",
                    "--listen=127.0.0.1:0", f"--name={name}",
                    f"--local_socket={socket_path}",
                    f"--port_file={port_file}"], stderr=subprocess.DEVNULL))
                _wait_for_port(daemons[-1], port_file, name)
                sockets.append(socket_path)
            if embedded:
                print(f"coordinator on 127.0.0.1:{coordinator}; each rank "
                      "embeds its worker")
            else:
                print(f"coordinator on 127.0.0.1:{coordinator}, workers on "
                      f"{', '.join(f'unix:{p}' for p in sockets)}")
            ranks = []
            for rank in range(2):
                env = dict(os.environ, CHORUS_GROUP="example",
                           CHORUS_WORLD_SIZE="2", CHORUS_RANK=str(rank))
                args = [sys.executable, __file__]
                if embedded:
                    args.append(f"--coordinator=127.0.0.1:{coordinator}")
                else:
                    env["CHORUS_WORKER"] = f"unix:{sockets[rank]}"
                ranks.append(subprocess.Popen(args, env=env))
            failed = [p.wait(timeout=60) for p in ranks]
            if any(failed):
                sys.exit("a rank failed")
        finally:
            for daemon in reversed(daemons):
                daemon.terminate()
            for daemon in daemons:
                daemon.wait(timeout=10)


def main() -> None:
    """Runs one rank when CHORUS_RANK is set, else the whole example."""
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--embedded", action="store_true",
                        help="start no worker daemons: each rank runs the "
                        "worker runtime in its own process")
    parser.add_argument("--coordinator", metavar="HOST:PORT",
                        help="with CHORUS_RANK: run that rank with a worker "
                        "runtime of its own, registered with this "
                        "coordinator (rather than through CHORUS_WORKER)")
    args = parser.parse_args()
    if chorus is None:
        sys.exit("the chorus package is not installed; see "
                 "client/python/README.md (e.g. PYTHONPATH=build/python "
                 "after installing it there)")
    if os.environ.get("CHORUS_RANK") is not None:
        run_rank(args.coordinator)
    else:
        run_everything(args.embedded)


if __name__ == "__main__":
    main()
