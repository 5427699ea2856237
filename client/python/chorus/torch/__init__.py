"""chorus.torch: the "chorus" backend of torch.distributed.

Importing it registers the backend; then

    import torch.distributed as dist
    import chorus.torch  # noqa: F401
    dist.init_process_group("chorus", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))

joins the Chorus group $CHORUS_GROUP through the worker daemon at
$CHORUS_WORKER (default: the worker's Unix socket on this host; with
$CHORUS_TLS_DIR over mutual TLS), or with the worker runtime in the rank's
own process for the coordinator at $CHORUS_COORDINATOR, and
DistributedDataParallel,
dist.all_reduce and the other collectives run on it. torch's own
rendezvous (env://: MASTER_ADDR and MASTER_PORT, as torchrun sets them)
provides the store torch needs for the barrier in init_process_group and
new_group, unless init_method="chorus://host:7000[,...]" keeps it in the
Chorus coordinator (ChorusStore: mutual TLS, per job, no TCPStore); see
README.md next to the chorus package.

torch's own groups cannot change size: for training that goes on when
ranks leave or join, use ElasticGroup (chorus.torch.elastic), which hands
out a process group for the current membership of an elastic Chorus group.
"""

try:
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the host
    raise ImportError(
        f"chorus.torch needs PyTorch with torch.distributed ({e}); on "
        "Debian: apt-get install python3-torch") from e

from chorus.torch._store import ChorusStore, register_rendezvous
from chorus.torch._work import ChorusWork
from chorus.torch.elastic import ElasticGroup
from chorus.torch.backend import (BACKEND, Options, ProcessGroupChorus,
                                  create_process_group, register)

register()
register_rendezvous()

__all__ = ["BACKEND", "Options", "ProcessGroupChorus", "ChorusStore",
           "ChorusWork", "ElasticGroup", "create_process_group", "register",
           "register_rendezvous"]
