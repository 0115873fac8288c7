"""ResNet-18's share of the documents: the targets of the ResNet-18/CIFAR-10 plan (brief 001), judged from records.

Scaling, optimisation and accuracy targets read the analysis tables (kernels/analysis/runs.py); the plan's four
profiling targets read what every record holds: the GPU monitor's utilisation, the communication share of the
step (the probe, or the trace of a profiled run), the ranks' data wait and the model-FLOP utilisation against the
device's peak. Its figures and tables are the generic sections' (kernels/report).
"""

from __future__ import annotations

import pandas as pd

from kernels.analysis.criteria import MET, NOT_MEASURED, NOT_MET, Brief, Criterion, row, set_aside
from kernels.analysis.runs import main_series

NAME = "resnet18"
PLAN = Brief("001_e7ce76790d10dce0.txt", "ResNet-18 plan")
STRONG, WEAK = "lab study submit studies/strong_resnet18_seed.yaml", "lab study submit studies/weak_resnet18_seed.yaml"
SENSITIVITY = "lab study submit studies/sensitivity_resnet18_seed.yaml"
ON_GPUS = "lab study submit studies/strong_resnet18.yaml"  # on the target's GPUs


def strong_e8(c: Criterion, t: dict) -> dict:
    s = main_series(t["scaling"], "strong", NAME)
    at8 = s[s["gpus"] == 8] if not s.empty else s
    if at8.empty:
        return row(c, NOT_MEASURED)
    p = at8.iloc[0]
    if not p["clean"]:
        return set_aside(c, p)
    return row(
        c,
        MET if p["efficiency"] >= 0.70 else NOT_MET,
        f"{100 * p['efficiency']:.0f} %",
        f"{p['series']}, baseline N={int(p['baseline_gpus'])}",
    )


def weak_epoch(c: Criterion, t: dict) -> dict:
    """Every N of the main weak series: the epoch time of the same per-GPU work grows by T_N / T_1 - 1 = 1 / E_w - 1."""
    s = main_series(t["scaling"], "weak", NAME)
    s = s[s["gpus"] > s["baseline_gpus"]] if not s.empty else s
    if s.empty:
        return row(c, NOT_MEASURED)
    if not s["clean"].all():
        return set_aside(c, s[~s["clean"]].iloc[0])
    growth = 1 / s["efficiency"].astype(float) - 1
    worst = growth.idxmax()
    each = ", ".join(f"N={int(n)} {100 * g:+.0f} %" for n, g in zip(s["gpus"], growth))
    return row(
        c,
        MET if growth.max() <= 0.10 else NOT_MET,
        f"{100 * growth[worst]:+.0f} % at N={int(s.loc[worst, 'gpus'])}",
        f"{s['series'].iloc[0]}, baseline N={int(s['baseline_gpus'].iloc[0])}: {each}",
    )


def optim_one(c: Criterion, t: dict) -> dict:
    gains = t["gains"]
    if gains.empty:
        return row(c, NOT_MEASURED)
    best = gains.groupby("factor")["speedup"].max().sort_values(ascending=False)
    listed = ", ".join(f"{k} {100 * (v - 1):+.0f} %" for k, v in best.items())
    return row(
        c,
        MET if best.iloc[0] >= 1.20 else NOT_MET,
        f"{100 * (best.iloc[0] - 1):+.0f} % ({best.index[0]})",
        "each: " + listed,
    )


def optim_all(c: Criterion, t: dict) -> dict:
    together = t["together"]
    if together.empty:
        return row(c, NOT_MEASURED)
    best = together.loc[together["speedup"].idxmax()]
    return row(
        c,
        MET if best["speedup"] >= 1.20 else NOT_MET,
        f"{100 * (best['speedup'] - 1):+.0f} %",
        f"{best['after']} over all off, N={int(best['gpus'])}, B={int(best['batch'])}",
    )


def accuracy(c: Criterion, t: dict) -> dict:
    s = main_series(t["scaling"], "strong", NAME)
    s = s[s["acc_gap_points"].notna() & (s["gpus"] > s["baseline_gpus"])] if not s.empty else s
    if s.empty:
        return row(c, NOT_MEASURED)
    if not s["clean"].all():
        return set_aside(c, s[~s["clean"]].iloc[0])
    worst = s.loc[s["acc_gap_points"].abs().idxmax()]
    return row(
        c,
        MET if abs(worst["acc_gap_points"]) <= 2.0 else NOT_MET,
        f"{worst['acc_gap_points']:+.2f} points at N={int(worst['gpus'])}",
        str(worst["series"]),
    )


