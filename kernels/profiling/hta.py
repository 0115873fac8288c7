"""Holistic Trace Analysis (PyPI HolisticTraceAnalysis, optional) over a run's GPU traces.

Its breakdowns need GPU kernels in the traces (on CPU-only traces get_temporal_breakdown and
get_idle_time_breakdown raise and get_comm_comp_overlap returns NaN), so it runs only when
the traces have kernels, and says why when it does not. Its tables go to <run>/hta/*.csv and
a short summary into summary.json's profile.hta.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from kernels.base import files

INSTALL = "pip install HolisticTraceAnalysis==0.5.0"


def installed() -> bool:
    return importlib.util.find_spec("hta") is not None


def analyse(trace_files: dict[int, Path], out_dir: Path, gpu_kernels: bool, mode: str = "auto") -> dict:
    """{status, ...}: 'done' with the temporal breakdown, idle time and overlap per rank, else 'skipped: why'."""
    if mode == "off":
        return {"status": "skipped: profile_hta=off"}
    if not gpu_kernels:
        return {"status": "skipped: the traces have no GPU kernels (HTA's breakdowns need a GPU trace)"}
    if not installed():
        return {"status": f"skipped: HolisticTraceAnalysis is not installed ({INSTALL})"}
    if not trace_files:
        return {"status": "skipped: no traces"}
    from hta.trace_analysis import TraceAnalysis

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        ta = TraceAnalysis(trace_files={r: str(p) for r, p in trace_files.items()}, trace_dir=str(out_dir))
        temporal = ta.get_temporal_breakdown(visualize=False)
        overlap = ta.get_comm_comp_overlap(visualize=False)
        idle, _ = ta.get_idle_time_breakdown(ranks=sorted(trace_files), visualize=False)
    except Exception as e:  # HTA's own failure must not fail a run that trained; it is reported instead
        return {"status": f"failed: {type(e).__name__}: {e}"}
    files.atomic_write_text(out_dir / "temporal_breakdown.csv", temporal.to_csv(index=False))
    files.atomic_write_text(out_dir / "comm_comp_overlap.csv", overlap.to_csv(index=False))
    files.atomic_write_text(out_dir / "idle_time_breakdown.csv", idle.to_csv(index=False))
    pick = lambda df, col: {int(r["rank"]): round(float(r[col]), 3) for _, r in df.iterrows() if col in df}  # noqa: E731
    return {
        "status": "done",
        "idle_pctg": pick(temporal, "idle_time_pctg"),
        "compute_pctg": pick(temporal, "compute_time_pctg"),
        "non_compute_pctg": pick(temporal, "non_compute_time_pctg"),
        "comm_comp_overlap_pctg": pick(overlap, "comp_comm_overlap_pctg"),
        "files": sorted(p.name for p in out_dir.glob("*.csv")),
    }
