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
from pathlib import Path

import numpy as np

from kernels.comm.collectives import OPS
from kernels.params import ConfigError, results_home

FIRST_BUCKET_BYTES = 1024 * 1024  # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES
BACKWARD_SHARE = 2 / 3            # backward is about twice the forward's FLOPs


# ------------------------------------------------------------------ fitting
def fit_points(op: str, points: list[tuple[int, int, float]]) -> dict:
    """alpha (s) and busbw (bytes/s) from (ranks, bytes, seconds) points; rms relative error of the fit."""
    o = OPS[op]
    rows = [(o.steps(n), o.factor(n) * s, t) for n, s, t in points if n > 1 and t > 0]
    if len(rows) < 2:
        raise ValueError(f"{op}: need at least two timed points with more than one rank, got {len(rows)}")
    a = np.array([[st / t, f / t] for st, f, t in rows])
    b = np.ones(len(rows))
    (alpha, inv_bw), *_ = np.linalg.lstsq(a, b, rcond=None)
    if inv_bw <= 0:  # latency-bound everywhere: bandwidth unresolvable; fit latency alone
        alpha = float(np.median([t / st for st, _, t in rows]))
        inv_bw = 1e-30
    alpha = max(float(alpha), 0.0)
    pred = np.array([alpha * st + f * inv_bw for st, f, _ in rows])
    real = np.array([t for *_, t in rows])
    return {"alpha_s": alpha, "busbw_Bps": 1.0 / inv_bw, "points": len(rows),
            "ranks": sorted({n for n, *_ in points}), "rms_rel_err": float(np.sqrt(np.mean((pred / real - 1) ** 2))),
            "max_bytes": int(max(s for _, s, _ in points))}


def cost(op: str, fit: dict, nbytes: float, n: int) -> float:
    """Seconds of one `op` of `nbytes` at n ranks under `fit`."""
    if n <= 1:
        return 0.0
    o = OPS[op]
    return o.steps(n) * fit["alpha_s"] + o.factor(n) * nbytes / fit["busbw_Bps"]


def load_comm_records(comm_dir: Path) -> list[dict]:
    from kernels.comm.bench import read_record
    from kernels.records import RecordError

    out = []
    for d in sorted(Path(comm_dir).glob("*/summary.json")):
        try:
            rec = read_record(d.parent)
        except (RecordError, OSError):
            continue
        if rec["summary"].get("status") == "complete":
            out.append(rec)
    return out


def fits(records: list[dict], form: str = "auto") -> dict:
    """{(backend, op, dtype, placement, system): fit} from complete commbench records. `form`: which timing
    column (out, in, or auto: out-of-place where the API has it, else in-place)."""
    groups: dict[tuple, list] = {}
    for rec in records:
        system = rec["config"].get("params", {}).get("label") or ""
        for r in rec["rows"]:
            t = r.get("time_us_out") if form in ("out", "auto") else None
            if t is None and form in ("in", "auto"):
                t = r.get("time_us_in")
            if t is None:
                continue
            key = (r["backend"], r["op"], r["dtype"], r["placement"], system)
            groups.setdefault(key, []).append((int(r["ranks"]), int(r["size_bytes"]), float(t) * 1e-6))
    out = {}
    for key, pts in groups.items():
        try:
            out[key] = fit_points(key[1], pts)
        except ValueError:
            continue
    return out


def fit_table(fitted: dict) -> list[dict]:
    return [{"backend": k[0], "op": k[1], "dtype": k[2], "placement": k[3], "label": k[4],
             "alpha_us": round(f["alpha_s"] * 1e6, 3), "busbw_GBps": round(f["busbw_Bps"] / 1e9, 4),
             "ranks": ",".join(map(str, f["ranks"])), "points": f["points"],
             "rms_rel_err": round(f["rms_rel_err"], 4)} for k, f in sorted(fitted.items())]


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


