#!/usr/bin/env python3
r"""DDP step time on the chorus torch backend next to torch's own gloo.

For each world size it starts a chorus-coordinator and one chorus-worker per
rank on 127.0.0.1 (from the build tree; each worker serves a Unix socket of
its own in a scratch folder, --local_socket, which its rank joins through,
and so its call socket, where the rank's collectives go), then
one process per rank. Every rank builds the model of
examples/python/ddp_train.py twice, wraps one copy
in DistributedDataParallel over the default process group (backend chorus)
and the other over a gloo group of the same ranks (dist.new_group(backend=
"gloo")), and trains both on the same synthetic batches: blocks of --steps
timed steps, chorus and gloo taking turns (--rounds of each, the order
swapped every round), after --warmup untimed steps each. Each rank runs
with OMP_NUM_THREADS=1 unless it is set (as torchrun does). A step is
zero_grad, forward, backward (where DDP reduces the gradients) and the
optimizer step. A block's time per step is the slowest rank's mean; the
table prints the median over the rounds, and "compute" is the same step
without DDP (no communication), for scale.

From the top of a built checkout, with the package installed into
build/python (client/python/README.md):

    PYTHONPATH=build/python /usr/bin/python3 bench/ddp_vs_gloo.py
    PYTHONPATH=build/python /usr/bin/python3 bench/ddp_vs_gloo.py \
        --ranks=2,4 --steps=100 --rounds=5 --hidden=512

The target (issue 17): chorus's step time no more than gloo's (ratio <= 1).
Every process it starts is stopped on success, error or Ctrl-C; the whole
run is bounded by --max_time.
"""

import argparse
import datetime
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "python" / "ddp_train.py"
# A rank's report line starts with this.
_MARK = "@@ddp-bench "


class BenchError(Exception):
    """A failure that ends the run."""


