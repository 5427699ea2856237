#!/usr/bin/env python3
r"""Trains a small model on an elastic Chorus group that loses a rank and
takes a new one, and goes on.

Every step each rank computes the gradients of its share of one synthetic
batch and the ranks average them with torch.distributed's all_reduce on
the process group of chorus.torch.ElasticGroup, so every rank holds the
same parameters. The group is joined with min_world_size: when a rank
dies, the others' all_reduce raises chorus.MembershipChanged (the group
has already moved to its next epoch, with fewer ranks, and
ElasticGroup.process_group is the new one), and they redo the step. Every
step starts with ElasticGroup.sync(), where newcomers waiting to join are
admitted and handed rank 0's parameters and step, so the newcomer goes on
from there.

From the top of a built checkout (scripts/build.sh), with the chorus
package installed into build/python (see client/python/README.md):

    PYTHONPATH=build/python /usr/bin/python3 examples/python/elastic_train.py

starts a coordinator and one worker daemon per rank plus one spare on
127.0.0.1, runs --world-size ranks as processes of this script, kills one
with SIGKILL at step --kill-at, starts a replacement as a newcomer once the
others went on (--cycles times), checks that every rank ends with the same
parameters and prints, for each kill, when every survivor held its
MembershipChanged and when the replacement was admitted.
"""

import argparse
import hashlib
import os
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional

import numpy as np

try:
    import torch
    import torch.distributed as dist
except ImportError:
    sys.exit("this example needs PyTorch (Debian: apt-get install "
             "python3-torch; run it with /usr/bin/python3)")

import chorus
from chorus.torch import ElasticGroup

INPUTS = 16
"""Features of one synthetic sample."""
GROUP = "elastic-example"


def build_model(seed: int) -> torch.nn.Module:
    """A small perceptron, the same on every rank for one seed."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(INPUTS, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 1))


def batch_of(step: int, rank: int, world: int, batch: int) -> Any:
    """This rank's share of step `step`'s batch (the same batch everywhere)."""
    generator = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(batch, INPUTS, generator=generator)
    y = x.sum(dim=1, keepdim=True).sin()
    share = (batch + world - 1) // world
    return x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]


def vector(tensors: Any) -> np.ndarray:
    """The tensors as one float32 array."""
    return torch.nn.utils.parameters_to_vector(
        [t.detach() for t in tensors]).numpy().astype(np.float32)


def say(event: str, step: int, world: int) -> None:
    """One line of the rank's log, read by the launcher."""
    print(f"{time.time():.6f} step={step} world={world} {event}",
          flush=True)


def train_step(group: ElasticGroup, model: torch.nn.Module, step: int,
               args: argparse.Namespace) -> None:
    """One step: this rank's gradients, averaged over the group, applied."""
    x, y = batch_of(step, group.rank, group.world_size, args.batch)
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    grads = torch.nn.utils.parameters_to_vector(
        [p.grad for p in model.parameters()])
    dist.all_reduce(grads, group=group.process_group)
    grads /= group.world_size
    with torch.no_grad():
        for p, g in zip(model.parameters(),
                        torch.split(grads, [p.numel() for p in
                                            model.parameters()])):
            p -= args.lr * g.view_as(p)


def run_rank(args: argparse.Namespace) -> None:
    """One rank: joins (as a newcomer without RANK) and trains."""
    worker = os.environ["CHORUS_WORKER"]
    rank = os.environ.get("RANK")
    group = ElasticGroup(GROUP, args.world_size,
                         None if rank is None else int(rank), worker=worker,
                         min_world_size=args.min_world_size, timeout=60)
    model = build_model(args.seed)
    step = 0
    if rank is None:
        say("admitted", step, group.world_size)
    while step < args.steps:
        try:
            epoch = group.epoch
            step = group.sync(model, step=step)  # newcomers get the state
            if group.epoch != epoch:
                say("admitted a newcomer", step, group.world_size)
            train_step(group, model, step, args)
            say("done", step, group.world_size)
            step += 1
            time.sleep(args.step_seconds)  # the rest of a real step's work
        except chorus.MembershipChanged as e:
            say(f"membership changed: left {e.left}, rank now {e.rank}",
                step, e.world_size)
    digest = hashlib.sha256(vector(model.parameters()).tobytes()).hexdigest()
    say(f"parameters {digest[:16]}", step, group.world_size)
    group.close()


