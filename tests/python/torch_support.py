"""Rank processes for the tests of the chorus torch.distributed backend.

torch.distributed keeps one default process group per process, so each
rank of a test is a process of its own: RankProcesses starts them (each
runs serve() below, calls init_process_group("chorus", ...) and then waits
for work), hands every rank a function to run, and collects what each one
returned or raised. The functions live in the test modules (named
rank_...): a rank imports the module by name and calls the function with a
RankContext and the keyword arguments the test gave.

The test process hosts the torch store the ranks rendezvous through (a
TCPStore on port 0, so no port is guessed). Every wait is bounded, and a
rank that does not answer in time fails the test with its output.
"""

import datetime
import importlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch.distributed as dist

import chorus
from conftest import CALL_TIMEOUT, REPO

HERE = Path(__file__).resolve().parent

# A line a rank writes to report to the test process starts with this.
_MARK = "@@chorus-torch-test "
# Bounds on waiting for ranks to start (torch's import is slow on a busy
# two-core machine) and to exit.
START_TIMEOUT = 90.0
EXIT_TIMEOUT = 30.0


class RankError(AssertionError):
    """A rank did not answer in time, or died; the message carries the
    ranks' output.
    """


class Reply:
    """What one rank's function returned or raised.

    Attributes:
        rank: the rank.
        value: the function's return value (None when it raised).
        error: None, or a dict: type (the exception's class name), types
            (its class and bases' names), message (str of it), traceback
            (the formatted traceback), at (time.time() when it was caught),
            and for a chorus.Error: code, missing_ranks, lost_rank,
            lost_ranks, lost_worker, ranks (the per-rank account).
    """

    def __init__(self, rank: int, value: Any,
                 error: Optional[Dict[str, Any]]) -> None:
        self.rank = rank
        self.value = value
        self.error = error

    def __repr__(self) -> str:
        return f"Reply(rank={self.rank}, value={self.value!r}, " \
               f"error={self.error!r})"


class RankContext:
    """What a rank's function gets: its rank, the world size, the chorus
    process group, and report() to tell the test process how it is doing.
    """

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size

    @property
    def group(self) -> Any:
        """The default process group (a chorus.torch.ProcessGroupChorus)."""
        return dist.distributed_c10d._get_default_group()

    def report(self, **progress: Any) -> None:
        """Sends `progress` to the test process at once (RankProcesses.
        progress() receives it).
        """
        _send({"kind": "progress", "rank": self.rank, "progress": progress})


