#!/usr/bin/env python3
r"""What a step boundary costs an elastic group: sync() with no newcomer
waiting next to an 8-byte all_reduce, in the same ranks and the same run.

Starts a coordinator and one worker daemon per rank on 127.0.0.1 (the
examples' LocalCluster), and --ranks rank processes that join one elastic
group (min_world_size 1) through their own daemon, or, with
--worker=embedded, with the worker runtime in their own process
(chorus.join(coordinator=...)). Each rank then alternates --rounds blocks
of --calls timed sync() calls and --calls timed all_reduce calls of two
f32 (8 bytes), back to back, after a warm-up of each. A block's time is
the mean per call of the slowest rank; the table gives the median over
the rounds and the ratio sync / all_reduce (the reference is the
all_reduce of the same run, as absolute times drift on a shared machine).

From the top of a built checkout, with the package installed into
build/python (client/python/README.md):

    PYTHONPATH=build/python /usr/bin/python3 bench/elastic_sync.py --ranks=2
    PYTHONPATH=build/python /usr/bin/python3 bench/elastic_sync.py \
        --ranks=4 --worker=embedded

Every call has a deadline (--timeout); the daemons are stopped on exit.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" /
                       "python"))

GROUP = "elastic-sync-bench"
OPS = ("sync", "all_reduce")


def time_block(comm: "object", op: str, calls: int) -> float:
    """Seconds per call of `calls` calls of `op` back to back."""
    x = np.zeros(2, np.float32)
    out = np.empty_like(x)
    start = time.perf_counter()
    for _ in range(calls):
        if op == "sync":
            comm.sync()
        else:
            comm.all_reduce(x, out=out)
    return (time.perf_counter() - start) / calls


def run_rank(args: argparse.Namespace) -> None:
    """One rank: joins, warms up, times the blocks and prints them as one
    JSON line: {"sync": [...], "all_reduce": [...]} seconds per call."""
    import chorus
    where = ({"coordinator": args.where} if args.worker == "embedded" else
             {"worker": args.where})
    comm = chorus.join(GROUP, args.ranks, args.rank, min_world_size=1,
                       timeout=args.timeout, **where)
    for op in OPS:
        time_block(comm, op, args.calls)
    blocks: Dict[str, List[float]] = {op: [] for op in OPS}
    for _ in range(args.rounds):
        for op in OPS:
            comm.barrier()
            blocks[op].append(time_block(comm, op, args.calls))
    print(json.dumps(blocks), flush=True)
    comm.close()


def launch(args: argparse.Namespace) -> int:
    """Starts the cluster and the ranks; prints the table."""
    from local_cluster import LocalCluster
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with LocalCluster(args.ranks, prefix="chorus-sync-bench-") as cluster:
        ranks = []
        for rank in range(args.ranks):
            where = (cluster.coordinator if args.worker == "embedded" else
                     cluster.sockets[rank])
            ranks.append(subprocess.Popen(
                [sys.executable, __file__, f"--ranks={args.ranks}",
                 f"--rank={rank}", f"--where={where}",
                 f"--worker={args.worker}", f"--calls={args.calls}",
                 f"--rounds={args.rounds}", f"--timeout={args.timeout}"],
                env=env, stdout=subprocess.PIPE, text=True))
        outputs = [r.communicate(timeout=args.timeout * 10)[0] for r in ranks]
        if any(r.returncode != 0 for r in ranks):
            print("a rank failed", file=sys.stderr)
            return 1
    per_rank = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
    medians = {}
    for op in OPS:
        slowest = [max(rank[op][i] for rank in per_rank)
                   for i in range(args.rounds)]
        medians[op] = statistics.median(slowest)
    print(f"{args.ranks} ranks, {args.worker} workers, {args.rounds} rounds "
          f"of {args.calls} calls each")
    print("op          | us per call | ratio to all_reduce 8 B")
    for op in OPS:
        print(f"{op:11s} | {medians[op] * 1e6:11.1f} | "
              f"{medians[op] / medians['all_reduce']:.2f}")
    return 0


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line; see --help."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2,
                        help="ranks (default 2)")
    parser.add_argument("--worker", choices=("daemon", "embedded"),
                        default="daemon",
                        help="through a worker daemon per rank (default) or "
                        "with the worker runtime in each rank")
    parser.add_argument("--calls", type=int, default=200,
                        help="timed calls per block (default 200)")
    parser.add_argument("--rounds", type=int, default=7,
                        help="blocks of each op (default 7)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="each call's deadline in seconds (default 60)")
    parser.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--where", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ranks < 1 or args.calls < 1 or args.rounds < 1:
        parser.error("--ranks, --calls and --rounds must be positive")
    return args


def main() -> None:
    """Runs one rank (--rank given) or the launcher."""
    args = parse_args()
    sys.exit(run_rank(args) if args.rank >= 0 else launch(args))


if __name__ == "__main__":
    main()
