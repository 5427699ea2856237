"""A Chorus worker inside this process, for ranks that skip the daemon.

A rank normally reaches the coordinator through a worker daemon: every
collective is a hop to the daemon and back, and the daemon's CPU time is
spent on top of the rank's. An EmbeddedWorker runs the worker runtime in
this process instead (the chorus._embedded extension, built with Chorus
itself): it registers with the coordinator as a worker of its own, serves
the peer data plane, and takes this process's collectives with no socket in
between. Everything else is as with a daemon: the same joins, plans, checks,
codes and error details, and ranks on daemons and embedded ranks can share
a group.

    with chorus.join("g", 2, 0, coordinator="10.0.0.1:7000") as comm:
        comm.all_reduce(x)

join(coordinator=...) starts one EmbeddedWorker per coordinator and
process, on first use, and keeps it until the process exits; make one
yourself for other settings (listen=, name=) and pass it as worker=.

The runtime serves its local API on a Unix socket in a private directory of
its own (mode 0700), which join() dials like a daemon's; it is removed at
close(). Its peers reach it at `listen` (loopback by default: every rank on
this host); ranks on other hosts need an address they can reach. With
tls_dir (a worker's certificate, as a daemon's --tls_dir) the worker speaks
mutual TLS to the coordinator and its peers; TLS is then on for the whole
process, so every embedded worker of a process passes the same tls_dir.
Without it, it listens in plaintext, as a daemon started with --insecure.
"""

import atexit
import os
import shutil
import tempfile
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import grpc
import numpy as np

from chorus import _connect, _status_details
from chorus.errors import (Error, FailedPrecondition, InvalidArgument,
                           ResourceExhausted, error_for_code)

__all__ = ["EmbeddedWorker", "available", "shared_worker"]

_BY_VALUE: Dict[int, grpc.StatusCode] = {
    c.value[0]: c for c in grpc.StatusCode}

# How a refusal of a device begins (common/device.h).

try:
    from chorus import _embedded  # type: ignore[attr-defined]
    _MISSING: Optional[str] = None
except ImportError as e:  # installed without the module built by CMake
    _embedded = None
    _MISSING = str(e)

def available() -> bool:
    """Whether this installation has the embedded worker (chorus._embedded,
    which `pip install client/python` takes from a Chorus build named by
    $CHORUS_BUILD_DIR).
    """
    return _embedded is not None

def _error_of(e: Exception, coordinator: str) -> Error:
    """The chorus.Error for the extension's (code, message[, status])
    exception; `status`, when there, is the serialized google.rpc.Status
    whose details the error's attributes come from.
    """
    code, message = grpc.StatusCode.UNKNOWN, str(e)
    details: List[Tuple[str, Any]] = []
    if len(e.args) in (2, 3) and isinstance(e.args[0], int):
        code = _BY_VALUE.get(e.args[0], grpc.StatusCode.UNKNOWN)
        message = str(e.args[1])
        if len(e.args) == 3 and isinstance(e.args[2], bytes):
            decoded = _status_details.decode(
                [(_status_details.DETAILS_KEY, e.args[2])])
            details = decoded[2] if decoded is not None else []
    return error_for_code(code)(
        f"embedded worker for coordinator {coordinator}: {message}", code,
        details)

