"""The "chorus" torch.distributed backend: its options, how a process group
finds its Chorus group and joins it, and its registration with torch. The
process group itself is ProcessGroupChorus (chorus.torch._process_group).

torch.distributed.init_process_group("chorus", ...) and new_group(...) call
create_process_group(), which joins the Chorus group (chorus.join) with the
rank, world size and timeout torch gives it: the timeout is the join's and
every collective's deadline. Each process group is its own Chorus group:
the default group is named $CHORUS_GROUP (or Options.group), a subgroup
"<that name>/<torch's group id>", which every rank computes alike because
every rank creates the subgroups in the same order. Without a configured
name, rank 0 of each group picks a fresh one and hands it to the others
through torch's store.

Thread safety: create_process_group() runs once per process group, on the
thread torch calls it from.
"""

import os
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional

import torch.distributed as dist

import chorus
from chorus.errors import InvalidArgument
from chorus.torch._process_group import BACKEND, ProcessGroupChorus

__all__ = ["BACKEND", "Options", "ProcessGroupChorus",
           "create_process_group", "register"]

# The store key under which rank 0 hands out a group name it picked.
_NAME_KEY = "chorus/group_name"


@dataclass
class Options:
    """How the chorus backend reaches Chorus; pass as
    init_process_group(..., pg_options=Options(...)) or new_group(...,
    pg_options=...). Every field left None comes from the environment.

    Attributes:
        worker: the worker daemon's local API, "unix:/path" or "host:port";
            default $CHORUS_WORKER, else the worker's default socket on this
            host (chorus.default_socket_path()).
        group: the Chorus group's name for the default process group
            (subgroups append "/<torch group id>"); default $CHORUS_GROUP,
            else a fresh name rank 0 picks and shares through torch's store.
        device: where the daemon reduces: "cpu" (default), "cuda:0", ...;
            for a rank that embeds the worker runtime, the GPU it joins on,
            whose contiguous tensors its collectives then read and write
            where they are (chorus.torch._tensors).
        tls_dir: for a host:port worker started with --tls_dir, the
            directory of this rank's client certificate (ca.pem, cert.pem,
            key.pem); default $CHORUS_TLS_DIR. See chorus.join.
        coordinator: instead of a worker daemon, the coordinator's
            "host:port": the rank runs the worker runtime in its own process
            (chorus.join(coordinator=...): no hop to a daemon, and every
            collective reads and writes the tensors in place); default
            $CHORUS_COORDINATOR where no worker is given. Setting both
            CHORUS_WORKER and CHORUS_COORDINATOR, or both fields, is
            InvalidArgument.
    """

    worker: Optional[str] = None
    group: Optional[str] = None
    device: str = "cpu"
    tls_dir: Optional[str] = None
    coordinator: Optional[str] = None


def _group_name(options: Options, store: Any, rank: int, group_id: str,
                is_default: bool, timeout: timedelta) -> str:
    """The Chorus group's name: configured (with "/<group id>" for a
    subgroup), or picked by rank 0 and shared through the store.
    """
    base = options.group or os.environ.get("CHORUS_GROUP") or None
    if base is not None:
        return base if is_default else f"{base}/{group_id}"
    if rank == 0:
        name = f"torch-{uuid.uuid4().hex[:12]}"
        store.set(_NAME_KEY, name)
        return name
    store.set_timeout(timeout)
    return store.get(_NAME_KEY).decode()


def _coordinator(options: Options) -> Optional[str]:
    """The coordinator a rank embeds the worker runtime for: Options'
    coordinator, else $CHORUS_COORDINATOR where no worker is configured;
    None to go through a worker daemon. Raises InvalidArgument where both
    a worker and a coordinator are configured.
    """
    if options.coordinator is not None:
        if options.worker is not None:
            raise InvalidArgument(
                "chorus.torch.Options: give worker or coordinator, not both")
        return options.coordinator
    if options.worker is not None:
        return None
    coordinator = os.environ.get("CHORUS_COORDINATOR") or None
    if coordinator is not None and os.environ.get("CHORUS_WORKER"):
        raise InvalidArgument(
            "both CHORUS_WORKER and CHORUS_COORDINATOR are set: a rank "
            "goes through a worker daemon or embeds the worker runtime, "
            "not both; unset one")
    return coordinator


def create_process_group(backend_options: Any,
                         pg_options: Optional[Options] = None
                         ) -> ProcessGroupChorus:
    """torch's creator function for the backend (registered with
    extended_api=True): joins the Chorus group of a new process group and
    returns it once every rank joined.

    backend_options is torch's _DistributedBackendOptions: store,
    group_rank, group_size, timeout, group_id, global_ranks_in_group (empty
    for the default group). Raises what chorus.join raises: InvalidArgument
    (a malformed worker address or TLS directory, ranks that disagree),
    DeadlineExceeded naming the ranks that did not join within the timeout,
    Unavailable when the worker daemon cannot be reached (no worker socket
    at the default path and no CHORUS_WORKER), PermissionDenied when it
    refuses this caller.
    """
    if pg_options is None:
        options = Options()
    elif isinstance(pg_options, Options):
        options = pg_options
    else:
        raise InvalidArgument(
            f"pg_options for the chorus backend must be a "
            f"chorus.torch.Options, got {type(pg_options).__name__}")
    timeout = backend_options.timeout
    seconds = timeout.total_seconds()
    rank = backend_options.group_rank
    is_default = len(backend_options.global_ranks_in_group) == 0
    coordinator = _coordinator(options)  # refused before the store is used
    name = _group_name(options, backend_options.store, rank,
                       str(backend_options.group_id), is_default, timeout)
    communicator = chorus.join(name, backend_options.group_size, rank,
                               worker=options.worker,
                               coordinator=coordinator,
                               device=options.device, timeout=seconds,
                               tls_dir=options.tls_dir)
    return ProcessGroupChorus(communicator)


def register() -> None:
    """Registers the backend with torch.distributed under the name "chorus"
    (importing chorus.torch does this); calling it again does nothing.
    """
    if BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, create_process_group,
                                  extended_api=True)
