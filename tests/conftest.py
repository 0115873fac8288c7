"""Shared test helpers: run the real CLI, write CIFAR-10 files in the official format."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
pytest_plugins = ["tiers", "schedule", "durations"]  # tiers and their guard; xdist groups and order; the table

# Small enough for 2 cores: ResNet-18 topology at width 8, a few steps.
TINY = [
    "--width",
    "8",
    "--precision",
    "fp32",
    "--log_every",
    "0",
    "--timing_warmup_steps",
    "1",
    "--comm_probe_steps",
    "2",
    "--num_workers",
    "0",
]


def merge_args(*args) -> list[str]:
    """CLI arguments where a later `--name value` replaces an earlier one (the CLI refuses repeated flags)."""
    out: dict[str, list[str]] = {}
    flat = [str(a) for a in args]
    i = 0
    while i < len(flat):
        name = flat[i]
        if i + 1 < len(flat) and not flat[i + 1].startswith("--"):
            out[name] = [name, flat[i + 1]]
            i += 2
        else:
            out[name] = [name]
            i += 1
    return [a for pair in out.values() for a in pair]


def merge_p(*args) -> list[str]:
    """Papermill arguments where a later `-p NAME VALUE` replaces an earlier one (`lab run` refuses a parameter
    given twice); everything else passes through in order."""
    flat, out, where = [str(a) for a in args], [], {}
    i = 0
    while i < len(flat):
        if flat[i] == "-p" and i + 2 < len(flat) and flat[i + 1] in where:
            out[where[flat[i + 1]] + 2] = flat[i + 2]
            i += 3
        elif flat[i] == "-p" and i + 2 < len(flat):
            where[flat[i + 1]] = len(out)
            out += flat[i : i + 3]
            i += 3
        else:
            out.append(flat[i])
            i += 1
    return out


def run_cli(*args, env=None, timeout=600) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "kernels.train", *map(str, args)],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


COUNTER = """
import importlib.abc, importlib.util, os, sys

MODULE, NAMES, LOG = {module!r}, {names!r}, {log!r}


class _Count(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            for n in NAMES:
                def counted(*a, _f=getattr(module, n), _n=n, **k):
                    with open(LOG, "a") as out:
                        out.write(f"{{os.getpid()}} {{_n}} {{sorted(k.items())}}\\n")
                    return _f(*a, **k)
                setattr(module, n, counted)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Count())
