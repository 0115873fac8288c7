"""Nsight Compute reports read back into the run record: <run>/ncu/summary.json.

    python -m kernels.profiling ncu-summary RUN_DIR [...]       # every report of these runs
    python -m kernels.profiling ncu-summary --pending RUNS_DIR  # the runs with reports and no summary yet

slurm/profile_ncu.sbatch leaves one rank's report (<run>/ncu/rank<R>-j<job>.ncu-rep) and calls the second form
when the notebook is done. For each report, `ncu --import REP --csv --page details --print-units base` prints
one row per metric of each profiled kernel launch (ID, Kernel Name, Section Name, Metric Name, Metric Unit,
Metric Value; since 2023 also the rules' columns). From the Speed of Light and Occupancy sections, per launch:
duration, compute (SM) throughput and memory throughput (percent of the device's peak), DRAM throughput and
achieved occupancy. Per report:
- launches: the launches profiled; kernel_ns their summed duration, NCCL's kernels apart (nccl_ns: they are
  communication, judged by the communication target, and left out of the figures below);
- sm_throughput: the launches' SM throughput weighted by their duration, as a fraction. It is the share of peak
  that the busiest SM pipe reached while the kernels ran (the tensor pipe in convolutions and matrix products);
  the plan's "kernel efficiency > 50 % of peak FLOPs (Nsight Compute)" reads it. It bounds the share of peak
  FLOPs from above, since the busiest pipe may be one that does no arithmetic;
- memory_throughput, dram_throughput, achieved_occupancy: weighted the same way;
- compute_bound_share: the share of kernel time in launches whose SM throughput exceeds their memory throughput;
- top_kernels: the five kernel names with the most time, each with its launches, share and weighted figures.
The summary holds every report and the median over reports of sm_throughput. Written atomically; a report
`ncu` cannot read is named in the summary's `problems`, not skipped in silence.
"""

from __future__ import annotations

import csv
import io
import statistics
import subprocess
from collections import defaultdict
from pathlib import Path

from kernels.profiling import reports

SUMMARY = reports.SUMMARY
HEADER_START = '"ID","Process ID"'
# (section, metric) as the details page names them -> the launch's field
METRICS = {
    ("GPU Speed Of Light Throughput", "Duration"): "duration_ns",
    ("GPU Speed Of Light Throughput", "Compute (SM) Throughput"): "sm_pct",
    ("GPU Speed Of Light Throughput", "Memory Throughput"): "mem_pct",
    ("GPU Speed Of Light Throughput", "DRAM Throughput"): "dram_pct",
    ("Occupancy", "Achieved Occupancy"): "occupancy_pct",
}
TIME_UNITS = {"ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9, "second": 1e9}
WEIGHTED = {  # a launch's percent field -> the summary's time-weighted fraction
    "sm_pct": "sm_throughput",
    "mem_pct": "memory_throughput",
    "dram_pct": "dram_throughput",
    "occupancy_pct": "achieved_occupancy",
}


def number(text: str) -> float | None:
    """A metric value as the details page prints it ('1,215,000,000.00', '21.68'); None for 'n/a' or ''."""
    try:
        return float(text.replace(",", ""))
    except (ValueError, AttributeError):
        return None


def launches(text: str) -> list[dict]:
    """The profiled launches in one report's details page: {id, name, duration_ns, sm_pct, ...} per launch, in
    the report's order. Lines before the header (the application's output, ==PROF== lines) are skipped."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith(HEADER_START)), None)
    if start is None:
        raise ValueError(f"no details table in the ncu output (it starts: {text[:200]!r})")
    found: dict[str, dict] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        field = METRICS.get((row.get("Section Name"), row.get("Metric Name")))
        if row.get("ID") is None or field is None:
            continue  # a rule's row, or a metric the summary does not use
        launch = found.setdefault(row["ID"], {"id": row["ID"], "name": row["Kernel Name"]})
        value = number(row.get("Metric Value"))
        if field == "duration_ns" and value is not None:
            unit = (row.get("Metric Unit") or "").strip()
            if unit not in TIME_UNITS:
                raise ValueError(f"launch {row['ID']}: Duration in {unit!r}, not a time unit ncu prints")
            value *= TIME_UNITS[unit]
        launch[field] = value
    if not found:
        raise ValueError("the details page holds no launch with a Speed of Light section (ncu --set basic or more)")
    return list(found.values())


def weighted(group: list[dict], field: str) -> float | None:
    """The duration-weighted mean of a percent field over launches that have both, as a fraction."""
    pairs = [(x["duration_ns"], x[field]) for x in group if x.get("duration_ns") and x.get(field) is not None]
    total = sum(d for d, _ in pairs)
    return sum(d * v for d, v in pairs) / total / 100 if total else None


def time_ns(group: list[dict]) -> float:
    """The launches' summed duration (a launch without one counts nothing)."""
    return sum(x.get("duration_ns") or 0 for x in group)


def kernel_rows(groups: list[tuple[str, list[dict]]], total_ns: float) -> list[dict]:
    """Per kernel name: its launches, time, share of total_ns and weighted figures."""
    rows = []
    for name, group in groups:
        ns = time_ns(group)
        weights = {key: weighted(group, field) for field, key in WEIGHTED.items()}
        rows.append(
            {"name": name, "launches": len(group), "ns": ns, "share": ns / total_ns if total_ns else None, **weights}
        )
    return rows


def report_summary(details_csv: str) -> dict:
    """One report's figures from the text of its details page. NCCL's kernels (communication, judged by the
    communication target) are counted in nccl_ns and left out of the efficiency figures."""
    got = launches(details_csv)
    compute = [x for x in got if not reports.is_nccl(x["name"])]
    kernel_ns = time_ns(compute)
    bound = sum(
        x["duration_ns"] for x in compute if x.get("duration_ns") and (x.get("sm_pct") or 0) > (x.get("mem_pct") or 0)
    )
    by_name = defaultdict(list)
    for x in compute:
        by_name[x["name"]].append(x)
    top = sorted(by_name.items(), key=lambda kv: -time_ns(kv[1]))[:5]
    return {
        "launches": len(got),
        "kernel_ns": kernel_ns,
        "nccl_ns": time_ns([x for x in got if reports.is_nccl(x["name"])]),
        **{name: weighted(compute, field) for field, name in WEIGHTED.items()},
        "compute_bound_share": bound / kernel_ns if kernel_ns else None,
        "top_kernels": kernel_rows(top, kernel_ns),
    }


def read_report(report: Path, ncu: str) -> dict:
    """`ncu --import` of one report: its summary."""
    p = subprocess.run(
        [ncu, "--import", str(report), "--csv", "--page", "details", "--print-units", "base"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if p.returncode != 0:
        raise ValueError(f"ncu --import failed on {report.name}: {(p.stderr or p.stdout)[-300:]}")
    return report_summary(p.stdout)


def combine(per_report: dict[str, dict], problems: list[str]) -> dict:
    shares = [r["sm_throughput"] for r in per_report.values() if r.get("sm_throughput") is not None]
    return {
        "source": "ncu --import --csv --page details (Speed of Light, Occupancy)",
        "reports": per_report,
        "sm_throughput_median": statistics.median(shares) if shares else None,
        "launches": sum(r["launches"] for r in per_report.values()),
        "problems": problems,
    }


NCU = reports.Reports("ncu", ".ncu-rep", "ncu", "Nsight Compute", "slurm/profile_ncu.sbatch", read_report, combine)