class RankProcesses:
    """world_size rank processes of one chorus process group, rank i
    joining through the worker at addresses[i] ($CHORUS_WORKER), or, where
    that is None, embedding the worker runtime for `coordinator`
    ($CHORUS_COORDINATOR). Use as a context manager or call close().
    """

    def __init__(self, addresses: Sequence[Optional[str]],
                 group: Optional[str], timeout: float = CALL_TIMEOUT,
                 coordinator: Optional[str] = None,
                 init_method: Optional[str] = None,
                 device: Optional[str] = None) -> None:
        """Starts the ranks and returns once every one has initialized its
        process group (with `timeout` seconds as torch's timeout), as the
        Chorus group `group` ($CHORUS_GROUP; None leaves it unset); through
        `init_method` when given, else through the test process's store.
        With device "cuda" each rank joins on GPU rank modulo the GPUs it
        sees (chorus.torch.Options.device).
        """
        self.world_size = len(addresses)
        self.group = group
        self.timeout = timeout
        self._store = dist.TCPStore(
            "127.0.0.1", 0, self.world_size, True,
            datetime.timedelta(seconds=START_TIMEOUT),
            wait_for_workers=False)
        package_root = str(Path(chorus.__file__).resolve().parents[1])
        path = os.pathsep.join(p for p in (
            str(HERE), package_root, os.environ.get("PYTHONPATH")) if p)
        self._processes: List["subprocess.Popen[str]"] = []
        self._queues: List["queue.Queue[Dict[str, Any]]"] = []
        self._output: List[List[str]] = []
        try:
            for rank, address in enumerate(addresses):
                env = dict(os.environ, PYTHONPATH=path,
                           RANK=str(rank), WORLD_SIZE=str(self.world_size),
                           CHORUS_TEST_STORE=f"127.0.0.1:{self._store.port}",
                           CHORUS_TEST_TIMEOUT=str(timeout),
                           CHORUS_TEST_INIT_METHOD=init_method or "",
                           CHORUS_TEST_DEVICE=device or "")
                for name in ("CHORUS_RANK", "CHORUS_WORLD_SIZE",
                             "CHORUS_GROUP", "CHORUS_WORKER",
                             "CHORUS_COORDINATOR"):
                    env.pop(name, None)
                if address is not None:
                    env["CHORUS_WORKER"] = address
                elif coordinator is not None:
                    env["CHORUS_COORDINATOR"] = coordinator
                if group is not None:
                    env["CHORUS_GROUP"] = group
                process = subprocess.Popen(
                    [sys.executable, "-c",
                     "import torch_support; torch_support.serve()"],
                    env=env, cwd=str(REPO), stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    text=True, bufsize=1)
                self._processes.append(process)
                self._queues.append(queue.Queue())
                self._output.append([])
                threading.Thread(target=self._read, args=(rank,),
                                 daemon=True).start()
            for rank in range(self.world_size):
                self._receive(rank, "ready", START_TIMEOUT + timeout)
        except BaseException:
            self.close()
            raise

    def _read(self, rank: int) -> None:
        """Sorts rank `rank`'s output into reports and plain lines."""
        stream = self._processes[rank].stdout
        assert stream is not None
        for line in stream:
            if line.startswith(_MARK):
                self._queues[rank].put(json.loads(line[len(_MARK):]))
            else:
                self._output[rank].append(line.rstrip("\n"))
        self._queues[rank].put({"kind": "exited"})

    def output(self) -> str:
        """Every rank's plain output (the tail of it), for messages."""
        return "\n".join(
            f"--- rank {r} (exit status {p.poll()})\n" +
            "\n".join(self._output[r][-40:])
            for r, p in enumerate(self._processes))

    def _receive(self, rank: int, kind: str, timeout: float
                 ) -> Dict[str, Any]:
        """The next report of `kind` from `rank`; earlier progress reports
        are skipped.
        """
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                message = self._queues[rank].get(timeout=max(left, 0))
            except queue.Empty:
                raise RankError(
                    f"rank {rank} sent no {kind} within {timeout} s\n"
                    f"{self.output()}") from None
            if message["kind"] == kind:
                return message
            if message["kind"] == "exited":
                self._queues[rank].put(message)
                raise RankError(f"rank {rank} exited before its {kind}\n"
                                f"{self.output()}")

    def start(self, function: Callable[..., Any],
              ranks: Optional[Sequence[int]] = None,
              **kwargs: Any) -> None:
        """Has `ranks` (default: all) run function(context, **kwargs)."""
        request = json.dumps({"module": function.__module__,
                              "function": function.__name__,
                              "kwargs": kwargs})
        for rank in (range(self.world_size) if ranks is None else ranks):
            stdin = self._processes[rank].stdin
            assert stdin is not None
            stdin.write(request + "\n")
            stdin.flush()

    def result(self, rank: int, timeout: Optional[float] = None) -> Reply:
        """Waits for rank `rank`'s function to end (by default at most
        twice the ranks' timeout) and returns what it returned or raised.
        """
        message = self._receive(rank, "result",
                                2 * self.timeout if timeout is None
                                else timeout)
        return Reply(rank, message.get("value"), message.get("error"))

    def progress(self, rank: int, timeout: Optional[float] = None
                 ) -> Dict[str, Any]:
        """The next progress report of rank `rank`."""
        return self._receive(rank, "progress",
                             2 * self.timeout if timeout is None
                             else timeout)["progress"]

    def run(self, function: Callable[..., Any], **kwargs: Any
            ) -> List[Reply]:
        """Has every rank run function(context, **kwargs); returns their
        replies in rank order.
        """
        self.start(function, **kwargs)
        return [self.result(rank) for rank in range(self.world_size)]

    def values(self, function: Callable[..., Any], **kwargs: Any
               ) -> List[Any]:
        """As run(), but every rank must return; returns the values."""
        replies = self.run(function, **kwargs)
        failed = [r for r in replies if r.error is not None]
        if failed:
            raise AssertionError(
                "\n".join(f"rank {r.rank} raised {r.error['type']}: "
                          f"{r.error['traceback']}" for r in failed))
        return [r.value for r in replies]

    def kill(self, rank: int) -> None:
        """Kills rank `rank`'s process at once (SIGKILL)."""
        process = self._processes[rank]
        if process.poll() is None:
            process.kill()
        process.wait(timeout=EXIT_TIMEOUT)

    def close(self) -> List[Optional[int]]:
        """Asks every rank to exit, waits (bounded), kills any that lingers
        and returns their exit statuses.
        """
        for process in self._processes:
            if process.poll() is None and process.stdin is not None:
                try:
                    process.stdin.write("exit\n")
                    process.stdin.flush()
                except (BrokenPipeError, OSError):
                    pass
        statuses: List[Optional[int]] = []
        deadline = time.monotonic() + EXIT_TIMEOUT
        for process in self._processes:
            try:
                statuses.append(process.wait(
                    timeout=max(deadline - time.monotonic(), 0.1)))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=EXIT_TIMEOUT)
                statuses.append(None)  # did not exit when asked
        return statuses

    def __enter__(self) -> "RankProcesses":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


