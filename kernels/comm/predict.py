"""Alpha-beta fits of commbench records, and a data-parallel step predictor built on them.

Fit. For each backend, collective, dtype and placement (intra-node: all ranks on one node;
inter-node: ranks on several) the ring cost model is fitted to every (ranks, size, time)
point of the records by least squares on relative error:

    t(S, n) = steps(n) * alpha + factor(n) * S / busbw

with steps and factor of kernels/comm/collectives.Op (all_reduce: 2(n-1) latency terms and
2(n-1)/n of the bytes on the slowest link). One fit covers every rank count measured.

Prediction of one data-parallel step at N ranks on M nodes (g = N/M ranks per node), from a
1-rank run record (its median step time t1 and gradient bytes, which the record keeps) and
the fits:
- compute: t1 scaled by the per-rank batch (strong scaling: batch/N per rank; weak: the
  same), times the node's core-sharing factor on CPUs (ranks x threads over cores; 1 on GPUs);
- gradients: the record's DDP buckets (the first bucket is 1 MiB, then bucket_cap_mb), each an
  all_reduce; flat ring over all N ranks at the inter-node fit when M > 1, or hierarchical
  (intra-node reduce_scatter, inter-node all_reduce of 1/g of the bytes, intra-node all_gather);
  the cheaper of the two is taken, as NCCL chooses;
- stragglers: a synchronised step waits for the slowest rank; the compute is stretched by the median of
  the maximum of N draws from the 1-rank step-time distribution (lognormal through its p50 and p90);
- overlap: buckets become ready during backward (2/3 of compute, in proportion to their bytes)
  and are reduced one after another; the part of the last reduction that outlasts backward is
  exposed. On CPUs whose cores are all busy computing, the reduction competes with backward
  for the same cores: no overlap is assumed there;
- output: step time, throughput, and strong/weak efficiency against the 1-rank point.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from functools import partial
from pathlib import Path

import numpy as np

from kernels.comm.collectives import OPS
from kernels.base.errors import ConfigError
from kernels.base.files import results_home
from kernels.base.sysinfo import usable_cores
from kernels.base.params import default

FIRST_BUCKET_BYTES = 1024 * 1024  # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES
# A fit resolves alpha and busbw only from at least this many message sizes, with an rms relative error of its
# timings no larger than this; otherwise it is "unresolved", printed without numbers, and never used to predict.
# The fit minimises relative errors, so it never scores worse than predicting nothing (100 %): 80 % is a fit
# that barely beats that. (gloo on a shared 2-core VM fits its timings to 56-64 % rms.)
MIN_FIT_SIZES = 3
MAX_FIT_RMS_REL_ERR = 0.8
# The bandwidth term must carry at least this share of the largest message's time; less is the least-squares
# solver's rounding on a series whose time does not grow with the size (an exactly flat one fitted 1e18 GB/s).
MIN_BANDWIDTH_SHARE = 0.01
BACKWARD_SHARE = 2 / 3  # backward is about twice the forward's FLOPs


# ------------------------------------------------------------------ fitting
def fit_points(op: str, points: list[tuple[int, int, float]]) -> dict:
    """alpha (s) and busbw (bytes/s) from (ranks, bytes, seconds) points; rms relative error of the fit; `status`
    "resolved", or "unresolved: <why>" (too few sizes, no bandwidth term, error above MAX_FIT_RMS_REL_ERR), when the
    quantities it could not resolve are None."""
    o = OPS[op]
    rows = [(o.steps(n), o.factor(n) * s, t) for n, s, t in points if n > 1 and t > 0]
    if len(rows) < 2:
        raise ValueError(f"{op}: need at least two timed points with more than one rank, got {len(rows)}")
    a = np.array([[st / t, f / t] for st, f, t in rows])
    b = np.ones(len(rows))
    (alpha, inv_bw), *_ = np.linalg.lstsq(a, b, rcond=None)
    bandwidth = inv_bw > 0 and max(f * inv_bw / t for _, f, t in rows) >= MIN_BANDWIDTH_SHARE
    if not bandwidth:  # latency-bound everywhere: the bandwidth term is not resolved; fit latency alone
        alpha, inv_bw = float(np.median([t / st for st, _, t in rows])), 0.0
    alpha = max(float(alpha), 0.0)
    pred = np.array([alpha * st + f * inv_bw for st, f, _ in rows])
    real = np.array([t for *_, t in rows])
    err = float(np.sqrt(np.mean((pred / real - 1) ** 2)))
    sizes = len({s for n, s, t in points if n > 1 and t > 0})
    latency_ok = sizes >= MIN_FIT_SIZES and err <= MAX_FIT_RMS_REL_ERR  # alpha stands without the bandwidth term
    why = (
        ([] if bandwidth else ["no bandwidth term (the time does not grow with the size)"])
        + ([] if sizes >= MIN_FIT_SIZES else [f"{sizes} message size(s), fewer than {MIN_FIT_SIZES}"])
        + (
            []
            if err <= MAX_FIT_RMS_REL_ERR
            else [f"rms error {100 * err:.1f} % above {100 * MAX_FIT_RMS_REL_ERR:.0f} %"]
        )
    )
    return {
        "alpha_s": alpha if latency_ok else None,
        "busbw_Bps": 1.0 / inv_bw if latency_ok and bandwidth else None,
        "points": len(rows),
        "ranks": sorted({n for n, *_ in points}),
        "rms_rel_err": err,
        "max_bytes": int(max(s for _, s, _ in points)),
        "status": "unresolved: " + "; ".join(why) if why else "resolved",
    }


def cost(op: str, fit: dict, nbytes: float, n: int) -> float:
    """Seconds of one `op` of `nbytes` at n ranks under `fit`."""
    if n <= 1:
        return 0.0
    o = OPS[op]
    return o.steps(n) * fit["alpha_s"] + o.factor(n) * nbytes / fit["busbw_Bps"]


def load_comm_records(comm_dir: Path, problems: list | None = None) -> list[dict]:
    """The complete commbench records under comm_dir; one that cannot be read is left out and, when `problems`
    is given, listed there as {run_id, status: unreadable, reason}."""
    from kernels.comm.bench import read_record

    out = []
    for d in sorted(Path(comm_dir).glob("*/summary.json")):
        try:
            rec = read_record(d.parent)
        except (OSError, ValueError) as e:  # RecordError is an OSError
            if problems is not None:
                problems.append({"run_id": f"comm/{d.parent.name}", "status": "unreadable", "reason": str(e)})
            continue
        if rec["summary"].get("status") == "complete":
            out.append(rec)
    return out


def fits(records: list[dict], form: str = "auto", by: str = "system", unresolved: bool = False) -> dict:
    """{(backend, op, dtype, placement, key): fit} from complete commbench records. key: the system the record
    was measured on (by="system": Slurm cluster name, else host; kernels/analysis/runs.system_of) or its label
    (by="label": e.g. a paper/systems.yaml key). `form`: which timing column (out, in, or auto: out-of-place
    where the API has it, else in-place). Unresolved fits are left out (the predictor and the proposal use these)
    unless `unresolved` (the tables list them, marked)."""
    from kernels.analysis.runs import system_of

    groups: dict[tuple, list] = {}
    for rec in records:
        key = system_of(rec["config"]) if by == "system" else rec["config"].get("params", {}).get("label") or ""
        for r in rec["rows"]:
            t = r.get("time_us_out") if form in ("out", "auto") else None
            if t is None and form in ("in", "auto"):
                t = r.get("time_us_in")
            if t is None or t == "":
                continue
            k = (r["backend"], r["op"], r["dtype"], r["placement"], key)
            groups.setdefault(k, []).append((int(r["ranks"]), int(r["size_bytes"]), float(t) * 1e-6))
    out = {}
    for k, pts in groups.items():
        try:
            f = fit_points(k[1], pts)
        except ValueError:
            continue
        if unresolved or f["status"] == "resolved":
            out[k] = f
    return out


def fit_table(fitted: dict) -> list[dict]:
    """One row per fit; a quantity the fit could not resolve is None, and `status` says why."""
    return [
        {
            "backend": k[0],
            "op": k[1],
            "dtype": k[2],
            "placement": k[3],
            "system": k[4],
            "alpha_us": None if f["alpha_s"] is None else round(f["alpha_s"] * 1e6, 3),
            "busbw_GBps": None if f["busbw_Bps"] is None else round(f["busbw_Bps"] / 1e9, 4),
            "ranks": ",".join(map(str, f["ranks"])),
            "points": f["points"],
            "rms_rel_err": round(f["rms_rel_err"], 4),
            "status": f.get("status", "resolved"),
        }
        for k, f in sorted(fitted.items())
    ]


def published_fits(system: dict) -> dict:
    """all_reduce 'fits' from a paper/systems.yaml entry's published link bandwidths (GB/s per direction):
    intra-node from the GPU interconnect per GPU, inter-node from the node's network injection bandwidth (a
    ring's busbw cannot beat the slowest link); alpha from the entry's assumed latencies."""
    out = {}
    for placement, bw, lat in (
        ("intra-node", "intranode_GBps", "intranode_latency_us"),
        ("inter-node", "internode_GBps", "internode_latency_us"),
    ):
        if system.get(bw):
            out[placement] = {
                "alpha_s": float(system.get(lat) or 0.0) * 1e-6,
                "busbw_Bps": float(system[bw]) * 1e9,
                "points": 0,
                "ranks": [],
                "rms_rel_err": None,
                "source": "published",
            }
    return out


# ------------------------------------------------------------------ the step model
def buckets(param_bytes: list[int], cap_mb: float) -> list[int]:
    """DDP's bucket sizes: parameters in reverse registration order (the order backward produces their
    gradients), the first bucket closed at 1 MiB, the others at bucket_cap_mb."""
    out, cur, limit = [], 0, FIRST_BUCKET_BYTES
    for b in reversed(param_bytes):
        cur += b
        if cur >= limit:
            out.append(cur)
            cur, limit = 0, int(cap_mb * 1024 * 1024)
    if cur:
        out.append(cur)
    return out


def tree_cost(fit: dict, nbytes: float, n: int) -> float:
    """A pipelined (double) binary tree all_reduce of nbytes over n ranks: reduce up and broadcast down, each
    ceil(log2 n) latency steps, every byte crossing a rank's link once each way (2 S / busbw, against the ring's
    2 (n-1)/n S / busbw): fewer latency terms than the ring from 4 ranks on, never fewer bytes."""
    if n <= 1:
        return 0.0
    return 2 * math.ceil(math.log2(n)) * fit["alpha_s"] + 2 * nbytes / fit["busbw_Bps"]


def allreduce_costs(nbytes: float, n: int, nodes: int, intra: dict | None, inter: dict | None) -> dict[str, float]:
    """Seconds of one all_reduce of nbytes over n ranks on `nodes` nodes under each algorithm the fits allow:
    ring: one ring over all ranks, limited by its slowest link (the inter-node fit across nodes);
    tree: within a node a tree over its ranks; across nodes a chain through each node's ranks (intra-node fit)
    and a tree over the nodes (inter-node fit), the two phases one after the other, as NCCL's tree without
    pipelining across them;
    hierarchical: reduce_scatter inside the node, all_reduce of one g-th across nodes, all_gather inside
    (the intra-node all_reduce's two halves)."""
    if n <= 1:
        return {}
    if nodes <= 1:
        return {"ring": cost("all_reduce", intra, nbytes, n), "tree": tree_cost(intra, nbytes, n)} if intra else {}
    if inter is None:
        return {}
    g = n // nodes
    out = {"ring": cost("all_reduce", inter, nbytes, n)}
    chain = (2 * (g - 1) * intra["alpha_s"] + 2 * nbytes / intra["busbw_Bps"]) if g > 1 and intra else 0.0
    if g == 1 or intra is not None:
        out["tree"] = chain + tree_cost(inter, nbytes, nodes)
    if g > 1 and intra is not None:
        out["hierarchical"] = cost("all_reduce", intra, nbytes, g) + cost("all_reduce", inter, nbytes / g, nodes)
    return out


# The algorithms the model chooses among, per backend: NCCL picks ring or tree by its own cost model (and a
# node-level reduction where a node's GPUs share links); gloo's all_reduce is a ring, MPI's a library's choice,
# both taken here as a ring or the two-level form.
CHOICES = {"nccl": ("ring", "tree", "hierarchical")}
DEFAULT_CHOICE = ("ring", "hierarchical")
ALGORITHMS = ("ring", "tree", "hierarchical")


def allreduce_time(
    nbytes: float, n: int, nodes: int, intra: dict | None, inter: dict | None, choose: tuple = DEFAULT_CHOICE
) -> tuple[float, str]:
    """Seconds for one all_reduce of nbytes over n ranks on `nodes` nodes, and the algorithm that wins among
    `choose` (one name forces it)."""
    if n <= 1:
        return 0.0, "none"
    if nodes <= 1 and intra is None:
        raise ValueError("no intra-node all_reduce fit")
    if nodes > 1 and inter is None:
        raise ValueError("no inter-node all_reduce fit")
    options = {k: v for k, v in allreduce_costs(nbytes, n, nodes, intra, inter).items() if k in choose}
    if not options:
        raise ValueError(f"none of {', '.join(choose)} applies at {n} ranks on {nodes} node(s) with these fits")
    best = min(options, key=options.get)
    where = " (intra-node)" if nodes <= 1 else " (flat)" if best == "ring" else ""
    return options[best], best + where


def predict_step(
    t1_s: float,
    bucket_bytes: list[int],
    n: int,
    nodes: int,
    intra: dict | None,
    inter: dict | None,
    mode: str = "weak",
    cpu_share: float = 1.0,
    overlap: bool = True,
    data_s: float = 0.0,
    choose: tuple = DEFAULT_CHOICE,
) -> dict:
    """One data-parallel step at n ranks on `nodes` nodes. t1_s: the 1-rank step (compute + data wait);
    cpu_share >= 1 slows compute when ranks share cores; overlap: reductions may run under backward; choose:
    the all_reduce algorithms to pick the cheapest of (CHOICES[backend]), or one to force."""
    compute1 = max(t1_s - data_s, 0.0)
    compute = compute1 * (1.0 / n if mode == "strong" else 1.0) * cpu_share
    algo = "none"
    times = []
    for b in bucket_bytes:
        t, algo = allreduce_time(b, n, nodes, intra, inter, choose)
        times.append(t)
    comm = sum(times)
    if not overlap or n <= 1:
        exposed = comm
    else:
        bwd = BACKWARD_SHARE * compute
        total, done, end = sum(bucket_bytes) or 1, 0, 0.0
        for b, t in zip(bucket_bytes, times):
            done += b
            ready = bwd * done / total  # gradients arrive through backward in proportion to bytes
            end = max(end, ready) + t
        exposed = max(0.0, end - bwd)
    step = compute + exposed + data_s
    return {
        "ranks": n,
        "nodes": nodes,
        "compute_s": compute,
        "comm_s": comm,
        "exposed_comm_s": exposed,
        "step_s": step,
        "algorithm": algo,
        "buckets": len(bucket_bytes),
    }


def straggler_factor(p50: float | None, p90: float | None, n: int) -> float:
    """How much longer a synchronised step is than one rank's median: every step waits for the slowest of n
    ranks, whose time is the median of the maximum of n draws from the 1-rank step-time distribution, taken as
    lognormal through its recorded p50 and p90 (1 when n = 1 or the spread is unknown)."""
    from statistics import NormalDist

    if n <= 1 or not p50 or not p90 or p90 <= p50:
        return 1.0
    sigma = math.log(p90 / p50) / NormalDist().inv_cdf(0.9)
    return math.exp(sigma * NormalDist().inv_cdf(0.5 ** (1.0 / n)))


def cpu_share(ranks_per_node: int, threads_per_rank: int, cores: int, on_gpu: bool) -> float:
    """How much slower each rank computes when the node's ranks share its cores (1 on GPUs)."""
    if on_gpu or cores <= 0:
        return 1.0
    return max(1.0, ranks_per_node * threads_per_rank / cores)


def run_inputs(run_dir: Path) -> dict:
    """What the predictor needs from a 1-rank run record."""
    from kernels.records.schema import read_run

    if not (Path(run_dir) / "summary.json").is_file():
        raise ConfigError(
            f"--run {run_dir}: no run record there (no summary.json); pass a run directory, results/runs/<run_id>"
        )
    rec = read_run(run_dir)
    s, c = rec["summary"] or {}, rec["config"] or {}
    if s.get("status") != "complete":
        raise ConfigError(f"--run {run_dir}: not a complete run record (status {s.get('status')!r})")
    if s.get("world_size") != 1:
        raise ConfigError(
            f"--run {run_dir}: the predictor starts from a 1-rank run; this one has {s.get('world_size')} ranks"
        )
    params = c.get("params", c)
    grads = s.get("grad_param_bytes")
    if not grads:
        raise ConfigError(
            f"--run {run_dir}: the record has no gradient sizes (grad_param_bytes); it predates them: "
            f"run the 1-rank point again"
        )
    from kernels.analysis.runs import system_of

    t1 = s["step_ms_p50"] / 1e3
    p90 = s.get("step_ms_p90")
    ranks = c.get("ranks") or [{}]
    return {
        "t1_s": t1,
        "system": system_of(c),
        "p90_s": p90 / 1e3 if p90 else None,
        "data_s": t1 * (s.get("data_wait_frac") or 0.0),
        "param_bytes": grads,
        "bucket_cap_mb": float(params.get("bucket_cap_mb", default("bucket_cap_mb"))),
        "batch": int(params.get("batch") or 0),
        "device": s.get("device_name", ""),
        "run_id": s.get("run_id"),
        "threads": ranks[0].get("threads"),
        "backend": (c.get("derived") or {}).get("backend"),
        "label": params.get("label", ""),
    }


def scaling_mode(run_dir: Path, run: dict) -> tuple[str, str]:
    """(strong or weak, where that came from): the multi-rank runs beside the 1-rank one with its label tell
    (they keep its global batch: strong; their batch grows with the ranks: weak); without them, strong (the
    1-rank run's global batch kept), said so."""
    from kernels.records.schema import RecordError, read_json

    for d in sorted(Path(run_dir).parent.glob("*/config.json")):
        try:
            params = read_json(d).get("params") or {}
        except (RecordError, OSError):  # a damaged record beside it tells nothing
            continue
        if int(params.get("gpus") or 1) > 1 and params.get("label", "") == run["label"] and params.get("batch"):
            mode = "strong" if int(params["batch"]) == run["batch"] else "weak"
            return mode, (
                f"{d.parent.name} ({params['gpus']} ranks, global batch {params['batch']} against "
                f"{run['batch']} at 1 rank)"
            )
    return "strong", "no multi-rank run with its label beside it: the 1-rank run's global batch kept"


def predict(
    run: dict,
    ranks: list[int],
    per_node: int,
    fitted: dict,
    backend: str,
    mode: str,
    cores: int,
    dtype: str = "fp32",
    system: str = "",
    threads: int = 1,
) -> list[dict]:
    on_gpu = not str(run["device"]).startswith("CPU")
    intra = fitted.get((backend, "all_reduce", dtype, "intra-node", system))
    inter = fitted.get((backend, "all_reduce", dtype, "inter-node", system))
    if intra is None and inter is None:
        have = sorted({f"{k[0]} on {k[4] or '?'}" for k in fitted if k[1] == "all_reduce"})
        raise ConfigError(
            f"--system {system!r} --backend {backend}: no all_reduce fit; the commbench records have "
            f"{', '.join(have) or 'none'}. Run commbench there first, or pick one of those"
        )
    _placements_fitted(ranks, per_node, intra, inter, backend, system)
    bks = buckets(run["param_bytes"], run["bucket_cap_mb"])
    out = []
    for n in ranks:
        nodes = max(1, math.ceil(n / per_node))
        g = min(n, per_node)
        share = cpu_share(g, threads, cores, on_gpu)
        busy = not on_gpu and g * threads >= cores
        p = predict_step(
            run["t1_s"],
            bks,
            n,
            nodes,
            intra,
            inter,
            mode,
            share * straggler_factor(run["t1_s"], run.get("p90_s"), n),
            overlap=not busy,
            data_s=run["data_s"],
            choose=CHOICES.get(backend, DEFAULT_CHOICE),
        )
        base = run["t1_s"]
        p["samples_per_s"] = (run["batch"] * (1 if mode == "strong" else n)) / p["step_s"] if run["batch"] else None
        p["efficiency"] = base / (n * p["step_s"]) if mode == "strong" else base / p["step_s"]
        p["mode"], p["cpu_share"], p["overlap"] = mode, share, not busy
        out.append(p)
    return out


def _placements_fitted(ranks: list[int], per_node: int, intra, inter, backend: str, system: str) -> None:
    """Refuse, in one line, a rank count whose placement has no all_reduce fit: name the missing commbench
    record and the command that makes it (the step model would otherwise fail deep inside)."""
    where = f"on system {system or '?'} with backend {backend}"
    multi = [n for n in ranks if n > per_node]
    if multi and inter is None:
        raise ConfigError(
            f"--gpus {multi[0]} with --gpus_per_node {per_node} spans nodes, but the commbench "
            f"records {where} have no inter-node all_reduce fit. Measure one on two nodes "
            f"(`sbatch --nodes=2 --ntasks-per-node=1 slurm/papermill_run.sbatch "
            f"notebooks/03_commbench.ipynb -p backend {backend} -p gpus 2`), or predict within one "
            f"node: --gpus_per_node {max(ranks)}"
        )
    inside = [n for n in ranks if 1 < n <= per_node]  # across nodes the intra-node fit is optional (hierarchical)
    if inside and intra is None:
        raise ConfigError(
            f"--gpus {inside[0]} fits in one node (--gpus_per_node {per_node}), but the commbench "
            f"records {where} have no intra-node all_reduce fit. Measure one in one node "
            f"(`lab comm bench --backend {backend} "
            f"--gpus 2 --ops all_reduce`), or give --gpus_per_node 1"
        )


# ------------------------------------------------------------------ predicted vs measured
VALIDATION_COLUMNS = [
    "mode",
    "series",
    "system",
    "backend",
    "gpus",
    "nodes",
    "per_rank_batch",
    "repeats",
    "measured_step_ms",
    "measured_step_ms_min",
    "measured_step_ms_max",
    "predicted_step_ms",
    "error",
    "measured_efficiency",
    "predicted_efficiency",
    "compute_ms",
    "comm_ms",
    "exposed_ms",
    "probe_exposed_ms",
    "cpu_share",
    "algorithm",
    "ring_ms",
    "tree_ms",
    "hierarchical_ms",
    "closest",
]


def _share(row, on_gpu: bool) -> float:
    if on_gpu:
        return 1.0
    return cpu_share(int(row["ranks_per_host"]), int(row["threads"] or 1), int(row["host_cores"] or 0), False)


def validation(runs, comm_records: list[dict]):
    """Predicted against measured step time for every series of the run records (kernels/analysis/runs.load_runs)
    that has a 1-rank point with gradient sizes, multi-rank points, and all_reduce fits on the same system and
    backend. One row per (series, N): medians over repeats; error = predicted / measured - 1. A point the fits
    cannot predict (no resolved fit for its placement) keeps its row, measured only, and its algorithm column
    says why."""
    import pandas as pd

    from kernels.analysis.runs import CONFIG_KEYS, series_name

    if runs.empty or "grad_param_bytes" not in runs:
        return pd.DataFrame(columns=VALIDATION_COLUMNS)
    listed = fits(comm_records, unresolved=True)  # every fit, for the reasons; predictions use resolved ones
    fitted = {k: f for k, f in listed.items() if f["status"] == "resolved"}
    runs = runs.assign(
        _key=runs.apply(lambda r: tuple(r[k] for k in CONFIG_KEYS) + (r["system"], r["backend"]), axis=1)
    )
    rows = []
    for mode, by in (("strong", "batch"), ("weak", "per_rank_batch")):
        for (key, fixed), series in runs.groupby(["_key", by], sort=True):
            base = series[(series["gpus"] == 1) & series["grad_param_bytes"].notna()]
            if base.empty or series["gpus"].nunique() < 2 or (mode == "weak" and series["batch"].nunique() < 2):
                continue
            system, backend = key[-2], key[-1]
            placed = {pl: fitted.get((backend, "all_reduce", "fp32", pl, system)) for pl in PLACEMENTS}
            if not any(placed.values()):
                continue
            if dict(zip(CONFIG_KEYS, key)).get("engine") not in (None, "ddp"):
                continue  # the model is DDP's (buckets, overlap); Horovod fuses and cycles differently
            why = {pl: unresolved_why(listed.get((backend, "all_reduce", "fp32", pl, system))) for pl in PLACEMENTS}
            head = {"mode": mode, "series": series_name(dict(zip(CONFIG_KEYS, key)), by, fixed), "system": system}
            rows += [
                {**head, **point_row(base, pts, int(n), placed, why, backend)} for n, pts in series.groupby("gpus")
            ]
    return pd.DataFrame(rows, columns=VALIDATION_COLUMNS)


PLACEMENTS = ("intra-node", "inter-node")


def unresolved_why(fit: dict | None) -> str:
    """Why a placement has no fit to predict from: its fit's status, or no record of it."""
    return fit["status"] if fit else "no commbench record of it"


def point_row(base, pts, n: int, placed: dict, why: dict, backend: str) -> dict:
    """One validation row: the N-rank point `pts` (repeats) of a series whose 1-rank records are `base`, predicted
    from the resolved fits `placed` (by placement), or measured only with the reason (`why`, by placement)."""
    b0, p0 = base.iloc[0], pts.iloc[0]
    on_gpu = not str(b0["device"]).startswith("CPU")
    t1 = float(base["step_ms"].median()) / 1e3
    p90_1 = (
        float(base["step_ms_p90"].median()) / 1e3
        if "step_ms_p90" in base and base["step_ms_p90"].notna().any()
        else None
    )
    data1 = t1 * float(base["data_wait_frac"].median() or 0.0)
    bks = buckets(list(b0["grad_param_bytes"]), float(b0["bucket_cap_mb"] or default("bucket_cap_mb")))
    nodes = int(pts["nodes"].max())
    share = _share(p0, on_gpu) / _share(b0, on_gpu)
    busy = not on_gpu and int(p0["ranks_per_host"]) * int(p0["threads"] or 1) >= int(p0["host_cores"] or 1)
    # compute scales with the per-rank batch and with how many ranks share a host's cores
    comp1 = (t1 - data1) * float(p0["per_rank_batch"]) / float(b0["per_rank_batch"]) * share
    comp1 *= straggler_factor(t1, p90_1, n)
    intra, inter = placed["intra-node"], placed["inter-node"]
    step = partial(predict_step, comp1, bks, n, nodes, intra, inter, "weak", 1.0, not busy, 0.0)
    meas = float(pts["step_ms"].median()) / 1e3
    measured = {
        "backend": backend,
        "gpus": n,
        "nodes": nodes,
        "per_rank_batch": int(p0["per_rank_batch"]),
        "repeats": len(pts),
        "measured_step_ms": 1e3 * meas,
        "measured_step_ms_min": float(pts["step_ms"].min()),
        "measured_step_ms_max": float(pts["step_ms"].max()),
        "measured_efficiency": _eff(t1, meas, p0, b0),
        "cpu_share": share,
        "probe_exposed_ms": float(pts["exposed_comm_ms"].median())
        if "exposed_comm_ms" in pts and pts["exposed_comm_ms"].notna().any()
        else None,
    }
    try:
        p = step(CHOICES.get(backend, DEFAULT_CHOICE))
    except ValueError as e:  # no resolved fit where this point's all-reduce runs
        placement = "inter-node" if nodes > 1 else "intra-node"
        return {**measured, "algorithm": f"no prediction: {e} ({why[placement]})"}
    pred = p["step_s"] + data1
    return {
        **measured,
        "predicted_step_ms": 1e3 * pred,
        "error": pred / meas - 1 if n > 1 else None,
        "predicted_efficiency": _eff(t1, pred, p0, b0),
        "compute_ms": 1e3 * p["compute_s"],
        "comm_ms": 1e3 * p["comm_s"],
        "exposed_ms": 1e3 * p["exposed_comm_s"],
        "algorithm": p["algorithm"],
        **by_algorithm(step, data1, meas, n),
    }


def by_algorithm(step, data_s: float, measured_s: float, n: int) -> dict:
    """The step predicted with each all_reduce algorithm forced (ms; None where it does not apply, and all None
    at one rank), and the one closest to the measured step: the topology comparison of the validation."""
    out = {f"{algo}_ms": None for algo in ALGORITHMS}
    for algo in ALGORITHMS if n > 1 else ():
        try:
            out[f"{algo}_ms"] = 1e3 * (step((algo,))["step_s"] + data_s)
        except ValueError:
            continue  # the algorithm does not apply here: left None
    known = {a: out[f"{a}_ms"] for a in ALGORITHMS if out[f"{a}_ms"] is not None}
    out["closest"] = min(known, key=lambda a: abs(known[a] / 1e3 - measured_s)) if known else None
    return out


def _eff(t1: float, tn: float, point, base) -> float:
    """Efficiency from step times: per-device throughput at n over that of the 1-rank point."""
    return (float(point["per_rank_batch"]) / tn) / (float(base["per_rank_batch"]) / t1)


# ------------------------------------------------------------------ command line
def comm_records(comm_dir: Path, required: bool = True) -> list[dict]:
    """load_comm_records for the command line: each record left out as unreadable is a warning naming it and why
    (they were skipped without a word), and none at all is an error when `required`."""
    problems: list[dict] = []
    recs = load_comm_records(comm_dir, problems)
    for p in problems:
        print(f"warning: {p['run_id']} left out: {p['reason']}", file=sys.stderr, flush=True)
    if required and not recs:
        left = f" ({len(problems)} unreadable, named above)" if problems else ""
        raise ConfigError(
            f"--comm {comm_dir}: no complete commbench record{left}; run `python -m kernels.comm bench` first"
        )
    return recs


def _fitted_from(comm_dir: Path) -> dict:
    return fits(comm_records(comm_dir))


def fit_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="lab comm fit", description="alpha-beta fits of the commbench records")
    ap.add_argument("--comm", type=Path, default=results_home() / "comm", help="commbench records (results/comm)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    a = ap.parse_args(argv)
    table = fit_table(fits(comm_records(a.comm), unresolved=True))
    if a.json:
        print(json.dumps(table, indent=2))
        return 0
    cols = ["backend", "op", "dtype", "placement", "system", "alpha_us", "busbw_GBps", "ranks", "points", "rms_rel_err"]
    print("  ".join(f"{c:>12}" for c in cols) + "  status")
    for r in table:  # a quantity the fit could not resolve is printed as such, never as a number
        print("  ".join(f"{'unresolved' if r[c] is None else str(r[c]):>12}" for c in cols) + f"  {r['status']}")
    return 0


def predict_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="lab comm predict", description="predict data-parallel steps from a 1-rank run record and commbench fits"
    )
    ap.add_argument("--run", type=Path, required=True, help="a complete 1-rank run record (results/runs/<id>)")
    ap.add_argument("--gpus", default="1,2,4,8", help="rank counts to predict, comma-separated")
    ap.add_argument("--gpus_per_node", type=int, default=2, help="ranks per node")
    ap.add_argument("--comm", type=Path, default=results_home() / "comm", help="commbench records")
    ap.add_argument("--backend", default=None, help="backend of the fits to use (default: the run's)")
    ap.add_argument(
        "--system",
        default=None,
        help="system whose fits to use (default: the one the run was measured on; `lab comm fit` lists them)",
    )
    ap.add_argument(
        "--mode",
        choices=("weak", "strong"),
        default=None,
        help="default: from the multi-rank runs beside the 1-rank one (same label)",
    )
    ap.add_argument("--cores", type=int, default=usable_cores(), help="CPU cores per node (core sharing)")
    ap.add_argument(
        "--threads", type=int, default=None, help="compute threads per CPU rank (default: what the 1-rank run used)"
    )
    a = ap.parse_args(argv)
    try:
        ranks = [int(x) for x in a.gpus.split(",")]
    except ValueError:
        raise ConfigError(f"--gpus {a.gpus!r}: give rank counts such as 1,2,4") from None
    run = run_inputs(a.run)
    mode, mode_from = (a.mode, "--mode") if a.mode else scaling_mode(a.run, run)
    threads, threads_from = (
        (a.threads, "--threads")
        if a.threads
        else (run["threads"], "the run record (rank 0's threads)")
        if run["threads"]
        else (1, "no threads in the run record")
    )
    backend, backend_from = (a.backend, "--backend") if a.backend else (run["backend"] or "gloo", "the run record")
    system = run["system"] if a.system is None else a.system
    print(
        f"# from {a.run}: mode {mode} ({mode_from}); threads per rank {threads} ({threads_from}); "
        f"backend {backend} ({backend_from}); system {system}; {a.cores} cores per node"
    )
    rows = predict(
        run, ranks, a.gpus_per_node, _fitted_from(a.comm), backend, mode, a.cores, system=system, threads=threads
    )
    print(
        f"{'ranks':>6} {'nodes':>6} {'step_ms':>9} {'compute_ms':>11} {'comm_ms':>9} {'exposed_ms':>11} "
        f"{'samples/s':>10} {'eff':>6}  algorithm"
    )
    for r in rows:
        sps = f"{r['samples_per_s']:.1f}" if r["samples_per_s"] else "-"
        print(
            f"{r['ranks']:>6} {r['nodes']:>6} {1e3 * r['step_s']:>9.2f} {1e3 * r['compute_s']:>11.2f} "
            f"{1e3 * r['comm_s']:>9.2f} {1e3 * r['exposed_comm_s']:>11.2f} {sps:>10} {r['efficiency']:>6.2f}  "
            f"{r['algorithm']}"
        )
    return 0