class EmbeddedWorker:
    """A worker runtime in this process, registered with a coordinator.

    Thread-safe. Use it as a context manager or call close(); worker
    objects still open when the interpreter exits are closed then.
    """

    def __init__(self, coordinator: str, *, listen: str = "127.0.0.1:0",
                 advertise_address: str = "", name: str = "",
                 register_timeout: float = 30.0,
                 tls_dir: Optional[_connect.PathLike] = None,
                 emulated_gpus: int = 0) -> None:
        """Starts the runtime and registers it with `coordinator`
        ("host:port").

        Args:
            coordinator: the coordinator's gRPC address.
            listen: where the peer data plane listens, "host:port" (port 0
                picks one); peers on other hosts must reach it there.
            advertise_address: the address peers are told, when not the
                listen address ("host" or "host:port").
            name: the worker's name at the coordinator; default its
                advertised address.
            register_timeout: seconds to reach the coordinator.
            tls_dir: a directory with ca.pem, cert.pem and key.pem, the
                worker's certificate (chorus://worker/NAME; `name` defaults
                to NAME), as a daemon's --tls_dir: the coordinator and the
                peers are then reached over mutual TLS. TLS goes on for the
                whole process: the first embedded worker of a process to
                start decides whether it is on and with which files.
            emulated_gpus: for tests of GPU code on machines without one:
                register this many GPUs emulated in host memory instead of
                this machine's (Cuda(0) ...; 1 GiB each, memory from
                emulated_memory()).

        Raises:
            FailedPrecondition: this installation has no embedded worker;
                or TLS in this process is not what tls_dir asks (on with
                other files, on while tls_dir is not given, or off while a
                worker without it runs).
            InvalidArgument: a malformed address or option; TLS files that
                do not load, or are not a worker's certificate of `name`.
            Unavailable: the address cannot be bound.
            DeadlineExceeded: the coordinator could not be reached in time.
            Unimplemented: a device of this host cannot take part.
        """
        if _embedded is None:
            raise FailedPrecondition(
                "this chorus package has no embedded worker (chorus."
                "_embedded): build Chorus (scripts/build.sh), then install "
                "the package with CHORUS_BUILD_DIR naming that build "
                f"({_MISSING})")
        tls_dir = _connect.tls_dir_text("" if tls_dir is None else tls_dir)
        if tls_dir:
            tls_dir = os.path.abspath(tls_dir)
        self._coordinator = coordinator
        # A fork of this process has none of the runtime's threads: there
        # the worker counts as closed and close() touches nothing.
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._dir = tempfile.mkdtemp(prefix="chorus-embedded-")
        self._socket = os.path.join(self._dir, "local.sock")
        try:
            self._worker = _embedded.Worker(
                coordinator, self._socket, listen=listen,
                advertise_address=advertise_address, name=name,
                register_timeout=float(register_timeout), tls_dir=tls_dir,
                emulated_gpus=int(emulated_gpus))
        # ValueError: bad arguments; RuntimeError: (code, message).
        except (ValueError, RuntimeError) as e:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise _error_of(e, coordinator) from None
        except BaseException:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        self._closed = False
        atexit.register(self.close)

    @property
    def coordinator(self) -> str:
        """The coordinator it registered with."""
        return self._coordinator

    @property
    def target(self) -> str:
        """Its local API's gRPC target, "unix:/path", as join() dials it."""
        return "unix:" + self._socket

    @property
    def address(self) -> str:
        """The address its peers reach its data plane at."""
        return self._worker.address

    @property
    def name(self) -> str:
        """The name it registered under."""
        return self._worker.name

    @property
    def closed(self) -> bool:
        """Whether close() ran, or this is a fork of the process that
        started it (the worker runs in that process only).
        """
        return self._closed or os.getpid() != self._pid

    def calls(self) -> Any:
        """A new channel for collective frames into this worker (a
        chorus._call_socket Connection). Raises OSError once closed.
        """
        return self._worker.calls()

    @staticmethod
    def all_reduce_here(channel: Any, numbering: Any, socket: Any,
                        prepare: Callable[[Any, Any], Tuple[bytes, Any]],
                        not_here: Any, timeout: float) -> Any:
        """The blocking all_reduce of numpy arrays that a communicator makes
        through `channel` (from calls(); `socket` its CallSocket) in one
        call into the extension (chorus._embedded.AllReduceHere, which says
        what it takes and returns): it takes its numbers from `numbering`
        (the communicator's chorus._numbering.Numbering, through take() and
        done()), prepare(x, op) gives (the request's bytes but its number
        and data, the call) of one it has not seen, and `timeout` is the
        communicator's default.
        """
        return _embedded.AllReduceHere(channel, numbering, socket, prepare,
                                       np.empty_like, np.ndarray, not_here,
                                       timeout)

    def emulated_memory(self, device: int, nbytes: int) -> Any:
        """Returns `nbytes` of the memory of emulated GPU Cuda(device) (a
        worker started with emulated_gpus): a chorus._embedded.
        EmulatedMemory, whose `pointer` is the device address and whose
        buffer is the same bytes seen from the host. Freed when it goes.

        Raises:
            InvalidArgument: this worker has no such emulated GPU.
            ResourceExhausted: the GPU's memory is used up.
        """
        try:
            return self._worker.emulated_memory(int(device), int(nbytes))
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
        except MemoryError as e:
            raise ResourceExhausted(str(e)) from None

    def close(self) -> None:
        """Deregisters and stops serving (calls still in flight end with
        Unavailable), and removes its socket's directory. Idempotent. In a
        fork of the process that started it, does nothing.
        """
        if os.getpid() != self._pid:
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self.close)
        self._worker.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> "EmbeddedWorker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"EmbeddedWorker(coordinator={self._coordinator!r}, "
                f"target={self.target!r})")

_shared_lock = threading.Lock()
_shared: Dict[str, EmbeddedWorker] = {}

def _forget_shared_in_child() -> None:
    """After a fork, in the child: the parent's workers are not this
    process's to share (nor is the state of the lock).
    """
    global _shared_lock
    _shared_lock = threading.Lock()
    _shared.clear()

os.register_at_fork(after_in_child=_forget_shared_in_child)

def shared_worker(coordinator: str) -> EmbeddedWorker:
    """The process's EmbeddedWorker for `coordinator` with default settings,
    started on first use (join(coordinator=...) uses it). Raises as
    EmbeddedWorker() does.
    """
    with _shared_lock:
        worker = _shared.get(coordinator)
        if worker is None or worker.closed:
            worker = EmbeddedWorker(coordinator)
            _shared[coordinator] = worker
        return worker
