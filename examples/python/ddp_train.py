#!/usr/bin/env python3
r"""Trains a small model with torch's DistributedDataParallel through Chorus.

Every step, each rank takes its share of one synthetic batch (the same
batch on every rank, from a fixed seed), computes its gradients, and DDP
averages them across the ranks with Chorus all-reduces, so every rank ends
with the same parameters, the ones one process gets from the whole batch.

From the top of a built checkout (scripts/build.sh), with the chorus
package installed into build/python (see client/python/README.md):

    PYTHONPATH=build/python /usr/bin/python3 examples/python/ddp_train.py \
        --world-size 2

starts a coordinator and one worker daemon per rank on 127.0.0.1 from
build/ (or $CHORUS_BUILD_DIR, or a folder of binaries $CHORUS_BIN_DIR),
each serving its local API on a Unix socket of its own in a temporary
folder, runs the ranks as processes of this script (each through its
worker's socket), prints rank 0's loss, and stops the daemons. --backend
gloo runs the same training on torch's own gloo backend instead (no
daemons). --single-process trains on the whole batch in this process,
without torch.distributed: the parameters DDP must reproduce.
--device cuda trains on GPUs instead: rank r on GPU r modulo the GPUs this
host has (LOCAL_RANK under torchrun), with the chorus backend staging the
gradients through pinned host memory on the current stream.

With RANK and WORLD_SIZE set (torchrun sets them, with MASTER_ADDR and
MASTER_PORT), it runs that one rank against daemons you started yourself,
joining the Chorus group $CHORUS_GROUP through the worker at $CHORUS_WORKER
("unix:/path" or "host:port"), or without it through the default socket of
the worker on this host ($XDG_RUNTIME_DIR/chorus/worker.sock, or
/tmp/chorus-<uid>/worker.sock, where a worker started without
--local_socket serves it):

    CHORUS_GROUP=train PYTHONPATH=build/python \
        torchrun --nproc_per_node 2 examples/python/ddp_train.py

(with one worker per host, or per rank: ranks of one group can share it;
$CHORUS_TLS_DIR names a client certificate for a host:port worker with
TLS).
"""

import argparse
import datetime
import os
import socket
import subprocess
import sys
import time
from typing import List, Optional, Tuple

try:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
except ImportError:
    sys.exit("this example needs PyTorch (Debian: apt-get install "
             "python3-torch; run it with /usr/bin/python3)")


INPUTS = 32
"""Features of one synthetic sample."""


def build_model(hidden: int, seed: int) -> torch.nn.Module:
    """The example model: a three-layer perceptron from INPUTS features to
    one output, initialised from `seed` (the same on every rank).
    """
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(INPUTS, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, 1))


def make_batch(step: int, batch: int, seed: int
               ) -> Tuple[torch.Tensor, torch.Tensor]:
    """The whole synthetic batch of `step`: inputs and a smooth target of
    them, the same on every rank.
    """
    generator = torch.Generator().manual_seed(seed * 100003 + step)
    x = torch.randn(batch, INPUTS, generator=generator)
    weights = torch.linspace(-1.0, 1.0, INPUTS)
    y = torch.sin(x @ weights).unsqueeze(1)
    return x, y