def allreduce_time(nbytes: float, n: int, nodes: int, intra: dict | None, inter: dict | None) -> tuple[float, str]:
    """Seconds for one all_reduce of nbytes over n ranks on `nodes` nodes, and the algorithm that wins."""
    if n <= 1:
        return 0.0, "none"
    if nodes <= 1:
        if intra is None:
            raise ValueError("no intra-node all_reduce fit")
        return cost("all_reduce", intra, nbytes, n), "ring (intra-node)"
    if inter is None:
        raise ValueError("no inter-node all_reduce fit")
    options = {"ring (flat)": cost("all_reduce", inter, nbytes, n)}
    g = n // nodes
    if g > 1 and intra is not None:
        # hierarchical: reduce_scatter inside the node (same ring as all_reduce's first half), all_reduce of
        # one g-th across nodes, all_gather inside the node: the intra-node all_reduce's two halves
        options["hierarchical"] = cost("all_reduce", intra, nbytes, g) + cost("all_reduce", inter, nbytes / g, nodes)
    best = min(options, key=options.get)
    return options[best], best


def predict_step(t1_s: float, bucket_bytes: list[int], n: int, nodes: int, intra: dict | None, inter: dict | None,
                 mode: str = "weak", cpu_share: float = 1.0, overlap: bool = True, data_s: float = 0.0) -> dict:
    """One data-parallel step at n ranks on `nodes` nodes. t1_s: the 1-rank step (compute + data wait);
    cpu_share >= 1 slows compute when ranks share cores; overlap: reductions may run under backward."""
    compute1 = max(t1_s - data_s, 0.0)
    compute = compute1 * (1.0 / n if mode == "strong" else 1.0) * cpu_share
    algo = "none"
    times = []
    for b in bucket_bytes:
        t, algo = allreduce_time(b, n, nodes, intra, inter)
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
    return {"ranks": n, "nodes": nodes, "compute_s": compute, "comm_s": comm, "exposed_comm_s": exposed,
            "step_s": step, "algorithm": algo, "buckets": len(bucket_bytes)}


def cpu_share(ranks_per_node: int, threads_per_rank: int, cores: int, on_gpu: bool) -> float:
    """How much slower each rank computes when the node's ranks share its cores (1 on GPUs)."""
    if on_gpu or cores <= 0:
        return 1.0
    return max(1.0, ranks_per_node * threads_per_rank / cores)


def run_inputs(run_dir: Path) -> dict:
    """What the predictor needs from a 1-rank run record."""
    from kernels.records import read_run

    rec = read_run(run_dir)
    s, c = rec["summary"] or {}, rec["config"] or {}
    if s.get("status") != "complete":
        raise ConfigError(f"--run {run_dir}: not a complete run record (status {s.get('status')!r})")
    if s.get("world_size") != 1:
        raise ConfigError(f"--run {run_dir}: the predictor starts from a 1-rank run; this one has "
                          f"{s.get('world_size')} ranks")
    params = c.get("params", c)
    grads = s.get("grad_param_bytes")
    if not grads:
        raise ConfigError(f"--run {run_dir}: the record has no gradient sizes (grad_param_bytes); it predates them: "
                          f"run the 1-rank point again")
    t1 = s["step_ms_p50"] / 1e3
    return {"t1_s": t1, "data_s": t1 * (s.get("data_wait_frac") or 0.0), "param_bytes": grads,
            "bucket_cap_mb": float(params.get("bucket_cap_mb", 25.0)), "batch": int(params.get("batch") or 0),
            "device": s.get("device_name", ""), "run_id": s.get("run_id")}


