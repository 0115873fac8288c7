"""After a profiled run: the ranks' breakdowns into the run directory and summary.json's `profile`.

<run>/traces/rank<R>-<job>.pt.trace.json.gz   one per rank (written by the ranks)
<run>/breakdown.csv                           per rank and 'all': ms per step and share by category
<run>/top_ops.csv                             operators (host) or kernels (device) by self time per step
<run>/breakdown.png                           the stacked bars
<run>/hta/*.csv                               Holistic Trace Analysis, GPU traces only
"""

from __future__ import annotations

import csv
from pathlib import Path

from kernels.base import files
from kernels.profiling import breakdown, hta


def write(
    run_dir: Path, per_rank: list[dict], traces: dict[int, Path], hta_mode: str, probe: dict | None, title: str = ""
) -> dict:
    run_dir = Path(run_dir)
    per_rank = sorted(per_rank, key=lambda r: (r["rank"] is None, r["rank"]))
    comb = breakdown.combine(per_rank)
    rows = breakdown.rows(per_rank, comb)
    with files.create(run_dir / "breakdown.csv", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with files.create(run_dir / "top_ops.csv", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["rank", "name", "category", "self_ms_per_step", "calls"])
        w.writeheader()
        for r in [*per_rank, {**comb, "rank": "all"}]:
            for o in r["top_ops"]:
                w.writerow(
                    {
                        "rank": r["rank"],
                        "name": o["name"],
                        "category": o["category"],
                        "self_ms_per_step": round(o["self_ms_per_step"], 4),
                        "calls": o["calls"],
                    }
                )
    breakdown.plot(per_rank, comb, run_dir / "breakdown.png", title)
    out = {
        "timeline": comb["timeline"],
        "steps": comb["steps"],
        "ranks": comb["ranks"],
        "profiled_ms_per_step": round(comb["profiled_ms_per_step"], 4),
        "share": {k: round(v, 5) for k, v in comb["share"].items()},
        "ms_per_step": {k: round(v, 4) for k, v in comb["ms_per_step"].items()},
        "share_range": {k: [round(a, 5), round(b, 5)] for k, (a, b) in comb["share_range"].items()},
        "top_ops": [{**o, "self_ms_per_step": round(o["self_ms_per_step"], 4)} for o in comb["top_ops"][:10]],
        "gpu_kernels": comb["gpu_kernels"],
        "hidden_comm_ms_per_step": None
        if comb["hidden_comm_ms_per_step"] is None
        else round(comb["hidden_comm_ms_per_step"], 4),
        "traces": sorted(str(p.relative_to(run_dir)) if p.is_relative_to(run_dir) else str(p) for p in traces.values()),
        "files": ["breakdown.csv", "top_ops.csv", "breakdown.png"],
    }
    out["comm_crosscheck"] = crosscheck(out, probe)
    out["hta"] = hta.analyse(traces, run_dir / "hta", comb["gpu_kernels"], hta_mode)
    return out


def crosscheck(profile: dict, probe: dict | None) -> str:
    """One sentence putting the trace's communication time beside the probe's exposed communication."""
    trace_ms = profile["ms_per_step"]["communication"]
    if not probe or probe.get("exposed_comm_status") is None:
        return f"trace: {trace_ms:.2f} ms of communication per step on the {profile['timeline']} timeline; no probe"
    if probe["exposed_comm_status"] == "measured":
        return (
            f"trace: {trace_ms:.2f} ms of communication per step on the {profile['timeline']} timeline; "
            f"probe: {probe['exposed_comm_ms']:.2f} ms exposed (90 % CI {probe['exposed_comm_ci_ms'][0]:.2f} to "
            f"{probe['exposed_comm_ci_ms'][1]:.2f})"
        )
    return (
        f"trace: {trace_ms:.2f} ms of communication per step on the {profile['timeline']} timeline; "
        f"probe: not distinguishable from zero (below {max(0.0, probe['exposed_comm_ci_ms'][1]):.2f} ms)"
    )
