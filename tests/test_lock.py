"""The CUDA lock (constraints-cuda.txt, tools/lock.py): what a GPU cluster's `make setup CUDA=1` installs."""

from __future__ import annotations

import gzip
import importlib.util
import json
import subprocess
import sys

import pytest

from conftest import ROOT

_spec = importlib.util.spec_from_file_location("lock", ROOT / "tools" / "lock.py")
lock = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lock)

pytestmark = pytest.mark.unit

REPORT = ROOT / "tests" / "data" / "pip-report-torch-2.13.0-pypi.json.gz"  # pip 23.2's --report, as written


def test_the_cuda_lock_is_what_pip_resolved_and_agrees_with_the_base_lock():
    """constraints-cuda.txt is exactly `tools/lock.py cuda` of pip's own resolution of torch==2.13.0 from PyPI
    under constraints.txt (kept beside the tests), pins the CUDA runtime packages torch leaves as ranges
    (cuda-bindings, cuda-pathfinder, nvidia-nvjitlink), and agrees with constraints.txt on every package both
    pin."""
    report = json.loads(gzip.decompress(REPORT.read_bytes()))
    cuda_lock, base = ROOT / "constraints-cuda.txt", ROOT / "constraints.txt"
    assert lock.from_report(report) == cuda_lock.read_text()
    assert lock.problems(cuda_lock, base) == []
    pins = lock.read_pins(cuda_lock)
    assert pins["torch"] == lock.read_pins(base)["torch"] == "2.13.0"
    torch_requires = next(i for i in report["install"] if i["metadata"]["name"] == "torch")["metadata"]["requires_dist"]
    ranged = [r.split(";")[0] for r in torch_requires if r.startswith(("cuda-bindings", "nvidia-nvjitlink"))]
    assert ranged and all("==" not in r for r in ranged)  # what the lock exists for: torch leaves these free
    assert {"cuda-bindings", "cuda-pathfinder", "nvidia-nvjitlink", "triton", "nvidia-nccl-cu13"} <= set(pins)
    assert lock.locked_cuda(cuda_lock) == "13.0"


def test_a_lock_that_disagrees_or_a_cpu_resolution_is_refused(tmp_path):
    base = tmp_path / "constraints.txt"
    base.write_text("torch==2.13.0\nfilelock==4.2.11\n")
    bad = tmp_path / "constraints-cuda.txt"
    bad.write_text("# (CUDA runtime 13.0)\ntorch==2.13.0\nfilelock==4.3.1\ntriton==3.7.1\n")
    found = lock.problems(bad, base)
    assert "filelock: constraints-cuda.txt pins 4.3.1, constraints.txt 4.2.11" in found
    assert any("pins no nvidia-nccl*" in p for p in found)
    cpu = {"install": [{"metadata": {"name": "torch", "version": "2.13.0+cpu"}}]}
    with pytest.raises(SystemExit, match="torch 2.13.0\\+cpu, a build without CUDA"):
        lock.from_report(cpu)


@pytest.mark.integration
def test_verify_refuses_a_cpu_torch_under_the_cuda_lock():
    """`make setup CUDA=1` ends with `tools/lock.py verify`: this CPU environment passes the base lock and fails
    the CUDA lock, saying what to do."""

    def run(f):
        return subprocess.run([sys.executable, "tools/lock.py", "verify", f], cwd=ROOT, capture_output=True, text=True)

    import torch

    p = run("constraints-cuda.txt")
    if torch.version.cuda is None:
        assert p.returncode == 1 and "built for CUDA none (a CPU build)" in p.stderr and "make setup CUDA=1" in p.stderr
    p = run("constraints.txt")
    assert p.returncode == 0 and "installed packages match constraints.txt" in p.stdout, p.stderr