"""


def counting_env(tmp: Path, module: str, names: list[str]) -> tuple[dict, Path]:
    """An environment whose Python processes log every call of `module`'s functions `names` (module globals, so
    calls inside the module count too) to the returned file: one line per call, "PID NAME KEYWORD-ARGUMENTS"."""
    site, log = tmp / "counting-site", tmp / "calls.log"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(COUNTER.format(module=module, names=names, log=str(log)))
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}, log


def cli_in_process(capsys, monkeypatch, *args) -> tuple[int, str, str]:
    """`lab train ARGS` called in this process: (exit status, stdout, stderr).

    For input that must be refused before any work: a one-rank run that got past the checks would run
    here (and its status be 0, which the caller's assertion refuses); ranks are never started in a unit
    test (tests/tiers.py). The real process's exit status is checked by one subprocess test per CLI.
    """
    import signal

    from kernels import train

    monkeypatch.setattr(train, "leave", lambda rc: None)  # a rank's os._exit would end pytest itself
    usr1 = signal.getsignal(signal.SIGUSR1)
    capsys.readouterr()
    try:
        rc = train.main([str(a) for a in args])
    finally:
        signal.signal(signal.SIGUSR1, usr1)
    out, err = capsys.readouterr()
    return rc, out, err


def write_cifar_tarball(directory: Path, per_batch: int = 20, seed: int = 0) -> tuple[Path, dict]:
    """A cifar-10-python.tar.gz in the official layout with `per_batch` images per batch file.

    Written here, independently of kernels/: pickles (protocol 2) of dicts with
    bytes keys, b"data" uint8 (N, 3072) as R, G, B planes row-major.
    Returns (tarball path, {'train': (x, y), 'test': (x, y)}) with x as N,3,32,32.
    """
    rng = np.random.default_rng(seed)
    members, truth = {}, {"train": ([], []), "test": ([], [])}
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        x = rng.integers(0, 256, size=(per_batch, 3, 32, 32), dtype=np.uint8)
        y = rng.integers(0, 10, size=per_batch)
        entry = {
            b"batch_label": name.encode(),
            b"labels": [int(v) for v in y],
            b"data": x.reshape(per_batch, 3072),
            b"filenames": [b"x.png"] * per_batch,
        }
        members[name] = pickle.dumps(entry, protocol=2)
        split = "test" if name == "test_batch" else "train"
        truth[split][0].append(x)
        truth[split][1].append(y)
    members["batches.meta"] = pickle.dumps(
        {b"label_names": [b"c%d" % i for i in range(10)], b"num_cases_per_batch": per_batch, b"num_vis": 3072},
        protocol=2,
    )
    members["readme.html"] = b"<html></html>"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "cifar-10-python.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    out = {k: (np.concatenate(v[0]), np.concatenate(v[1])) for k, v in truth.items()}
    return path, out


def load_checkpoint(path: Path) -> dict:
    """A checkpoint's state, verified and read as data only, as a resume reads it."""
    from kernels.records import checkpoint_file as checkpoint

    state, problem = checkpoint.read_state(Path(path))
    assert state is not None, f"{path}: {problem}"
    return state


def md5(path: Path) -> str:
    return hashlib.md5(Path(path).read_bytes()).hexdigest()


@pytest.fixture
def cifar_root(tmp_path):
    """A data root with a small CIFAR-10 fetched (from a file:// URL): (root, the arrays, each file's md5). The lab
    checks CIFAR-10 against the official md5s only; a test passes these to verify and read its own set."""
    from kernels.data import cifar10

    src, truth = write_cifar_tarball(tmp_path / "src", per_batch=40)
    root = tmp_path / "data"
    d = cifar10.fetch(root, url=src.as_uri(), md5=md5(src))
    return root, truth, {p.name: md5(p) for p in d.iterdir()}


DEBIAN = Path("/usr/share/datasets/fashion-mnist")  # Debian's dataset-fashion-mnist


@pytest.fixture(scope="session")
def fashion_root(tmp_path_factory):
    """A data root with the real Fashion-MNIST, fetched --from Debian's package."""
    if not DEBIAN.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but Debian's dataset-fashion-mnist is not installed")
        pytest.skip("needs Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist; .ci/run does)")
    import contextlib

    from kernels import cli

    root = tmp_path_factory.mktemp("data")
    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    try:  # `lab fetch` in-process: the unit tier reads the real files without starting a process
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(["fetch", "fashion-mnist", "--from", str(DEBIAN), "--root", str(root)])
    finally:
        sys.argv = argv
    assert rc == 0, err.getvalue()
    assert "fashion-mnist ready and verified" in out.getvalue()
    return root


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A real Slurm cluster (controller + 2 emulated nodes) for the session; env to talk to it.

    Outside CI the tests that need it skip with the reason; under CI=true they must run.
    """
    import slurm_cluster

    reason = slurm_cluster.available()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but no Slurm: {reason}")
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("slurm")
    env = slurm_cluster.start(base)
    yield {**env, "base": base}
    slurm_cluster.stop(base)


# ------------------------------------------------- the reliability table (tests/test_faults.py)
FAULT_ROWS: list[dict] = []
FAULT_TABLE = ROOT / "results" / "reliability.json"


def record_fault(case: str, bound_s: float, took_s: float, exit_status, outcome: str) -> None:
    """One row of the reliability table: the fault, its bound, the measured time to the run's end."""
    FAULT_ROWS.append(
        {"case": case, "bound_s": bound_s, "took_s": round(took_s, 1), "exit_status": exit_status, "outcome": outcome}
    )


def pytest_sessionfinish(session, exitstatus):
    """Keep the measured rows (results/reliability.json, git-ignored) for `make reliability`."""
    if FAULT_ROWS:
        import datetime
        import platform

        FAULT_TABLE.parent.mkdir(parents=True, exist_ok=True)
        FAULT_TABLE.write_text(
            json.dumps(
                {
                    "measured_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                    "machine": f"{platform.node()}, {os.cpu_count()} cores",
                    "rows": FAULT_ROWS,
                },
                indent=2,
            )
            + "\n"
        )
