"""DCRNN's table of runs: one row per (series, ranks), medians over repeats, with scaling and the accuracy gap.

A series is one data set, model size, global batch, graph-parallel setting and training subset. The criteria
(reporting.py) and the paper's section (section.py) read it.
"""

from __future__ import annotations

import pandas as pd

from kernels.workloads.dcrnn import LABELS

NAME = "dcrnn"
SERIES = ("dataset", "synthetic_shape", "rnn_units", "batch", "gp", "train_samples")


def parallel_name(gp) -> str:
    gp = 1 if gp is None or pd.isna(gp) else int(gp)
    return "data parallel" if gp == 1 else "graph parallel" if gp == 0 else f"grid, gp={gp}"


def table(runs: pd.DataFrame) -> pd.DataFrame:
    """DCRNN runs: one row per (series, ranks), medians over repeats, with scaling and the accuracy gap.

    A series is one data set, model size, global batch, graph-parallel setting (gp: 1 data parallel,
    0 all ranks split the graph, k a dp x k grid) and training subset. Per row: throughput, epoch time,
    strong-scaling speed-up and efficiency against the series' smallest rank count, masked MAE/RMSE/MAPE
    per horizon, the historical average on the same test windows, the largest per-rank peak memory,
    the largest per-rank halo traffic, the partition's edge cut, and mae_gap_pct: the largest relative
    MAE change over the horizons against the series' baseline, in percent.
    """
    metrics = [f"{m}_{h}" for m in ("mae", "rmse", "mape") for h in LABELS]
    cols = [
        "series",
        "parallel",
        *SERIES,
        "gpus",
        "nodes",
        "dp",
        "repeats",
        "samples_per_s",
        "epoch_s",
        "speedup",
        "efficiency",
        *metrics,
        *(f"ha_{m}" for m in metrics),
        "mae_gap_pct",
        "peak_mem_gib",
        "halo_mb_per_step",
        "edge_cut",
        "partition",
        "baseline_gpus",
        "device",
    ]
    if runs.empty or "workload" not in runs:
        return pd.DataFrame(columns=cols)
    r = runs[runs["workload"] == NAME]
    r = r[r["kind"] == "train"] if "kind" in r else r  # a profiled run is no repeat of a training point
    if r.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for key, series in r.groupby(list(SERIES), dropna=False, sort=True):
        pts = []
        for gpus, g in series.groupby("gpus"):

            def med(vals):
                vals = pd.Series(vals, dtype=float)
                return float(vals.median()) if vals.notna().any() else None

            info = g["workload_info"].iloc[0]
            ranks = [x for lst in g["rank_info"] for x in lst]
            halo = [x.get("halo_bytes_per_step") for x in ranks if x.get("halo_bytes_per_step") is not None]
            row = {
                **dict(zip(SERIES, key)),
                "gpus": int(gpus),
                "nodes": int(g["nodes"].max()),
                "dp": info.get("dp"),
                "repeats": len(g),
                "samples_per_s": med(g["samples_per_s"]),
                "epoch_s": med(g["epoch_s"]),
                "edge_cut": info.get("edge_cut"),
                "partition": info.get("partition"),
                "peak_mem_gib": max((x.get("peak_mem_gib") or 0 for x in ranks), default=None),
                "halo_mb_per_step": max(halo) / 1e6 if halo else None,
                "device": g["device"].iloc[0],
            }
            for m in metrics:
                row[m] = med([fe.get(m) for fe in g["final_eval"]])
                row[f"ha_{m}"] = med([(wi.get("historical_average") or {}).get(m) for wi in g["workload_info"]])
            pts.append(row)
        pts.sort(key=lambda p: p["gpus"])
        base = pts[0]
        for p in pts:
            p["parallel"] = parallel_name(p["gp"])
            p["series"] = (
                f"{p['dataset']}"
                + (f" ({p['synthetic_shape']})" if p["dataset"] == "synthetic" else "")
                + f", {p['parallel']}, B={p['batch']}"
            )
            p["baseline_gpus"] = base["gpus"]
            if p["samples_per_s"] and base["samples_per_s"]:
                p["speedup"] = p["samples_per_s"] / base["samples_per_s"]
                p["efficiency"] = p["speedup"] * base["gpus"] / p["gpus"]
            gaps = [
                100 * (p[f"mae_{h}"] / base[f"mae_{h}"] - 1)
                for h in LABELS
                if p.get(f"mae_{h}") is not None and base.get(f"mae_{h}")
            ]
            p["mae_gap_pct"] = max(gaps, key=abs) if gaps else None
            rows.append(p)
    return pd.DataFrame(rows, columns=cols)
