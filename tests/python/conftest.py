"""Fixtures for the Python client's tests: real Chorus daemons on 127.0.0.1.

The binaries come from $CHORUS_BIN_DIR (one folder holding chorus-coordinator,
chorus-worker and chorusctl) when it is set, and from the build tree
$CHORUS_BUILD_DIR (default: build/ at the top of the repository) otherwise.
The chorus package must be importable (scripts/test.sh installs it into
build/python and puts that on PYTHONPATH).
"""

import atexit
import concurrent.futures
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional
from typing import Sequence, Tuple

import numpy as np
import pytest

try:
    import chorus  # noqa: F401
except ImportError as e:  # the source tree has no generated stubs
    raise SystemExit(
        f"cannot import the chorus package ({e}); install it first, e.g. "
        "/usr/bin/python3 -m pip install --no-deps --no-build-isolation "
        "--target build/python client/python and run with "
        "PYTHONPATH=build/python")

REPO = Path(__file__).resolve().parents[2]

# Bounds on waiting for a daemon to start and to stop.
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
# The deadline the tests give a collective that should succeed.
CALL_TIMEOUT = 60.0


def binaries() -> Dict[str, Path]:
    """Returns the paths of chorus-coordinator, chorus-worker and chorusctl."""
    bin_dir = os.environ.get("CHORUS_BIN_DIR")
    if bin_dir:
        folder = Path(bin_dir)
        paths = {name: folder / name for name in
                 ("chorus-coordinator", "chorus-worker", "chorusctl")}
    else:
        build = Path(os.environ.get("CHORUS_BUILD_DIR", "build"))
        if not build.is_absolute():
            build = REPO / build
        paths = {
            "chorus-coordinator":
                build / "server" / "coordinator" / "chorus-coordinator",
            "chorus-worker": build / "server" / "worker" / "chorus-worker",
            "chorusctl": build / "client" / "chorusctl",
        }
    missing = [str(p) for p in paths.values() if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail("Chorus binaries not found: " + ", ".join(missing) +
                    " (build with scripts/build.sh, or set CHORUS_BUILD_DIR "
                    "or CHORUS_BIN_DIR)", pytrace=False)
    return paths


# Every daemon still running when pytest exits (a test that failed before
# its cleanup, an interrupted run) is killed then.
_RUNNING: List["Daemon"] = []


@atexit.register
def _kill_leftovers() -> None:
    for daemon in list(_RUNNING):
        daemon.kill()


class Daemon:
    """A daemon process started by a test, with its log file and port.
    `env` replaces the test's environment for the process when given.
    """

    def __init__(self, name: str, args: List[str], folder: Path,
                 env: Optional[Mapping[str, str]] = None) -> None:
        self.name = name
        self.port_file = folder / f"{name}.port"
        self.log_path = folder / f"{name}.log"
        self.port_file.unlink(missing_ok=True)
        # The Unix socket of a worker's local API, when it serves one.
        self.local_socket: Optional[str] = None
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            args + [f"--port_file={self.port_file}"], stdout=self._log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=None if env is None else dict(env))
        _RUNNING.append(self)
        self.port = self._wait_for_port()

    def _wait_for_port(self) -> int:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.process.returncode}:\n"
                    f"{self.log_tail()}")
            try:
                text = self.port_file.read_text().strip()
                if text:
                    return int(text)
            except (FileNotFoundError, ValueError):
                pass
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"{self.name} wrote no port within "
                           f"{START_TIMEOUT} s:\n{self.log_tail()}")

    @property
    def address(self) -> str:
        """host:port of the daemon's gRPC port."""
        return f"127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the daemon's output."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        """Kills the process at once (SIGKILL) and reaps it."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=STOP_TIMEOUT)
        self._done()

    def stop(self) -> None:
        """Stops the process with SIGTERM, then SIGKILL if it lingers."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=STOP_TIMEOUT)
        self._done()

    def _done(self) -> None:
        self._log.close()
        if self in _RUNNING:
            _RUNNING.remove(self)