# --- the rank side ----------------------------------------------------------


def _send(message: Dict[str, Any]) -> None:
    sys.stdout.write(_MARK + json.dumps(message) + "\n")
    sys.stdout.flush()


def describe(error: BaseException) -> Dict[str, Any]:
    """A JSON-able account of an exception (see Reply.error)."""
    account: Dict[str, Any] = {
        "type": type(error).__name__,
        "types": [c.__name__ for c in type(error).__mro__],
        "message": str(error),
        "traceback": "".join(traceback.format_exception(
            type(error), error, error.__traceback__)),
        "at": time.time(),
    }
    if isinstance(error, chorus.Error):
        account.update(
            code=error.code.name, missing_ranks=error.missing_ranks,
            lost_rank=error.lost_rank, lost_ranks=error.lost_ranks,
            lost_worker=error.lost_worker,
            ranks=None if error.ranks is None else
            {str(k): v for k, v in error.ranks.items()})
    return account


def serve() -> None:
    """A rank process: joins the chorus process group, then runs the
    functions the test process sends on stdin until it says "exit".
    """
    import chorus.torch  # noqa: F401  (registers the backend)
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    host, port = os.environ["CHORUS_TEST_STORE"].rsplit(":", 1)
    timeout = datetime.timedelta(
        seconds=float(os.environ["CHORUS_TEST_TIMEOUT"]))
    init_method = os.environ.get("CHORUS_TEST_INIT_METHOD")
    options = None
    if os.environ.get("CHORUS_TEST_DEVICE") == "cuda":
        import torch
        gpu = rank % torch.cuda.device_count()
        options = chorus.torch.Options(device=f"cuda:{gpu}")
    if init_method:
        dist.init_process_group("chorus", init_method=init_method, rank=rank,
                                world_size=world_size, timeout=timeout,
                                pg_options=options)
    else:
        store = dist.TCPStore(host, int(port), world_size, False,
                              datetime.timedelta(seconds=START_TIMEOUT))
        dist.init_process_group("chorus", store=store, rank=rank,
                                world_size=world_size, timeout=timeout,
                                pg_options=options)
    _send({"kind": "ready", "rank": rank})
    context = RankContext(rank, world_size)
    for line in sys.stdin:
        if line.strip() == "exit":
            break
        request = json.loads(line)
        try:
            module = importlib.import_module(request["module"])
            function = getattr(module, request["function"])
            value = function(context, **request["kwargs"])
            _send({"kind": "result", "rank": rank, "value": value})
        except BaseException as e:  # reported, the rank goes on
            _send({"kind": "result", "rank": rank, "error": describe(e)})
    dist.destroy_process_group()