def _fmt(v, spec: str = ".1f") -> str:
    return "" if v is None or v != v else format(v, spec)


def write_markdown(path: Path, table, runs, args) -> None:
    from datetime import datetime, timezone

    from kernels.base.files import atomic_write_bytes

    used = runs[runs["run_id"].notna()]
    lines = [
        "# Step predictor: predicted against measured step time",
        "",
        f"Generated by `python -m kernels.comm validate --markdown {path}` on "
        f"{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} from {len(used)} run records "
        f"({args.runs}) and the commbench records in {args.comm}.",
        f"Devices: {', '.join(sorted(used['device'].unique()))}; torch "
        f"{', '.join(sorted(used['torch'].unique()))}; "
        f"systems: {', '.join(sorted(table['system'].unique()))}; physical hosts of "
        f"{', '.join(str(int(c)) for c in sorted(used['host_cores'].dropna().unique()))} cores, up to "
        f"{int(used['ranks_per_host'].max())} ranks on one host (emulated Slurm nodes may share a machine).",
        "",
        "Probe exposed ms: the run's own measurement of the all-reduce time backward did not hide (fwd+bwd "
        "with minus without gradient sync, after training); the model's counterpart is 'exposed ms'.",
        "",
        "Measured: median step time over repeats (each run's median over its timed steps, slowest rank per "
        "step), min-max over repeats in brackets. Error: predicted / measured - 1.",
        "",
        "Ring, tree, hierarchical: the step predicted with that all-reduce algorithm forced (blank where it does "
        "not apply); closest: the one nearest the measured step. The predicted column takes the cheapest the "
        "backend runs (kernels/comm/predict.py, CHOICES).",
        "",
        "| series | ranks | nodes | repeats | measured "
        "ms | predicted ms | error | eff. measured | eff. predicted |"
        " compute ms | all-reduce ms | exposed ms | probe exposed ms | algorithm |"
        " ring ms | tree ms | hierarchical ms | closest |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    for _, r in table.iterrows():
        known = r["error"] is not None and r["error"] == r["error"]
        err = f"{100 * r['error']:+.1f} %" if known else "(base)" if r["gpus"] == 1 else "-"
        lines.append(
            f"| {r['series']} | {r['gpus']} | {r['nodes']} | {r['repeats']} | {r['measured_step_ms']:.1f} "
            f"({r['measured_step_ms_min']:.1f}-{r['measured_step_ms_max']:.1f}) | "
            f"{_fmt(r['predicted_step_ms'])} | {err} | {r['measured_efficiency']:.2f} | "
            f"{_fmt(r['predicted_efficiency'], '.2f')} | {_fmt(r['compute_ms'])} | {_fmt(r['comm_ms'], '.2f')} | "
            f"{_fmt(r['exposed_ms'], '.2f')} | {_fmt(r['probe_exposed_ms'])} | {r['algorithm']} | "
            + " | ".join(_fmt(r[f"{a}_ms"]) for a in ALGORITHMS)
            + f" | {r['closest'] if isinstance(r['closest'], str) else ''} |"
        )
    atomic_write_bytes(Path(path), ("\n".join(lines) + "\n").encode())


def validate_main(argv: list[str]) -> int:
    from kernels.analysis.runs import load_runs

    ap = argparse.ArgumentParser(
        prog="lab comm validate",
        description="predicted against measured step times of "
        "every series with a 1-rank point and commbench fits on the same system",
    )
    ap.add_argument("--runs", type=Path, default=results_home() / "runs", help="run records")
    ap.add_argument("--comm", type=Path, default=results_home() / "comm", help="commbench records")
    ap.add_argument("--label", action="append", default=[], help="only runs with this label or study (repeatable)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--markdown", type=Path, help="also write the table as Markdown with the machine and versions")
    a = ap.parse_args(argv)
    runs, _, _ = load_runs(a.runs, {"labels": a.label, "studies": a.label} if a.label else None)
    table = validation(runs, comm_records(a.comm, required=False))
    if table.empty:
        raise ConfigError(
            f"no series to validate in {a.runs}: it needs a 1-rank run and multi-rank runs of the same "
            f"configuration, and commbench all_reduce records of the same system and backend in {a.comm}"
        )
    if a.markdown:
        write_markdown(a.markdown, table, runs, a)
        print(f"wrote {a.markdown}")
    if a.json:
        print(table.to_json(orient="records", indent=2))
        return 0
    print(
        f"{'series':<44} {'ranks':>5} {'nodes':>5} {'measured_ms':>12} {'predicted_ms':>13} {'error':>7} "
        f"{'eff_meas':>8} {'eff_pred':>8}  system/backend"
    )
    for _, r in table.iterrows():
        known = r["error"] is not None and r["error"] == r["error"]
        err = f"{100 * r['error']:+.1f}%" if known else "base" if r["gpus"] == 1 else "-"
        print(
            f"{r['series'][:44]:<44} {r['gpus']:>5} {r['nodes']:>5} {r['measured_step_ms']:>12.2f} "
            f"{_fmt(r['predicted_step_ms'], '.2f') or '-':>13} {err:>7} {r['measured_efficiency']:>8.2f} "
            f"{_fmt(r['predicted_efficiency'], '.2f') or '-':>8}  {r['system']}/{r['backend']}"
            + ("" if known or r["gpus"] == 1 else f"  {r['algorithm']}")
        )
    return 0


if __name__ == "__main__":
    sys.exit(fit_main(sys.argv[1:]))
