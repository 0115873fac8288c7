"""Nsight Systems and Nsight Compute on the GPU at hand, read back by the lab's readers: `make bench-gpu`'s `nsight`.

The profile jobs (slurm/profile_nsys.sbatch, slurm/profile_ncu.sbatch) put a tool's prefix
(kernels/profiling/tools.py) before every rank and read the reports back when the run is done
(python -m kernels.profiling nsys-summary | ncu-summary). This runs one short ResNet-18 run (one GPU, the
validation's batch and width, profile_with=external over a few steps) under each tool found on PATH, with the
prefix a Slurm rank gets (its report named rank0-jbench, LAB_RUN_DIR set as the driver sets it), reads the
reports with the same readers, and keeps each summary beside the tables (<out>/<gpu>-nsys-summary.json,
-ncu-summary.json): the readers' first real reports. ncu profiles 100 launches with its basic set (Speed of
Light and Occupancy, what the reader keeps) instead of the job's 400 with the full set, to fit the validation's
minutes.

A tool not on PATH is a line saying so and the fix; the harness's CPU check meets only that line.
"""

from __future__ import annotations

import json
import os
from functools import reduce
from pathlib import Path

import benchtable  # benchmarks/, this script's directory

PROFILED_STEPS = 5
NCU_ENV = {"LAB_NCU_COUNT": "100", "LAB_NCU_SET": "basic"}


def profiled_params(batch: int, width: int, warmup: int, workers: int) -> dict:
    """A short ResNet-18 run whose active steps a profiler's capture range covers (profile_with=external)."""
    return {
        "workload": "resnet18",
        "dataset": "synthetic",
        "gpus": 1,
        "batch": batch,
        "width": width,
        "epochs": 1,
        "train_samples": batch * (warmup + PROFILED_STEPS + 3),
        "test_samples": batch,
        "precision": "bf16",
        "num_workers": workers,
        "profile_with": "external",
        "profile_steps": PROFILED_STEPS,
        "profile_wait": warmup,
        "profile_warmup": 1,
        "log_every": 0,
        "checkpoint_every": 0,
    }


def rank_prefix(tool: str) -> list[str]:
    """The tool's rank prefix with the report names a Slurm rank takes from SLURM_PROCID and SLURM_JOB_ID fixed:
    with those set, the lab would take the machine for a Slurm allocation and start the rank through srun."""
    from kernels.profiling import tools

    names = {"%q{SLURM_PROCID}": "0", "%q{SLURM_JOB_ID}": "bench"}
    prefix = tools.prefix(tool, {**os.environ, **NCU_ENV})
    return [reduce(lambda a, kv: a.replace(*kv), names.items(), arg) for arg in prefix]


def rows(tool: str, summary: dict) -> list[str]:
    """The table rows of one tool's summary: per report, the figures the criteria read."""
    out = []
    for name, r in (summary.get("ranks") or summary.get("reports") or {}).items():
        top = (r.get("top_kernels") or [{}])[0]
        if tool == "nsys":
            share = r.get("comm_share")
            figure = f"communication {100 * share:.1f} % of the step" if share is not None else "no NVTX step ranges"
        else:
            sm = r.get("sm_throughput")
            figure = f"SM throughput {sm:.1f} % (time-weighted), {r['launches']} launches" if sm else "no SM figure"
        out.append(f"| {tool} | {name} | {figure} | {r['kernel_ns'] / 1e6:.2f} | {top.get('name', '-')[:60]} |")
    return out


def run(batch: int, width: int, warmup: int, workers: int, device_name: str, out: Path) -> tuple[list[str], bool]:
    """Markdown lines and whether every tool found ran and was read back."""
    from kernels.base.errors import ConfigError
    from kernels.base.files import atomic_write_bytes
    from kernels.profiling import ncu, nsight, reports, tools

    lines = ["| tool | report | read back | kernel ms | top kernel |", "|---|---|---|---:|---|"]
    notes, ok = [], True
    params = profiled_params(batch, width, warmup, workers)
    for tool, kind in (("nsys", nsight.NSYS), ("ncu", ncu.NCU)):
        missing = tools.missing(tool)
        if missing:
            notes.append(f"{tool}: {missing}.")
            continue
        try:
            with benchtable.trained(params, 900, f"nsight-{tool}", rank_prefix(tool), NCU_ENV) as run_dir:
                raw = reports.summarize(run_dir, kind).read_bytes()
        except RuntimeError as e:
            notes.append(f"{tool}: the profiled run: {e}")
            ok = False
            continue
        except (ConfigError, OSError) as e:  # no report written, or one that cannot be read at all
            notes.append(f"{tool}: reading the report back failed: {e}")
            ok = False
            continue
        keep = out / f"{benchtable.slug(device_name)}-{tool}-summary.json"
        atomic_write_bytes(keep, raw)
        summary = json.loads(raw)
        lines += rows(tool, summary)
        notes += [f"{tool}: {p}" for p in summary.get("problems") or []]
        notes.append(f"{tool}: summary kept in {keep.name}.")
    table = [*lines, ""] if len(lines) > 2 else []  # the header alone where no tool ran
    return [*table, *notes, ""], ok
