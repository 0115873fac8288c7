"""The project's targets as criteria: each judged met / not met / not measured from the records.

One table holds every target with its source, definition and threshold (CRITERIA). `judge`
reads the analysis tables (kernels/analysis/runs.py: scaling, optimisation gains, DCRNN) and
says, per criterion, what was measured and where. A point set aside by kernels/analysis/trust.py
(contended, superlinear, disagreeing or too few repeats) never judges a criterion: the
criterion is then "not measured" and names the re-run. "not measured" always says which
study or command would measure it.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from kernels.analysis.runs import main_series

MET, NOT_MET, NOT_MEASURED = "met", "not met", "not measured"


@dataclass(frozen=True)
class Criterion:
    key: str
    short: str  # the paper's column
    source: str
    definition: str
    threshold: str
    measure: str  # the study or command that measures it


CRITERIA = (
    Criterion("strong_e8", "Strong scaling, $E_s(8)$", "ResNet-18/CIFAR-10 scaling brief",
              "strong-scaling efficiency at 8 GPUs, E_s(8) = T_1 / (8 T_8), fixed global batch", ">= 70 %",
              "lab study submit studies/strong_resnet18_seed.yaml"),
    Criterion("weak_epoch", "Weak scaling, epoch time", "ResNet-18/CIFAR-10 scaling brief",
              "weak scaling, fixed batch per GPU: time per epoch of the same per-GPU work at N GPUs against 1 GPU, "
              "E_w = T_1 / T_N at the largest N", ">= 90 % (within 10 %)",
              "lab study submit studies/weak_resnet18_seed.yaml"),
    Criterion("optim_each", "Each optimisation", "ResNet-18/CIFAR-10 scaling brief",
              "throughput gain of each optimisation (AMP, bucket size, input pipeline, channels-last, compile) "
              "over its baseline at equal settings: the smallest of the measured pairs", ">= 20 %",
              "lab study submit studies/sensitivity_resnet18_seed.yaml"),
    Criterion("optim_all", "Optimisations together", "ResNet-18/CIFAR-10 scaling brief",
              "throughput gain of the optimisations together: best measured configuration over the one with every "
              "optimisation off, at equal ranks and batch", ">= 20 %",
              "lab study submit studies/sensitivity_resnet18_seed.yaml"),
    Criterion("accuracy", "Accuracy, $N$ vs 1 rank", "ResNet-18/CIFAR-10 scaling brief",
              "final accuracy at N ranks against 1 rank, largest gap over the main strong series",
              "within 2 points", "lab study submit studies/strong_resnet18_seed.yaml"),
    Criterion("dcrnn_strong", "DCRNN, 1 to 8 nodes", "DCRNN traffic-forecasting brief",
              "DCRNN strong-scaling efficiency from 1 to 8 nodes (per-GPU throughput at 8 nodes over 1 node)",
              "> 80 %", "lab study submit studies/dcrnn_strong.yaml"),
    Criterion("dcrnn_time", "DCRNN, time to accuracy", "DCRNN traffic-forecasting brief",
              "time to the baseline's final validation MAE at the largest rank count against the 1-rank baseline",
              ">= 50 % less", "lab study submit studies/dcrnn_strong.yaml"),
    Criterion("dcrnn_mae", "DCRNN, MAE vs 1 GPU", "DCRNN traffic-forecasting brief",
              "test MAE at the largest rank count against the 1-GPU baseline, worst horizon", "within 2 %",
              "lab study submit studies/dcrnn_strong.yaml"),
)


def _row(c: Criterion, status: str, value: str = "", evidence: str = "") -> dict:
    return {"key": c.key, "short": c.short, "source": c.source, "definition": c.definition, "threshold": c.threshold,
            "status": status, "value": value, "evidence": evidence or (c.measure if status == NOT_MEASURED else "")}


def _set_aside(c: Criterion, point: pd.Series) -> dict:
    return _row(c, NOT_MEASURED, evidence=f"the N={int(point['gpus'])} point is set aside ({point['flags']}); "
                                          f"re-run it (Table of results to re-run)")


def strong_e8(c: Criterion, scal: pd.DataFrame) -> dict:
    s = main_series(scal, "strong", "resnet18")
    at8 = s[s["gpus"] == 8] if not s.empty else s
    if at8.empty:
        return _row(c, NOT_MEASURED)
    p = at8.iloc[0]
    if not p["clean"]:
        return _set_aside(c, p)
    return _row(c, MET if p["efficiency"] >= 0.70 else NOT_MET, f"{100 * p['efficiency']:.0f} %",
                f"{p['series']}, baseline N={int(p['baseline_gpus'])}")


def weak_epoch(c: Criterion, scal: pd.DataFrame) -> dict:
    s = main_series(scal, "weak", "resnet18")
    if s.empty:
        return _row(c, NOT_MEASURED)
    p = s.iloc[-1]
    if not p["clean"]:
        return _set_aside(c, p)
    return _row(c, MET if p["efficiency"] >= 0.90 else NOT_MET, f"{100 * p['efficiency']:.0f} % at N={int(p['gpus'])}",
                f"{p['series']}, baseline N={int(p['baseline_gpus'])}")


def optim_each(c: Criterion, gains: pd.DataFrame) -> dict:
    if gains.empty:
        return _row(c, NOT_MEASURED)
    best = gains.groupby("factor")["speedup"].max()
    worst = best.idxmin()
    listed = ", ".join(f"{k} {100 * (v - 1):+.0f} %" for k, v in best.items())
    return _row(c, MET if best.min() >= 1.20 else NOT_MET, f"{100 * (best.min() - 1):+.0f} % ({worst})", listed)


def optim_all(c: Criterion, together: pd.DataFrame) -> dict:
    if together.empty:
        return _row(c, NOT_MEASURED)
    t = together.loc[together["speedup"].idxmax()]
    return _row(c, MET if t["speedup"] >= 1.20 else NOT_MET, f"{100 * (t['speedup'] - 1):+.0f} %",
                f"{t['after']} over all off, N={int(t['gpus'])}, B={int(t['batch'])}")


def accuracy(c: Criterion, scal: pd.DataFrame) -> dict:
    s = main_series(scal, "strong")
    s = s[s["acc_gap_points"].notna()] if not s.empty else s
    if len(s) < 2:
        return _row(c, NOT_MEASURED)
    if not s["clean"].all():
        return _set_aside(c, s[~s["clean"]].iloc[0])
    worst = s.loc[s["acc_gap_points"].abs().idxmax()]
    return _row(c, MET if abs(worst["acc_gap_points"]) <= 2.0 else NOT_MET,
                f"{worst['acc_gap_points']:+.2f} points at N={int(worst['gpus'])}", str(worst["series"]))


def dcrnn_strong(c: Criterion, dc: pd.DataFrame) -> dict:
    for _, s in (dc.groupby("series") if not dc.empty else []):
        one, eight = s[s["nodes"] == 1], s[s["nodes"] == 8]
        if len(one) and len(eight):
            a, b = one.loc[one["gpus"].idxmax()], eight.iloc[0]
            eff = (b["samples_per_s"] / b["gpus"]) / (a["samples_per_s"] / a["gpus"])
            return _row(c, MET if eff > 0.80 else NOT_MET, f"{100 * eff:.0f} %",
                        f"{s['series'].iloc[0]}: {int(a['gpus'])} GPU(s) on 1 node to {int(b['gpus'])} on 8")
    return _row(c, NOT_MEASURED)


def dcrnn_time(c: Criterion, runs: pd.DataFrame) -> dict:
    r = runs[runs["workload"] == "dcrnn"] if not runs.empty and "workload" in runs else runs.iloc[0:0]
    if r.empty or r["gpus"].nunique() < 2:
        return _row(c, NOT_MEASURED)
    base, top = r[r["gpus"] == r["gpus"].min()].iloc[0], r[r["gpus"] == r["gpus"].max()].iloc[0]
    target = _last(base["metrics"], "eval_mae")
    t0, t1 = time_to(base["metrics"], "eval_mae", target), time_to(top["metrics"], "eval_mae", target)
    if t0 is None:
        return _row(c, NOT_MEASURED, evidence="the records have no per-epoch validation MAE")
    if t1 is None:
        return _row(c, NOT_MET, "target not reached", f"N={int(top['gpus'])} never reached MAE {target:.3f}")
    cut = 1 - t1 / t0
    return _row(c, MET if cut >= 0.5 else NOT_MET, f"{100 * cut:.0f} % less",
                f"{t1:.1f} s at N={int(top['gpus'])} against {t0:.1f} s at N={int(base['gpus'])}")


def _value(row: dict, prefix: str) -> float | None:
    """The mean of a metrics row's columns named prefix or prefix_<label> (e.g. eval_mae_15min, ...)."""
    vals = [float(v) for k, v in row.items() if (k == prefix or k.startswith(prefix + "_")) and v not in (None, "")]
    return sum(vals) / len(vals) if vals else None