def load_example() -> ModuleType:
    """Imports examples/python/ddp_train.py (its model and data)."""
    spec = importlib.util.spec_from_file_location("ddp_train", EXAMPLE)
    if spec is None or spec.loader is None:
        raise BenchError(f"cannot load {EXAMPLE}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- one rank ----------------------------------------------------------------


def run_rank(args: argparse.Namespace) -> None:
    """One rank: times DDP steps on chorus and on gloo, prints its report."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import chorus.torch  # noqa: F401  (registers the backend)

    example = load_example()
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=args.timeout)
    dist.init_process_group("chorus", rank=rank, world_size=world,
                            timeout=timeout)
    gloo = dist.new_group(backend="gloo", timeout=timeout)
    groups = {"chorus": None, "gloo": gloo}
    models = {
        name: DistributedDataParallel(
            example.build_model(args.hidden, args.seed), process_group=group)
        for name, group in groups.items()}
    models["compute"] = example.build_model(args.hidden, args.seed)
    optimizers = {name: torch.optim.SGD(m.parameters(), lr=1e-3)
                  for name, m in models.items()}
    batches = []
    for step in range(8):
        x, y = example.make_batch(step, args.batch, args.seed)
        batches.append((example.shard(x, rank, world),
                        example.shard(y, rank, world)))
    step_count = [0]

    def step(name: str) -> None:
        x, y = batches[step_count[0] % len(batches)]
        step_count[0] += 1
        optimizers[name].zero_grad()
        loss = torch.nn.functional.mse_loss(models[name](x), y)
        loss.backward()
        optimizers[name].step()

    def block(name: str) -> float:
        for _ in range(args.warmup):
            step(name)
        dist.barrier(group=gloo)  # the same starting line for both
        started = time.perf_counter()
        for _ in range(args.steps):
            step(name)
        return (time.perf_counter() - started) / args.steps

    times: Dict[str, List[float]] = {"chorus": [], "gloo": [], "compute": []}
    for round_number in range(args.rounds):
        order = ["chorus", "gloo"] if round_number % 2 == 0 else \
            ["gloo", "chorus"]
        for name in order + ["compute"]:
            times[name].append(block(name))
    sys.stdout.write(_MARK + json.dumps({"rank": rank, "times": times}) +
                     "\n")
    sys.stdout.flush()
    dist.destroy_process_group()


# --- the run -----------------------------------------------------------------


def _binary(name: str, subdir: str) -> str:
    if os.environ.get("CHORUS_BIN_DIR"):
        path = Path(os.environ["CHORUS_BIN_DIR"]) / name
    else:
        build = Path(os.environ.get("CHORUS_BUILD_DIR", REPO / "build"))
        path = (build if build.is_absolute() else REPO / build) / subdir / name
    if not os.access(path, os.X_OK):
        raise BenchError(f"{path} is missing; build Chorus first "
                         "(scripts/build.sh)")
    return str(path)


def _start(command: List[str], port_file: Path, name: str,
           running: List["subprocess.Popen[bytes]"]) -> int:
    process = subprocess.Popen(command + [f"--port_file={port_file}"],
                               stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    running.append(process)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BenchError(f"{name} exited with {process.returncode}")
        text = port_file.read_text().strip() if port_file.exists() else ""
        if text:
            return int(text)
        time.sleep(0.05)
    raise BenchError(f"{name} did not start within 30 s")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(world: int, args: argparse.Namespace, argv: List[str],
            deadline: float) -> Dict[str, float]:
    """Runs one world size; returns seconds per step by name (the median
    over the rounds of the slowest rank's mean).
    """
    running: List["subprocess.Popen[bytes]"] = []
    with tempfile.TemporaryDirectory(prefix="chorus-ddp-bench-") as folder:
        try:
            coordinator = _start(
                [_binary("chorus-coordinator", "server/coordinator"),
                 "--listen=127.0.0.1:0"], Path(folder, "coordinator.port"),
                "chorus-coordinator", running)
            # A Unix socket each (workers on one host must not share the
            # default one).
            for r in range(world):
                _start([_binary("chorus-worker", "server/worker"),
                        f"--coordinator=127.0.0.1:{coordinator}",
                        "--listen=127.0.0.1:0", f"--name=bench-{r}",
                        f"--local_socket={folder}/w{r}.sock"],
                       Path(folder, f"worker-{r}.port"), f"worker {r}",
                       running)
            env = dict(os.environ, WORLD_SIZE=str(world),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
                       CHORUS_GROUP=f"ddp-bench-{world}")
            env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun sets it
            ranks = [subprocess.Popen(
                [sys.executable, __file__, "--rank-mode"] + argv,
                env=dict(env, RANK=str(r),
                         CHORUS_WORKER=f"unix:{folder}/w{r}.sock"),
                stdout=subprocess.PIPE, text=True) for r in range(world)]
            running.extend(ranks)  # type: ignore[arg-type]
            reports = []
            for r, process in enumerate(ranks):
                try:
                    out, _ = process.communicate(
                        timeout=max(deadline - time.monotonic(), 1))
                except subprocess.TimeoutExpired:
                    raise BenchError(f"rank {r} did not finish within "
                                     "--max_time") from None
                if process.returncode != 0:
                    raise BenchError(f"rank {r} exited with "
                                     f"{process.returncode}")
                lines = [line for line in out.splitlines()
                         if line.startswith(_MARK)]
                if not lines:
                    raise BenchError(f"rank {r} reported nothing")
                reports.append(json.loads(lines[-1][len(_MARK):]))
        finally:
            for process in reversed(running):
                if process.poll() is None:
                    process.terminate()
            for process in running:
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
    result = {}
    for name in ("chorus", "gloo", "compute"):
        slowest = [max(rep["times"][name][i] for rep in reports)
                   for i in range(args.rounds)]
        result[name] = statistics.median(slowest)
    return result


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line; see --help."""
    parser = argparse.ArgumentParser(
        description="DDP step time of the example model with backend "
        "chorus next to gloo, in the same ranks.")
    parser.add_argument("--ranks", default="2,4",
                        help="world sizes to run, comma-separated "
                        "(default 2,4)")
    parser.add_argument("--steps", type=int, default=50,
                        help="timed steps per block (default 50)")
    parser.add_argument("--warmup", type=int, default=5,
                        help="untimed steps before each block (default 5)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="blocks of each backend, alternating "
                        "(default 3)")
    parser.add_argument("--hidden", type=int, default=256,
                        help="hidden width of the example model "
                        "(default 256, the example's)")
    parser.add_argument("--batch", type=int, default=64,
                        help="samples per step over all ranks (default 64)")
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds each join and collective may take "
                        "(default 60)")
    parser.add_argument("--max_time", type=float, default=600.0,
                        help="bound on the whole run in seconds "
                        "(default 600)")
    parser.add_argument("--rank-mode", action="store_true",
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        args.worlds = [int(w) for w in args.ranks.split(",") if w.strip()]
    except ValueError:
        parser.error(f"--ranks must be integers, got {args.ranks!r}")
    if not args.worlds or min(args.worlds) < 1 or args.steps < 1 or \
            args.rounds < 1:
        parser.error("--ranks, --steps and --rounds must be at least 1")
    for world in args.worlds:
        if args.batch % world:
            parser.error(f"--batch {args.batch} does not split into {world} "
                         "equal shares")
    return args


def main() -> int:
    """Runs the benchmark (or one rank of it) and prints the table."""
    argv = sys.argv[1:]
    args = parse_args(argv)
    if args.rank_mode:
        run_rank(args)
        return 0
    example = load_example()
    params = sum(p.numel() for p in
                 example.build_model(args.hidden, args.seed).parameters())
    print(f"model: examples/python/ddp_train.py, hidden {args.hidden}, "
          f"{params} parameters ({params * 4 / 1024:.0f} KiB of f32 "
          f"gradients); batch {args.batch}; {args.rounds} rounds of "
          f"{args.steps} steps")
    print(f"{'ranks':>5}  {'chorus ms/step':>14}  {'gloo ms/step':>12}  "
          f"{'compute ms/step':>15}  {'chorus/gloo':>11}  target <= 1")
    deadline = time.monotonic() + args.max_time
    met = True
    try:
        for world in args.worlds:
            got = measure(world, args, argv, deadline)
            ratio = got["chorus"] / got["gloo"]
            met = met and ratio <= 1.0
            print(f"{world:>5}  {got['chorus'] * 1e3:>14.3f}  "
                  f"{got['gloo'] * 1e3:>12.3f}  "
                  f"{got['compute'] * 1e3:>15.3f}  {ratio:>11.2f}  "
                  f"{'met' if ratio <= 1.0 else 'missed'}", flush=True)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0 if met else 2


if __name__ == "__main__":
    sys.exit(main())