def predict(run: dict, ranks: list[int], per_node: int, fitted: dict, backend: str, mode: str, cores: int,
            dtype: str = "fp32", label: str = "", threads: int = 1) -> list[dict]:
    on_gpu = not str(run["device"]).startswith("CPU")
    intra = fitted.get((backend, "all_reduce", dtype, "intra-node", label))
    inter = fitted.get((backend, "all_reduce", dtype, "inter-node", label))
    bks = buckets(run["param_bytes"], run["bucket_cap_mb"])
    out = []
    for n in ranks:
        nodes = max(1, math.ceil(n / per_node))
        g = min(n, per_node)
        share = cpu_share(g, threads, cores, on_gpu)
        busy = not on_gpu and g * threads >= cores
        p = predict_step(run["t1_s"], bks, n, nodes, intra, inter, mode, share, overlap=not busy, data_s=run["data_s"])
        base = run["t1_s"]
        p["samples_per_s"] = (run["batch"] * (1 if mode == "strong" else n)) / p["step_s"] if run["batch"] else None
        p["efficiency"] = (base / (n * p["step_s"]) if mode == "strong" else base / p["step_s"])
        p["mode"], p["cpu_share"], p["overlap"] = mode, share, not busy
        out.append(p)
    return out


# ------------------------------------------------------------------ command line
def _fitted_from(comm_dir: Path) -> dict:
    recs = load_comm_records(comm_dir)
    if not recs:
        raise ConfigError(f"--comm {comm_dir}: no complete commbench record; run `python -m kernels.comm bench` first")
    return fits(recs)


def fit_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="lab comm fit", description="alpha-beta fits of the commbench records")
    ap.add_argument("--comm", type=Path, default=results_home() / "comm", help="commbench records (results/comm)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    a = ap.parse_args(argv)
    table = fit_table(_fitted_from(a.comm))
    if a.json:
        print(json.dumps(table, indent=2))
        return 0
    cols = ["backend", "op", "dtype", "placement", "label", "alpha_us", "busbw_GBps", "ranks", "points", "rms_rel_err"]
    print("  ".join(f"{c:>12}" for c in cols))
    for r in table:
        print("  ".join(f"{str(r[c]):>12}" for c in cols))
    return 0


def predict_main(argv: list[str]) -> int:
    import os

    ap = argparse.ArgumentParser(prog="lab comm predict", description="predict data-parallel steps from a "
                                 "1-rank run record and commbench fits")
    ap.add_argument("--run", type=Path, required=True, help="a complete 1-rank run record (results/runs/<id>)")
    ap.add_argument("--gpus", default="1,2,4,8", help="rank counts to predict, comma-separated")
    ap.add_argument("--gpus_per_node", type=int, default=2, help="ranks per node")
    ap.add_argument("--comm", type=Path, default=results_home() / "comm", help="commbench records")
    ap.add_argument("--backend", default="gloo", help="backend of the fits to use")
    ap.add_argument("--mode", choices=("weak", "strong"), default="weak")
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="CPU cores per node (core sharing)")
    ap.add_argument("--threads", type=int, default=1, help="compute threads per CPU rank (OMP_NUM_THREADS)")
    a = ap.parse_args(argv)
    try:
        ranks = [int(x) for x in a.gpus.split(",")]
    except ValueError:
        raise ConfigError(f"--gpus {a.gpus!r}: give rank counts such as 1,2,4") from None
    rows = predict(run_inputs(a.run), ranks, a.gpus_per_node, _fitted_from(a.comm), a.backend, a.mode, a.cores,
                   threads=a.threads)
    print(f"{'ranks':>6} {'nodes':>6} {'step_ms':>9} {'compute_ms':>11} {'comm_ms':>9} {'exposed_ms':>11} "
          f"{'samples/s':>10} {'eff':>6}  algorithm")
    for r in rows:
        sps = f"{r['samples_per_s']:.1f}" if r["samples_per_s"] else "-"
        print(f"{r['ranks']:>6} {r['nodes']:>6} {1e3 * r['step_s']:>9.2f} {1e3 * r['compute_s']:>11.2f} "
              f"{1e3 * r['comm_s']:>9.2f} {1e3 * r['exposed_comm_s']:>11.2f} {sps:>10} {r['efficiency']:>6.2f}  "
              f"{r['algorithm']}")
    return 0


if __name__ == "__main__":
    sys.exit(fit_main(sys.argv[1:]))