def _last(metrics, prefix: str) -> float | None:
    vals = [v for v in (_value(m, prefix) for m in metrics or []) if v is not None]
    return vals[-1] if vals else None


def time_to(metrics, prefix: str, target) -> float | None:
    """Training seconds (epoch times summed) until the metric first reaches target (lower is better)."""
    if target is None:
        return None
    t = 0.0
    for m in metrics or []:
        t += float(m.get("epoch_s") or 0)
        v = _value(m, prefix)
        if v is not None and v <= target * (1 + 1e-9):
            return t
    return None


def dcrnn_mae(c: Criterion, dc: pd.DataFrame) -> dict:
    s = dc[dc["mae_gap_pct"].notna() & (dc["gpus"] > dc["baseline_gpus"])] if not dc.empty else dc
    if s.empty:
        return _row(c, NOT_MEASURED)
    p = s.loc[s["gpus"].idxmax()]
    return _row(c, MET if abs(p["mae_gap_pct"]) <= 2.0 else NOT_MET, f"{p['mae_gap_pct']:+.1f} % at N={int(p['gpus'])}",
                str(p["series"]))


def judge(runs: pd.DataFrame, scal: pd.DataFrame, gains: pd.DataFrame, together: pd.DataFrame,
          dc: pd.DataFrame) -> pd.DataFrame:
    """One row per criterion: key, source, definition, threshold, status, value, evidence (or how to measure)."""
    by = {c.key: c for c in CRITERIA}
    rows = [strong_e8(by["strong_e8"], scal), weak_epoch(by["weak_epoch"], scal), optim_each(by["optim_each"], gains),
            optim_all(by["optim_all"], together), accuracy(by["accuracy"], scal),
            dcrnn_strong(by["dcrnn_strong"], dc), dcrnn_time(by["dcrnn_time"], runs), dcrnn_mae(by["dcrnn_mae"], dc)]
    return pd.DataFrame(rows)
