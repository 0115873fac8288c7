"""The tiers' guard (tests/tiers.py) refuses what a tier does not allow, and lets through what it does."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tiers import TierError, _system_word, tier_of

pytestmark = pytest.mark.unit


def test_a_unit_test_cannot_start_a_process():
    with pytest.raises(TierError, match="is marked unit but starts a process: mark it integration"):
        subprocess.run([sys.executable, "-c", "pass"])
    with pytest.raises(TierError):
        os.system("true")
    assert subprocess.run(["git", "--version"], capture_output=True).returncode == 0  # the one exception


@pytest.mark.integration
def test_an_integration_test_starts_processes_but_not_the_system_tiers_programs(tmp_path):
    assert subprocess.run([sys.executable, "-c", "pass"]).returncode == 0
    for argv in (["sbatch", "job.sh"], ["make", "-C", str(tmp_path), "paper"], ["bash", "-c", "mpirun -np 2 x"]):
        with pytest.raises(TierError, match="is marked integration but runs .*: mark it system"):
            subprocess.run(argv)


def test_the_system_tiers_programs_are_recognised():
    assert _system_word(["/usr/bin/srun", "-n", "2"]) == "srun"
    assert _system_word(["make", "paper", "RESULTS=x"]) == "make paper"
    assert _system_word(["make", "demo"]) is None  # Papermill and gloo ranks: integration
    assert _system_word(["latexmk", "-pdf"]) == "latexmk"
    assert _system_word([sys.executable, "-m", "kernels.train"]) is None
    assert _system_word(["srun", "--version"]) is None  # a version query (SYSTEM.md's probe) uses nothing


def test_a_test_has_its_own_tier_else_its_modules(request):
    assert tier_of(request.node) == "unit"