def profiled(column: str, percent: float, good, gpu_only: bool):
    """A judge of one profiling target: the median of `column` over this workload's quiet records at their largest
    rank count (records on a GPU only when gpu_only); `percent` turns the column into percent."""

    def judge(c: Criterion, t: dict) -> dict:
        r = t["runs"]
        if r.empty or column not in r:
            return row(c, NOT_MEASURED)
        r = r[(r["workload"] == NAME) & r[column].notna()]
        if gpu_only:
            r = r[r["device_type"] == "cuda"]
        if r.empty:
            return row(c, NOT_MEASURED)
        top = r[r["gpus"] == r["gpus"].max()]
        value = percent * float(pd.to_numeric(top[column]).median())
        devices = ", ".join(sorted(set(top["device"].astype(str))))
        return row(
            c,
            MET if good(value) else NOT_MET,
            f"{value:.1f} % at N={int(top['gpus'].iloc[0])}",
            f"median of {len(top)} record(s) on {devices}",
        )

    return judge


def nsight_first(column: str, fallback: str, good, gpu_only: bool, source: str):
    """A judge of a target the plan measures with Nsight: the Nsight figure read back into the records (`column`)
    where any of this workload's records has one, else the lab's own (`fallback`); the evidence names the source."""

    def judge(c: Criterion, t: dict) -> dict:
        r = t["runs"]
        has = not r.empty and column in r and r.loc[r["workload"] == NAME, column].notna().any()
        judged = profiled(column if has else fallback, 100.0, good, gpu_only)(c, t)
        return {**judged, "evidence": judged["evidence"] + f" ({source})"} if has else judged

    return judge


CRITERIA = (
    Criterion(
        "strong_e8",
        "Strong scaling, $E_s(8)$",
        PLAN,
        338,
        "strong-scaling efficiency at 8 GPUs, E_s(8) = T_1 / (8 T_8), fixed global batch",
        ">= 70 %",
        STRONG,
        strong_e8,
    ),
    Criterion(
        "weak_epoch",
        "Weak scaling, epoch time",
        PLAN,
        339,
        "weak scaling, fixed batch per GPU: growth of the time per epoch of the same per-GPU work at every N "
        "against 1 GPU, T_N / T_1 - 1",
        "<= 10 % at every N",
        WEAK,
        weak_epoch,
    ),
    Criterion(
        "optim_one",
        "One optimisation",
        PLAN,
        174,
        "throughput gain of the best single optimisation (AMP, bucket size, input pipeline, channels-last, "
        "compile) over its baseline at equal settings; each one's gain listed",
        ">= 20 %",
        SENSITIVITY,
        optim_one,
    ),
    Criterion(
        "optim_all",
        "Before/after",
        PLAN,
        341,
        "throughput gain of the optimisations together: best measured configuration over the one with every "
        "optimisation off, at equal ranks and batch",
        ">= 20 %",
        SENSITIVITY,
        optim_all,
    ),
    Criterion(
        "accuracy",
        "Accuracy, $N$ vs 1 GPU",
        PLAN,
        103,
        "final accuracy at N ranks against 1 rank, largest gap over the main strong series (the plan asks "
        "for similar convergence; the lab reads that as within 2 points)",
        "within 2 points",
        STRONG,
        accuracy,
        lab_threshold=True,
    ),
    Criterion(
        "gpu_util",
        "GPU utilisation",
        PLAN,
        344,
        "mean GPU utilisation of the GPU monitor (nvidia-smi's counter) over the run",
        "> 80 %",
        ON_GPUS,
        profiled("gpu_util_mean_pct", 1.0, lambda v: v > 80, gpu_only=True),
    ),
    Criterion(
        "comm_share",
        "Communication share",
        PLAN,
        345,
        "share of the step time spent in communication: NCCL's GPU time over the steps' time in Nsight Systems "
        "reports where a run has them, else the part not hidden by compute (the probe, or a profiled run's trace)",
        "< 20 %",
        STRONG,
        nsight_first("nsys_comm_share", "comm_frac", lambda v: v < 20, False, "Nsight Systems"),
    ),
    Criterion(
        "loader_idle",
        "Data wait",
        PLAN,
        346,
        "share of the step time the ranks wait for their next batch (the step timers)",
        "< 5 %",
        STRONG,
        profiled("data_wait_frac", 100.0, lambda v: v < 5, gpu_only=False),
    ),
    Criterion(
        "mfu",
        "Kernel efficiency",
        PLAN,
        347,
        "the kernels' SM throughput as a share of peak, weighted by their time (Nsight Compute's Speed of Light; "
        "NCCL's kernels apart) where a run has Nsight Compute reports, else model FLOPs per second over the "
        "GPU's peak at the run's precision (MFU)",
        "> 50 %",
        ON_GPUS,
        nsight_first("ncu_sm_throughput", "mfu", lambda v: v > 50, True, "Nsight Compute"),
    ),
)
