"""Benchmark records in the documents: results/bench/<name>-<device>.json, written by benchmarks/*.py, each naming
the device and host it ran on. A document quotes a benchmark only when its device is among the hardware of the
records the build selected (Table I names that hardware); one measured elsewhere is not quoted, and the section
says where it was measured and which command measures it here."""

from __future__ import annotations

import json
from pathlib import Path

from kernels.base.files import PROJECT_ROOT


def load(name: str, dirs: list[Path] | None = None) -> list[dict]:
    """The `name` benchmark records (results/bench/<name>-*.json) of the repository and of `dirs`, one per file,
    each with the file it came from (`path`); the same file reached twice is read once."""
    seen, out = set(), []
    for d in [PROJECT_ROOT / "results" / "bench", *(dirs or [])]:
        for p in sorted(Path(d).glob(f"{name}-*.json")):
            if p.resolve() in seen:
                continue
            seen.add(p.resolve())
            rec = json.loads(p.read_text())
            if not rec.get("device"):
                raise ValueError(f"{p}: a benchmark record names no device; rerun the benchmark that wrote it")
            out.append({**rec, "path": str(p)})
    return out


def on_hardware(recs: list[dict], hardware: set[str]) -> tuple[list[dict], list[dict]]:
    """(records measured on one of `hardware`'s devices, the others)."""
    return [r for r in recs if r["device"] in hardware], [r for r in recs if r["device"] not in hardware]


def elsewhere(recs: list[dict]) -> str:
    """'CPU (X) (host h), ...': where benchmarks not quoted were measured."""
    return ", ".join(sorted({f"{r['device']} (host {r.get('host') or 'unknown'})" for r in recs}))
