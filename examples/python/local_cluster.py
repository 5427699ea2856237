"""A coordinator and worker daemons on 127.0.0.1 for the examples: each
worker serves its local API on a Unix socket of its own in a temporary
folder, and ranks reach it as "unix:<path>".

The binaries come from $CHORUS_BIN_DIR when set, else from the build tree
($CHORUS_BUILD_DIR, default build/ at the top of the checkout).
"""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Tuple

REPO = Path(__file__).resolve().parents[2]

__all__ = ["LocalCluster", "binary", "start_daemon"]


def binary(name: str, subdir: str) -> str:
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


def start_daemon(args: List[str], port_file: Path, name: str
                 ) -> Tuple["subprocess.Popen[bytes]", int]:
    """Starts a daemon and returns it with the port it wrote."""
    process = subprocess.Popen(args + [f"--port_file={port_file}"],
                               stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"{name} exited with status {process.returncode}")
        text = port_file.read_text().strip() if port_file.exists() else ""
        if text:
            return process, int(text)
        time.sleep(0.05)
    process.kill()
    sys.exit(f"{name} did not start within 30 s")


class LocalCluster:
    """A coordinator and `workers` worker daemons, as a context manager;
    `sockets[i]` is worker i's local API ("unix:<path>").
    """

    def __init__(self, workers: int, prefix: str = "chorus-example-") -> None:
        """Starts them (the folder of their sockets is under /tmp when the
        temporary folder's path is long: a socket's path must stay under
        about 100 bytes).
        """
        base = tempfile.gettempdir()
        self._folder = tempfile.TemporaryDirectory(
            prefix=prefix, dir=base if len(base) <= 40 else "/tmp")
        folder = self._folder.name
        self.daemons: List["subprocess.Popen[bytes]"] = []
        self.sockets: List[str] = []
        try:
            coordinator, port = start_daemon(
                [binary("chorus-coordinator", "server/coordinator"),
                 "--listen=127.0.0.1:0"],
                Path(folder, "coordinator.port"), "chorus-coordinator")
            self.daemons.append(coordinator)
            self.coordinator = f"127.0.0.1:{port}"
            for i in range(workers):
                socket_path = str(Path(folder, f"worker-{i}.sock"))
                worker, _ = start_daemon(
                    [binary("chorus-worker", "server/worker"),
                     f"--coordinator=127.0.0.1:{port}",
                     "--listen=127.0.0.1:0", f"--name=worker-{i}",
                     f"--local_socket={socket_path}"],
                    Path(folder, f"worker-{i}.port"), f"worker-{i}")
                self.daemons.append(worker)
                self.sockets.append(f"unix:{socket_path}")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stops the workers, then the coordinator, and removes the folder."""
        for daemon in reversed(self.daemons):
            daemon.terminate()
        for daemon in self.daemons:
            daemon.wait(timeout=10)
        self._folder.cleanup()

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
