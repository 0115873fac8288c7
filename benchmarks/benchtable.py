"""What every benchmark table shares: the header naming the machine and versions, and where the table goes."""

from __future__ import annotations

import json
import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path

from kernels.base import sysinfo
from kernels.base.files import atomic_write_text

ROOT = Path(__file__).resolve().parent.parent


def header(title: str) -> list[str]:
    """The table's title and the line that names host, cores, software versions and git commit."""
    versions = sysinfo.software_versions()
    return [
        f"# {title}",
        "",
        f"host {sysinfo.host()}, {os.cpu_count()} CPU cores; "
        + ", ".join(f"{k} {v}" for k, v in versions.items() if v)
        + f"; git {sysinfo.git_info().get('commit') or 'n/a'}",
        "",
    ]


def provenance(device_name: str) -> dict:
    """Where and with what a benchmark record was measured: device, host, cores, software versions, git commit."""
    return {
        "device": device_name,
        "host": sysinfo.host(),
        "cores": os.cpu_count(),
        "versions": sysinfo.software_versions(),
        "git": sysinfo.git_info().get("commit"),
    }


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()


def write(
    lines: list[str], out: Path, device_name: str, prefix: str = "", echo: bool = True, record: dict | None = None
) -> Path:
    """Store the table as <out>/<prefix><device slug>.md (and `record`, when given, as the .json beside it, which
    the documents read), and print it unless echo is False. Each file is written whole through a temporary name
    and a rename: never half a table, and never through a link planted at its name."""
    text = "\n".join(lines) + "\n"
    path = out / f"{prefix}{slug(device_name)}.md"
    atomic_write_text(path, text)  # makes `out` where missing
    if record is not None:
        atomic_write_text(path.with_suffix(".json"), json.dumps(record, indent=1) + "\n")
    if echo:
        print("\n" + text + f"\nwritten to {path}")
    return path


def headlines_path(out: Path) -> Path:
    """Where this machine's headline figures go: one file per host CPU model, whatever device each benchmark ran on,
    so that one `make bench` on one machine fills one file."""
    return out / f"headlines-{slug(sysinfo.cpu_device_name())}.json"


def headline(out: Path, bench: str, device_name: str, table: Path, figures: dict) -> None:
    """Store a benchmark's headline figures (merged into headlines_path under `bench`, with its device, the git
    commit and the time), which bench_summary.py sets beside the speed targets."""
    import time

    path = headlines_path(out)
    # the lab writes this file whole, never as a link: one found there was planted, and is replaced unread
    data = json.loads(path.read_text()) if path.is_file() and not path.is_symlink() else {}
    data[bench] = {
        "device": device_name,
        "table": table.name,
        "git": sysinfo.git_info().get("commit"),
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **figures,
    }
    atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def train_command(params: dict) -> list[str]:
    """`python -m kernels.train --k v ...` for `params` (booleans as true/false), echoed as it runs."""
    cmd = [sys.executable, "-m", "kernels.train"]
    for k, v in params.items():
        cmd += [f"--{k}", str(v).lower() if isinstance(v, bool) else str(v)]
    print("+ " + " ".join(cmd), flush=True)
    return cmd


@contextmanager
def trained(params: dict, timeout: float | None = None, run_id: str = "bench", prefix=(), env: dict | None = None):
    """One run of the lab's loop (`python -m kernels.train`) with `params` in a temporary results folder, behind
    an optional command `prefix` (a profiler's) with `env` added and LAB_RUN_DIR set as the driver sets it: its
    record's folder while the context lasts. Raises RuntimeError with the run's last output line when it fails."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        rec = Path(tmp) / run_id
        cmd = [*prefix, *train_command({**params, "results_dir": tmp, "run_id": run_id})]
        environ = {**os.environ, **(env or {}), "LAB_RUN_DIR": str(rec)}
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=environ)
        if p.returncode != 0 or not (rec / "summary.json").exists():
            last = (p.stderr or p.stdout).strip().splitlines()[-1:] or [f"exit status {p.returncode}"]
            raise RuntimeError(f"the lab's run failed: {last[0]}")
        yield rec


def lab_run(params: dict, timeout: float | None = None) -> dict:
    """One run of the lab's loop (trained): its summary.json with its resolved parameters under "params"."""
    import json

    with trained(params, timeout) as rec:
        summary = json.loads((rec / "summary.json").read_text())
        return {**summary, "params": json.loads((rec / "config.json").read_text())["params"]}


def commbench(params: dict, env: dict | None = None, timeout: float = 900) -> dict:
    """One `lab comm bench` (python -m kernels.comm bench --k v ...) in a temporary results folder: its record
    (kernels/comm/bench.read_record). Raises RuntimeError with the run's last output when it fails."""
    import os
    import subprocess
    import tempfile

    from kernels.comm.bench import read_record

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "kernels.comm", "bench", "--results_dir", tmp, "--run_id", "bench"]
        for k, v in params.items():
            cmd += [f"--{k}", str(v)]
        p = subprocess.run(
            cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
        )
        if p.returncode != 0 or not (Path(tmp) / "bench" / "summary.json").exists():
            raise RuntimeError(f"lab comm bench failed: {(p.stderr or p.stdout).strip()[-300:]}")
        return read_record(Path(tmp) / "bench")
