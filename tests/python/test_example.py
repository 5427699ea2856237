"""The example a new user runs first still runs."""

import os
import subprocess
import sys
from pathlib import Path

import chorus
from conftest import REPO, binaries


def test_allreduce_example() -> None:
    binaries()  # fails clearly when the daemons are not built
    env = dict(os.environ)
    for name in ("CHORUS_WORKER", "CHORUS_GROUP", "CHORUS_WORLD_SIZE",
                 "CHORUS_RANK"):
        env.pop(name, None)
    package_root = str(Path(chorus.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_root, env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "python" / "allreduce.py")],
        env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for rank in (0, 1):
        assert any(line.startswith(f"rank {rank}: all_reduce") and
                   "= [0.0, 3.0, 6.0, 9.0]" in line for line in lines), lines
        assert any(line.startswith(f"rank {rank}: mismatch reported")
                   for line in lines), lines
