"""The example a new user runs first still runs, through daemons and with
ranks that embed their workers.
"""

import os
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

import chorus
from chorus import embedded
from conftest import REPO, binaries


@pytest.mark.parametrize("flags", [[], ["--embedded"]],
                         ids=["daemons", "embedded"])
def test_allreduce_example(flags: List[str]) -> None:
    binaries()  # fails clearly when the daemons are not built
    if flags and not embedded.available():
        pytest.skip("chorus._embedded is not installed")
    env = dict(os.environ)
    for name in ("CHORUS_WORKER", "CHORUS_GROUP", "CHORUS_WORLD_SIZE",
                 "CHORUS_RANK"):
        env.pop(name, None)
    package_root = str(Path(chorus.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_root, env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "python" / "allreduce.py"),
         *flags],
        env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for rank in (0, 1):
        assert any(line.startswith(f"rank {rank}: all_reduce") and
                   "= [0.0, 3.0, 6.0, 9.0]" in line for line in lines), lines
        assert any(line.startswith(f"rank {rank}: mismatch reported")
                   for line in lines), lines