class Cluster:
    """A coordinator and its workers, all on 127.0.0.1.

    With `tls_dir` (what make_certs() writes) every daemon runs with mutual
    TLS: the coordinator with tls_dir/coordinator, worker NAME with
    tls_dir/worker-NAME.
    """

    def __init__(self, folder: Path, workers: Sequence[str] = ("w0", "w1"),
                 coordinator_flags: Sequence[str] = (),
                 tls_dir: Optional[Path] = None) -> None:
        self.bins = binaries()
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.tls_dir = tls_dir
        # Each worker serves a Unix socket of its own here, and so its call
        # socket, which clients then send their collectives on; with
        # CHORUS_TEST_CALL_SOCKETS=off none does, and calls are gRPC calls.
        self.socket_dir: Optional[Path] = None
        if os.environ.get("CHORUS_TEST_CALL_SOCKETS", "on") != "off":
            self.socket_dir = short_temp_dir()
        self.workers: Dict[str, Daemon] = {}
        tls_flags = ([f"--tls_dir={tls_dir / 'coordinator'}"]
                     if tls_dir is not None else [])
        self.coordinator = Daemon(
            "coordinator", [str(self.bins["chorus-coordinator"]),
                            "--listen=127.0.0.1:0", *tls_flags,
                            *coordinator_flags],
            folder)
        try:
            for name in workers:
                self.add_worker(name)
        except BaseException:
            self.stop()
            raise

    def add_worker(self, name: str, flags: Sequence[str] = (),
                   local_socket: Optional[str] = "auto",
                   env: Optional[Mapping[str, str]] = None) -> Daemon:
        """Starts a worker registered with the coordinator, with extra
        `flags`; returns it once it is registered.

        local_socket is its --local_socket: "auto" (the default) is a
        socket of its own in socket_dir (so that workers on this host never
        share one), or none ("") when socket_dir is None; "" serves no Unix
        socket; a path serves the local API there too; None leaves the flag
        out, so the worker serves the default socket of its environment, as
        "default" does.
        The returned daemon's local_socket is the socket's path (None for
        ""). `env` replaces the worker's environment (e.g. with an
        XDG_RUNTIME_DIR of its own).
        """
        if local_socket == "auto":
            local_socket = ("" if self.socket_dir is None else
                            str(self.socket_dir / f"{name}.sock"))
        socket_flags: List[str] = []
        if local_socket is not None:
            socket_flags = [f"--local_socket={local_socket}"]
        tls_flags = ([f"--tls_dir={self.tls_dir / f'worker-{name}'}"]
                     if self.tls_dir is not None else [])
        daemon = Daemon(name, [
            str(self.bins["chorus-worker"]),
            f"--coordinator={self.coordinator.address}",
            "--listen=127.0.0.1:0", f"--name={name}", *socket_flags,
            *tls_flags, *flags,
        ], self.folder, env=env)
        if local_socket is None or local_socket == "default":
            runtime_dir = (os.environ if env is None else env).get(
                "XDG_RUNTIME_DIR")
            daemon.local_socket = (
                f"{runtime_dir}/chorus/worker.sock" if runtime_dir else
                f"/tmp/chorus-{os.getuid()}/worker.sock")
        elif local_socket:
            daemon.local_socket = local_socket
        self.workers[name] = daemon
        return daemon

    def address(self, name: str) -> str:
        """The local API address of worker `name`."""
        return self.workers[name].address

    def stop(self) -> None:
        """Stops every daemon, workers first."""
        for daemon in self.workers.values():
            daemon.stop()
        self.coordinator.stop()
        if self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)

    def logs(self) -> str:
        """The tails of every daemon's log, for failure messages."""
        return "\n".join(f"--- {d.name}\n{d.log_tail()}" for d in
                         [self.coordinator, *self.workers.values()])


def short_temp_dir() -> Path:
    """A new, empty folder with a short path, for Unix sockets (whose paths
    must stay under about 100 bytes): under the temp folder when its path is
    short, else under /tmp. The caller removes it.
    """
    base = tempfile.gettempdir()
    if len(base) > 40:
        base = "/tmp"
    return Path(tempfile.mkdtemp(prefix="chorus-", dir=base))


