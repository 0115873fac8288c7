"""Nsight reports in a run directory read back into its record: what nsight.py (Nsight Systems) and ncu.py
(Nsight Compute) share. The wrappers leave <run>/<folder>/*<suffix>; each tool's module reads one report into a
dict and combines them into <run>/<folder>/summary.json, written atomically, with a report the tool cannot
read named in `problems`."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

SUMMARY = "summary.json"


def is_nccl(kernel: str) -> bool:
    """Whether a kernel name (as nsys and ncu print it, demangled) is one of NCCL's: communication, not compute."""
    return kernel.lstrip().lower().startswith(("nccl", "void nccl"))


@dataclass(frozen=True)
class Reports:
    folder: str  # nsys | ncu, under the run directory
    suffix: str  # .nsys-rep | .ncu-rep
    tool: str  # the executable
    what: str  # its product name, for errors
    sbatch: str  # the wrapper that leaves the reports
    read: Callable[[Path, str], dict]  # (report, tool path) -> the report's figures
    combine: Callable[[dict, list], dict]  # ({stem: figures}, problems) -> the summary


def summarize(run_dir: Path, kind: Reports, tool: str | None = None) -> Path:
    """<run>/<folder>/summary.json from every report there; the path written."""
    from kernels.base.errors import ConfigError
    from kernels.records.schema import write_json

    reports = sorted((Path(run_dir) / kind.folder).glob(f"*{kind.suffix}"))
    if not reports:
        raise ConfigError(f"{run_dir}: no {kind.folder}/*{kind.suffix} (a run profiled by {kind.sbatch})")
    tool = tool or shutil.which(kind.tool)
    if not tool:
        raise ConfigError(f"{kind.tool} is not on PATH; load the {kind.what} module (or install it) and run this again")
    per, problems = {}, []
    for rep in reports:
        try:
            per[rep.stem] = kind.read(rep, tool)
        except (ValueError, KeyError, subprocess.TimeoutExpired) as e:
            problems.append(f"{rep.name}: {e}")
    path = Path(run_dir) / kind.folder / SUMMARY
    write_json(path, kind.combine(per, problems))
    return path


def pending(runs_dir: Path, kind: Reports) -> list[Path]:
    """The run directories under runs_dir holding reports of this kind but no summary of them yet."""
    return sorted(
        d
        for d in Path(runs_dir).glob("*")
        if (d / kind.folder).is_dir()
        and any((d / kind.folder).glob(f"*{kind.suffix}"))
        and not (d / kind.folder / SUMMARY).exists()
    )