class Rank:
    """A rank's process and the lines it printed, read on a thread."""

    def __init__(self, argv: List[str], env: Dict[str, str]) -> None:
        self.process = subprocess.Popen([sys.executable, __file__] + argv,
                                        env=env, stdout=subprocess.PIPE,
                                        text=True)
        self.lines: List[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.strip())

    def count(self, text: str) -> int:
        """Lines so far that contain `text`."""
        return sum(text in line for line in list(self.lines))

    def wait_for(self, text: str, times: int = 1,
                 timeout: float = 120) -> float:
        """Waits until `times` lines containing `text` came; returns when
        the last of them was printed (the rank's clock).
        """
        deadline = time.monotonic() + timeout
        while self.count(text) < times:
            if time.monotonic() > deadline or self.process.poll() is not None:
                sys.exit(f"a rank never printed {text!r} {times} times: "
                         f"{self.lines[-3:]}")
            time.sleep(0.01)
        return float([line for line in list(self.lines)
                      if text in line][times - 1].split()[0])


    def first_after(self, marker: str, times: int, text: str,
                    timeout: float = 120) -> float:
        """Waits for the first line containing `text` after the `times`-th
        line containing `marker`; returns when it was printed.
        """
        deadline = time.monotonic() + timeout
        while True:
            lines = list(self.lines)
            marks = [i for i, line in enumerate(lines) if marker in line]
            if len(marks) >= times:
                for line in lines[marks[times - 1] + 1:]:
                    if text in line:
                        return float(line.split()[0])
            if time.monotonic() > deadline or self.process.poll() is not None:
                sys.exit(f"a rank never printed {text!r} after {marker!r}: "
                         f"{lines[-3:]}")
            time.sleep(0.01)


def launch(args: argparse.Namespace, argv: List[str]) -> int:
    """Runs the ranks; --cycles times kills the newest and starts a
    replacement. Prints the timeline; returns 0 when every rank alive at
    the end holds the same parameters.
    """
    # Beside this script (its folder is on the path when it runs as one).
    from local_cluster import LocalCluster
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with LocalCluster(args.world_size + 1, prefix="chorus-elastic-") as c:
        ranks = [Rank(argv, dict(env, RANK=str(r),
                                 CHORUS_WORKER=c.sockets[r]))
                 for r in range(args.world_size)]
        first = ranks[0]
        first.wait_for(f"step={args.kill_at} ")
        rows = []
        for cycle in range(args.cycles):
            victim = ranks.pop()
            victim.process.kill()
            killed = time.time()
            victim.process.wait()
            changed = max(r.wait_for("membership changed", cycle + 1)
                          for r in ranks)
            # Each survivor's retried step, from the change it caught.
            retried = max(
                r.first_after("membership changed", cycle + 1, " done") -
                r.wait_for("membership changed", cycle + 1) for r in ranks)
            # The replacement takes the victim's worker.
            worker = c.sockets[args.world_size - 1 if cycle % 2 else -1]
            ranks.append(Rank(argv, dict(env, CHORUS_WORKER=worker)))
            admitted = first.wait_for("admitted a newcomer", cycle + 1)
            rows.append((cycle + 1, changed - killed, retried,
                         admitted - killed))
            # The next victim is the replacement: once it trains.
            ranks[-1].wait_for("done")
        statuses = [r.process.wait(timeout=600) for r in ranks]
    print("cycle | every survivor has MembershipChanged (s after the kill) "
          "| retried step done (s after the change, slowest survivor) "
          "| replacement admitted (s after the kill)")
    for cycle, changed, retried, admitted in rows:
        print(f"{cycle:5d} | {changed:8.3f} | {retried:8.3f} | "
              f"{admitted:8.3f}")
    digests = {r.lines[-1].rsplit(" ", 1)[-1] for r in ranks}
    same = len(digests) == 1 and all(s == 0 for s in statuses)
    print("every rank holds the same parameters" if same else
          f"ranks differ: {digests}, exit statuses {statuses}")
    return 0 if same else 1


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line; see --help."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=3,
                        help="ranks to start (default 3)")
    parser.add_argument("--min-world-size", type=int, default=2,
                        help="the group's minimum (default 2)")
    parser.add_argument("--steps", type=int, default=60,
                        help="training steps (default 60)")
    parser.add_argument("--step-seconds", type=float, default=0.1,
                        help="time each step spends besides its collectives, "
                        "standing for the model's work (default 0.1): the "
                        "replacement must start before the others finish")
    parser.add_argument("--kill-at", type=int, default=8,
                        help="the step at which the last rank is killed "
                        "(default 8)")
    parser.add_argument("--batch", type=int, default=48,
                        help="samples per step over all ranks (default 48)")
    parser.add_argument("--lr", type=float, default=0.05,
                        help="SGD learning rate (default 0.05)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the model (default 0)")
    parser.add_argument("--cycles", type=int, default=1,
                        help="times the newest rank is killed and replaced "
                        "(default 1); give --steps enough for them")
    args = parser.parse_args(argv)
    if not 1 <= args.min_world_size < args.world_size:
        parser.error("--min-world-size must be at least 1 and below "
                     "--world-size")
    if not 0 <= args.kill_at < args.steps:
        parser.error("--kill-at must be a step below --steps")
    return args


def main() -> None:
    """Runs one rank (CHORUS_WORKER set) or the launcher."""
    args = parse_args()
    if os.environ.get("CHORUS_WORKER") is not None:
        run_rank(args)
    else:
        sys.exit(launch(args, sys.argv[1:]))


if __name__ == "__main__":
    main()
