"""Nsight Systems reports read back into the run record: <run>/nsys/summary.json.

    python -m kernels.profiling nsys-summary RUN_DIR [...]       # every rank's report of these runs
    python -m kernels.profiling nsys-summary --pending RUNS_DIR  # the runs with reports and no summary yet

slurm/profile_nsys.sbatch leaves one report per rank (<run>/nsys/rank<R>-j<job>.nsys-rep) and calls the second
form when the notebook is done. For each report, `nsys stats` prints two of its standard reports as CSV:
cuda_gpu_kern_sum (GPU time per kernel) and nvtx_sum (host time per NVTX range; the loop names its phases
lab:data, lab:forward, lab:backward, lab:optimizer and lab:communication). From them, per rank:
- kernel_ns and nccl_ns: GPU time in all kernels and in NCCL's (names starting with nccl);
- phases_ns: host time in each lab:<phase> range, their sum the time of the captured steps;
- comm_share: NCCL's GPU time over that step time. Overlapped communication counts too, so this bounds
  the exposed share from above; it is what the plan's "communication < 20 % (Nsight)" reads;
- top_kernels: the five kernels with the most GPU time, with their share.
The summary holds every rank and the median over ranks of comm_share. Written atomically; a report `nsys`
cannot read is named in the summary's `problems`, not skipped in silence.
"""

from __future__ import annotations

import csv
import io
import statistics
import subprocess
from pathlib import Path

from kernels.profiling import reports

PHASES = ("data", "forward", "backward", "optimizer", "communication")
REPORTS = ("cuda_gpu_kern_sum", "nvtx_sum")
SUMMARY = reports.SUMMARY


def stats_rows(text: str, last_column: str) -> list[dict]:
    """The rows of one `nsys stats --format csv` report: the lines before its header ('Generating SQLite
    file ...', 'Processing [...] with [...]...') are skipped; names may be quoted and hold commas."""
    lines = text.splitlines()
    start = next(
        (i for i, ln in enumerate(lines) if ln.startswith("Time (%),") and ln.rstrip().endswith(last_column)), None
    )
    if start is None:
        raise ValueError(f"no '{last_column}' table in the nsys stats output (it starts: {text[:200]!r})")
    rows = []
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if not row.get(last_column):
            break  # the next report's preamble, or the end
        rows.append(row)
    return rows


def rank_summary(kernels_csv: str, nvtx_csv: str) -> dict:
    """One rank's figures from the text of its two reports."""
    kernels = [
        (r["Name"], int(float(r["Total Time (ns)"])), int(r["Instances"])) for r in stats_rows(kernels_csv, "Name")
    ]
    total = sum(ns for _, ns, _ in kernels)
    nccl = sum(ns for name, ns, _ in kernels if reports.is_nccl(name))
    phases = {p: 0 for p in PHASES}
    for r in stats_rows(nvtx_csv, "Range"):
        name = r["Range"].lstrip(":")  # nsys prefixes a range of the default domain with ':' in some versions
        if name.startswith("lab:") and name[4:] in phases:
            phases[name[4:]] += int(float(r["Total Time (ns)"]))
    step_ns = sum(phases.values())
    top = sorted(kernels, key=lambda k: -k[1])[:5]
    return {
        "kernel_ns": total,
        "nccl_ns": nccl,
        "phases_ns": phases,
        "step_ns": step_ns,
        "comm_share": nccl / step_ns if step_ns else None,
        "top_kernels": [
            {"name": n, "ns": ns, "launches": k, "share": ns / total if total else None} for n, ns, k in top
        ],
    }


def run_stats(report: Path, nsys: str) -> dict:
    """`nsys stats` of one report: its rank summary."""
    out = {}
    for name in REPORTS:
        p = subprocess.run(
            [nsys, "stats", "--report", name, "--format", "csv", "--force-export=true", str(report)],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if p.returncode != 0:
            raise ValueError(f"nsys stats --report {name} failed on {report.name}: {(p.stderr or p.stdout)[-300:]}")
        out[name] = p.stdout
    return rank_summary(out["cuda_gpu_kern_sum"], out["nvtx_sum"])


def combine(per_rank: dict[str, dict], problems: list[str]) -> dict:
    shares = [r["comm_share"] for r in per_rank.values() if r["comm_share"] is not None]
    return {
        "source": "nsys stats (cuda_gpu_kern_sum, nvtx_sum)",
        "ranks": per_rank,
        "comm_share_median": statistics.median(shares) if shares else None,
        "comm_share_range": [min(shares), max(shares)] if shares else None,
        "problems": problems,
    }


NSYS = reports.Reports("nsys", ".nsys-rep", "nsys", "Nsight Systems", "slurm/profile_nsys.sbatch", run_stats, combine)
