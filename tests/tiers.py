"""The suite's three tiers, and a guard that keeps each test inside its own.

- unit: in-process only. No process is started (no rank, no Papermill kernel, no `python -m ...`),
  so nothing but `make setup` is needed and `make test-quick` runs the tier in a few minutes.
- integration: real rank processes on gloo, real Papermill kernels, real files, the lab's CLI in a
  subprocess. No Slurm, no LaTeX, no MPI, no Horovod.
- system: the real two-node Slurm, LaTeX builds, MPI, Horovod, the benchmarks' smoke runs and the
  documented commands as written.

Every test has one tier: its own marker, else its module's `pytestmark`; a test with none, or
with two of its own, is a collection error. A test below the system tier that asks for the Slurm
cluster is a collection error too. While a test runs, the guard refuses what its tier does not
allow, with the fix in the message: a unit test that starts a process (git and ruff aside), an integration
test that starts one of the system tier's programs directly. The guard sees the processes a test
starts itself, not their children: `make paper` from an integration test is caught by the word
`paper`, not by latexmk. Session fixtures are set up before it: they start no process in the unit
tier (fashion_root fetches in-process).
"""

from __future__ import annotations

import multiprocessing.util
import os
import subprocess
from pathlib import Path

import pytest

# jupytext asks pandoc for its version when it is first imported: a probe, not the test's work
import jupytext  # noqa: F401  (imported before any guard is set)

TIERS = ("unit", "integration", "system")
# programs (or `make` targets) that belong to the system tier
SYSTEM_PROGRAMS = {
    "sbatch",
    "srun",
    "salloc",
    "squeue",
    "scontrol",
    "scancel",
    "sacct",
    "slurmctld",
    "slurmd",
    "munged",
    "mpirun",
    "mpiexec",
    "mpicc",
    "latexmk",
    "pdflatex",
    "horovodrun",
}
SYSTEM_MAKE_TARGETS = {"paper", "horovod", "test", "reliability", "bench", "bench-gpu"}
# what a unit test may still start: git, which the records' provenance asks for the commit (read-only, ~5 ms),
# ruff, the linter (reads the sources, ~0.1 s; it has no Python API), and fc-list, which matplotlib asks once
# for the system's fonts when it builds its font cache (the first pyplot import on a fresh machine)
UNIT_ALLOWED = {"git", "ruff", "fc-list"}


def tier_of(item) -> str | None:
    """The closest tier marker: a test's own, else its module's `pytestmark`."""
    found = [m.name for m in item.iter_markers() if m.name in TIERS]
    return found[0] if found else None


@pytest.hookimpl(tryfirst=True)  # before `-m` selects: it must see one tier per test
def pytest_collection_modifyitems(config, items):
    bad, resolved = [], {}
    for item in items:
        own = [m.name for m in item.own_markers if m.name in TIERS]
        if tier_of(item) is None or len(own) > 1:
            bad.append(f"{item.nodeid}: {'two tier markers ' + ', '.join(own) if own else 'no tier marker'}")
        elif "slurm" in getattr(item, "fixturenames", ()) and tier_of(item) != "system":
            bad.append(f"{item.nodeid}: asks for the Slurm cluster but is marked {tier_of(item)}; mark it system")
        resolved[item] = tier_of(item)
    if bad:
        raise pytest.UsageError(
            "every test needs one tier marker (unit, integration or system), and only the system "
            "tier may ask for the Slurm cluster (tests/tiers.py):\n  " + "\n  ".join(bad)
        )
    # `-m unit` matches any marker on the way up: leave each test its one resolved tier and no other
    for item, tier in resolved.items():
        for node in item.listchain():
            node.own_markers[:] = [m for m in node.own_markers if m.name not in TIERS]
        item.add_marker(tier)
        item.user_properties.append(("tier", tier))  # for the durations table (tests/durations.py)


def _argv(args) -> list[str]:
    if isinstance(args, (str, bytes, os.PathLike)):
        return [os.fsdecode(args)]
    return [os.fsdecode(a) for a in args]


def _system_word(argv: list[str]) -> str | None:
    if not argv or argv[1:] in (["--version"], ["-V"]):  # asking a tool its version probes the machine
        return None
    prog = Path(argv[0]).name
    if prog in SYSTEM_PROGRAMS:
        return prog
    if prog == "make":
        hit = [a for a in argv[1:] if a in SYSTEM_MAKE_TARGETS]
        return f"make {hit[0]}" if hit else None
    if prog in ("bash", "sh") and len(argv) >= 3 and argv[1] == "-c":
        return _system_word(argv[2].split())
    return None


class TierError(AssertionError):
    pass


@pytest.fixture(autouse=True)
def _tier_guard(request, monkeypatch):
    tier = tier_of(request.node)
    where = request.node.nodeid
    if tier == "unit":

        def refuse(*_a, **_k):
            raise TierError(
                f"{where} is marked unit but starts a process: mark it integration (or system), or "
                f"call the code in-process"
            )

        real = subprocess.Popen._execute_child

        def only_allowed(self, args, *rest, **kw):
            argv = _argv(args)
            if not argv or Path(argv[0]).name not in UNIT_ALLOWED:
                refuse()
            return real(self, args, *rest, **kw)

        monkeypatch.setattr(subprocess.Popen, "_execute_child", only_allowed)
        monkeypatch.setattr(os, "fork", refuse)
        monkeypatch.setattr(os, "posix_spawn", refuse)
        monkeypatch.setattr(os, "posix_spawnp", refuse)
        monkeypatch.setattr(os, "system", refuse)
        monkeypatch.setattr(multiprocessing.util, "spawnv_passfds", refuse)
    elif tier == "integration":
        real = subprocess.Popen._execute_child

        def checked(self, args, *rest, **kw):
            word = _system_word(_argv(args))
            if word:
                raise TierError(f"{where} is marked integration but runs `{word}`: mark it system")
            return real(self, args, *rest, **kw)

        monkeypatch.setattr(subprocess.Popen, "_execute_child", checked)
    yield
