"""A run's id, fixed by the launcher before the ranks start (no torch here: see kernels/base/ports.py)."""

from __future__ import annotations

import os
import secrets
from datetime import datetime, timezone

from kernels.workloads import get_workload


def make_run_id(cfg, environ=None) -> str:
    """A readable, unique id. Under Slurm it is derived from the job id, so a
    requeued job finds its checkpoint and resumes."""
    env = os.environ if environ is None else environ
    if cfg.run_id:
        return cfg.run_id
    workload = get_workload(cfg.workload).name  # a plug-in's own name, not its module:OBJECT spec
    parts = [workload, cfg.dataset, f"g{cfg.gpus}"] + ([cfg.label] if cfg.label else [])
    if "SLURM_JOB_ID" in env:
        job = env.get("SLURM_ARRAY_JOB_ID", env["SLURM_JOB_ID"])
        task = f"_{env['SLURM_ARRAY_TASK_ID']}" if "SLURM_ARRAY_TASK_ID" in env else ""
        return "-".join(parts + [f"j{job}{task}"])
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return "-".join([stamp] + parts + [secrets.token_hex(2)])
