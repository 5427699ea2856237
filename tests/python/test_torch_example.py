"""examples/python/ddp_train.py trains through Chorus and ends where one
process training on the whole batch ends.
"""

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

import chorus  # noqa: E402
from conftest import REPO, binaries  # noqa: E402

EXAMPLE = REPO / "examples" / "python" / "ddp_train.py"
STEPS = 5


def _env() -> Dict[str, str]:
    """The environment of a new user's shell: the package importable, no
    rank or Chorus variables set.
    """
    env = dict(os.environ)
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "CHORUS_WORKER", "CHORUS_GROUP", "CHORUS_WORLD_SIZE",
                 "CHORUS_RANK"):
        env.pop(name, None)
    package_root = str(Path(chorus.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_root, env.get("PYTHONPATH")) if p)
    return env


def _run(args: List[str]) -> str:
    done = subprocess.run([sys.executable, str(EXAMPLE)] + args, env=_env(),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_ddp_train_two_ranks_match_a_single_process_run(
        tmp_path: Path) -> None:
    binaries()  # fails clearly when the daemons are not built
    ddp, single = tmp_path / "ddp.pt", tmp_path / "single.pt"
    out = _run(["--world-size", "2", "--steps", str(STEPS), "--quiet",
                "--save", str(ddp)])
    assert f"chorus, 2 ranks: {STEPS} steps" in out, out
    _run(["--single-process", "--steps", str(STEPS), "--quiet",
          "--save", str(single)])
    got, expected = torch.load(ddp), torch.load(single)
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5,
                                   atol=1e-6, msg=name)
    # The training moved the parameters: the comparison means something.
    from importlib import util
    spec = util.spec_from_file_location("ddp_train", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = util.module_from_spec(spec)
    spec.loader.exec_module(example)
    defaults = example.parse_args([])
    initial = example.build_model(defaults.hidden, defaults.seed).state_dict()
    assert any(not torch.allclose(initial[k], expected[k]) for k in initial)


def test_ddp_train_help_names_its_modes() -> None:
    out = _run(["--help"])
    for option in ("--world-size", "--backend", "--single-process",
                   "--device", "CHORUS_WORKER", "torchrun"):
        assert option in out, out


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_ddp_train_device_cuda_without_gpu_says_so() -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE), "--device", "cuda"],
                          env=_env(), capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "torch sees no CUDA device" in done.stderr, done.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU visible")
def test_ddp_train_on_gpus_matches_a_single_gpu_run(tmp_path: Path) -> None:
    binaries()
    ddp, single = tmp_path / "ddp.pt", tmp_path / "single.pt"
    out = _run(["--world-size", "2", "--steps", str(STEPS), "--quiet",
                "--device", "cuda", "--save", str(ddp)])
    assert f"chorus, 2 ranks: {STEPS} steps" in out, out
    _run(["--single-process", "--device", "cuda", "--steps", str(STEPS),
          "--quiet", "--save", str(single)])
    got, expected = torch.load(ddp), torch.load(single)
    for name in expected:
        # GPU kernels may sum in another order than one process does.
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4,
                                   atol=1e-5, msg=name)