def shard(x: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank `rank`'s equal share of a batch's rows."""
    rows = x.shape[0] // world_size
    return x[rank * rows:(rank + 1) * rows]


def rank_device(kind: str, rank: int) -> torch.device:
    """The device rank `rank` trains on: the CPU, or for "cuda" GPU
    LOCAL_RANK (or `rank`) modulo the GPUs this host has.
    """
    if kind == "cpu":
        return torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", rank))
    return torch.device("cuda", local % torch.cuda.device_count())


def train(model: torch.nn.Module, steps: int, batch: int, lr: float,
          seed: int, rank: int = 0, world_size: int = 1,
          log: bool = False,
          device: Optional[torch.device] = None) -> List[float]:
    """Runs `steps` SGD steps on this rank's share of each batch (moved to
    `device`, the CPU when None) and returns this rank's losses.
    """
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for step in range(steps):
        x, y = make_batch(step, batch, seed)
        x, y = shard(x, rank, world_size), shard(y, rank, world_size)
        if device is not None:
            x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()  # DDP averages the gradients here
        optimizer.step()
        losses.append(loss.item())
        if log:
            print(f"step {step + 1}/{steps}: loss {loss.item():.6f}",
                  flush=True)
    return losses


def parameters_of(model: torch.nn.Module) -> torch.nn.Module:
    """The model under a DDP wrapper, or the model itself."""
    return model.module if isinstance(model, DistributedDataParallel) \
        else model


def run_rank(args: argparse.Namespace) -> None:
    """One rank: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT from the
    environment; for chorus also CHORUS_GROUP and CHORUS_WORKER (default:
    the worker's default socket on this host).
    """
    if args.backend == "chorus":
        try:
            import chorus.torch  # noqa: F401  (registers the backend)
        except ImportError as e:
            sys.exit(f"cannot import chorus.torch ({e}); see "
                     "client/python/README.md")
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if args.batch % world_size:
        sys.exit(f"--batch {args.batch} does not split into {world_size} "
                 "equal shares")
    dist.init_process_group(
        args.backend, rank=rank, world_size=world_size,
        timeout=datetime.timedelta(seconds=args.timeout))
    try:
        device = rank_device(args.device, rank)
        model = build_model(args.hidden, args.seed).to(device)
        model = DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None)
        started = time.monotonic()
        losses = train(model, args.steps, args.batch, args.lr, args.seed,
                       rank, world_size, log=rank == 0 and not args.quiet,
                       device=device)
        elapsed = time.monotonic() - started
        if rank == 0:
            print(f"{args.backend}, {world_size} ranks: {args.steps} steps "
                  f"in {elapsed:.2f} s, final loss {losses[-1]:.6f}",
                  flush=True)
            if args.save:
                torch.save(parameters_of(model).to("cpu").state_dict(),
                           args.save)
    finally:
        dist.destroy_process_group()


def run_single(args: argparse.Namespace) -> None:
    """The same training in one process on the whole batch."""
    device = rank_device(args.device, 0)
    model = build_model(args.hidden, args.seed).to(device)
    losses = train(model, args.steps, args.batch, args.lr, args.seed,
                   log=not args.quiet, device=device)
    print(f"single process: {args.steps} steps, final loss "
          f"{losses[-1]:.6f}", flush=True)
    if args.save:
        torch.save(model.to("cpu").state_dict(), args.save)


def _free_port() -> int:
    """A port nothing listens on now, for torch's store (as torchrun's
    standalone mode picks one).
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args: argparse.Namespace, argv: List[str]) -> int:
    """Starts the daemons (for chorus) and one process per rank; returns
    the first failing rank's exit status, or 0.
    """
    # Beside this script (its folder is on the path when it runs as one).
    from local_cluster import LocalCluster
    env = dict(os.environ, WORLD_SIZE=str(args.world_size),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               CHORUS_GROUP="ddp-example")
    # One compute thread per rank unless told otherwise, as torchrun does:
    # the ranks share this host's cores.
    env.setdefault("OMP_NUM_THREADS", "1")
    # The gloo backend needs no daemons.
    cluster = (LocalCluster(args.world_size, prefix="chorus-ddp-")
               if args.backend == "chorus" else None)
    try:
        ranks = []
        for rank in range(args.world_size):
            rank_env = dict(env, RANK=str(rank))
            if cluster is not None:
                rank_env["CHORUS_WORKER"] = cluster.sockets[rank]
            ranks.append(subprocess.Popen(
                [sys.executable, __file__] + argv, env=rank_env))
        statuses = [p.wait() for p in ranks]
        return next((s for s in statuses if s), 0)
    finally:
        if cluster is not None:
            cluster.stop()


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line; see --help."""
    parser = argparse.ArgumentParser(
        description="Train a small model with DistributedDataParallel over "
        "the chorus torch.distributed backend. Without RANK in the "
        "environment it starts a coordinator, one worker per rank and the "
        "rank processes itself; with RANK and WORLD_SIZE (as torchrun sets "
        "them) it is that one rank, joining $CHORUS_GROUP through the "
        "worker at $CHORUS_WORKER (default: the worker's default Unix "
        "socket on this host).")
    parser.add_argument("--world-size", type=int, default=2,
                        help="ranks to start (default 2; ignored when RANK "
                        "is set)")
    parser.add_argument("--steps", type=int, default=20,
                        help="training steps (default 20)")
    parser.add_argument("--batch", type=int, default=64,
                        help="samples per step over all ranks, split "
                        "equally (default 64)")
    parser.add_argument("--hidden", type=int, default=256,
                        help="width of the two hidden layers (default 256)")
    parser.add_argument("--lr", type=float, default=0.05,
                        help="SGD learning rate (default 0.05, momentum 0.9)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the model and the data (default 0)")
    parser.add_argument("--backend", choices=("chorus", "gloo"),
                        default="chorus",
                        help="torch.distributed backend (default chorus)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="train on the CPU (default) or on GPUs: rank r "
                        "on GPU LOCAL_RANK (or r) modulo the GPUs of the "
                        "host")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds the join and each collective may take "
                        "(default 60)")
    parser.add_argument("--save", metavar="PATH",
                        help="write the final parameters (rank 0's) to PATH "
                        "with torch.save")
    parser.add_argument("--single-process", action="store_true",
                        help="train on the whole batch in this process, "
                        "without torch.distributed: the result DDP must "
                        "reproduce")
    parser.add_argument("--quiet", action="store_true",
                        help="print only the summary line")
    args = parser.parse_args(argv)
    if args.world_size < 1 or args.steps < 1 or args.batch < 1:
        parser.error("--world-size, --steps and --batch must be at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device on this host")
    return args


def main() -> None:
    """Runs one rank, the single-process reference, or the launcher."""
    args = parse_args()
    if args.single_process:
        run_single(args)
    elif os.environ.get("RANK") is not None:
        run_rank(args)
    else:
        if args.batch % args.world_size:
            sys.exit(f"--batch {args.batch} does not split into "
                     f"{args.world_size} equal shares")
        sys.exit(launch(args, sys.argv[1:]))


if __name__ == "__main__":
    main()