def make_certs(out: Path, workers: Sequence[str] = ("w0", "w1"),
               clients: Sequence[str] = ("app",),
               admins: Sequence[str] = ("admin",)) -> Path:
    """Makes a CA and certificates with scripts/dev_certs.sh into `out`:
    out/coordinator, out/worker-NAME, out/client-NAME, out/admin-NAME, each
    a --tls_dir (ca.pem, cert.pem, key.pem). Returns `out`.
    """
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "dev_certs.sh"), f"--out={out}",
         f"--workers={','.join(workers)}", f"--clients={','.join(clients)}",
         f"--admins={','.join(admins)}"],
        capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        pytest.fail(f"scripts/dev_certs.sh failed:\n{done.stdout}"
                    f"{done.stderr}", pytrace=False)
    return out


def unique_group(prefix: str = "g") -> str:
    """A group name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def run_ranks(functions: Sequence[Callable[[], Any]],
              timeout: float = CALL_TIMEOUT * 2,
              capture: bool = False) -> List[Any]:
    """Runs one function per rank, each on its own thread, and returns their
    results in rank order. With capture=True an exception is returned in its
    rank's place; otherwise the first one (by rank) is raised.
    """
    with concurrent.futures.ThreadPoolExecutor(len(functions)) as pool:
        running = [pool.submit(f) for f in functions]
        done, pending = concurrent.futures.wait(running, timeout=timeout)
        if pending:
            raise AssertionError(
                f"{len(pending)} of {len(functions)} ranks did not finish "
                f"within {timeout} s")
    results: List[Any] = []
    for future in running:
        error = future.exception()
        if error is not None and not capture:
            raise error
        results.append(error if error is not None else future.result())
    return results


def join_all(addresses: Sequence[str], group: Optional[str] = None,
             timeout: float = CALL_TIMEOUT, **kwargs: Any) -> List[Any]:
    """Joins len(addresses) ranks, rank i through addresses[i]; returns the
    communicators in rank order.
    """
    group = group or unique_group()
    world = len(addresses)
    return run_ranks([
        (lambda r=r: chorus.join(group, world, r, worker=addresses[r],
                                 timeout=timeout, **kwargs))
        for r in range(world)])


def call_with_a_rank_missing(cluster: Cluster, timeout: float
                             ) -> Tuple[List[Any], str]:
    """Joins three ranks (w0, w1, w0) of a fresh group; ranks 0 and 1 call
    all_reduce with `timeout`, rank 2 never calls. Returns what each of the
    two calls raised, and the group's name.
    """
    w0, w1 = cluster.address("w0"), cluster.address("w1")
    comms = join_all([w0, w1, w0])
    try:
        errors = run_ranks([
            (lambda c=c: c.all_reduce(np.ones(8, np.float32),
                                      timeout=timeout))
            for c in comms[:2]], capture=True)
        return errors, comms[0].group
    finally:
        for c in comms:
            c.close()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A coordinator with workers w0 and w1, shared by the whole session."""
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    yield c
    c.stop()


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A short, empty folder for Unix sockets, removed after the test."""
    folder = short_temp_dir()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def bins() -> Dict[str, Path]:
    """Paths of the Chorus binaries."""
    return binaries()


@pytest.fixture(scope="module")
def trio(cluster: Cluster) -> Any:
    """Three ranks of one group: ranks 0 and 2 on w0, rank 1 on w1."""
    w0, w1 = cluster.address("w0"), cluster.address("w1")
    comms = join_all([w0, w1, w0])
    yield comms
    for comm in comms:
        comm.close()


@pytest.fixture
def pair(cluster: Cluster) -> Any:
    """Two ranks of a fresh group: rank 0 on w0, rank 1 on w1."""
    comms = join_all([cluster.address("w0"), cluster.address("w1")])
    yield comms
    for comm in comms:
        comm.close()
