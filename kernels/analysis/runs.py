"""From run records to scaling numbers (pandas; used by the analysis notebooks and `make paper`).

Definitions (one place; the documents quote them):
- X_N: training throughput of a run on N ranks (samples/s, all ranks): each
  run's headline is the global batch over its median step time (kernels/base/stats.py);
  repeats of the same configuration are aggregated by their median, with an
  order-statistic confidence interval of that median (its real coverage is
  reported: 95 % needs six repeats).
- t_N = B / X_N: time per optimizer step for global batch B.
- Strong scaling (fixed global batch B): speedup S_N = T_1 / T_N = X_N / X_1 and
  efficiency E_s = T_1 / (N T_N), with T the time per epoch (the same total
  work at every N), so E_s = (X_N / N) / X_1.
- Weak scaling (fixed per-rank batch b, B = N b): speedup X_N / X_1 and
  E_w = T_1 / T_N with T the time per step (the same work per rank,
  T_N = N b / X_N), so again E_w = (X_N / N) / X_1.
- The baseline is the smallest N measured in the series (normally 1); when it
  is N_0 > 1, efficiencies are relative to it (E = (X_N / N) / (X_N0 / N0)).
- Epoch time (epoch_s): the median over repeats of each record's measured epoch time (epoch_s_median: the
  epoch's training steps on the slowest rank, evaluation excluded); where a record has none, the projection
  steps_per_epoch x t_N, flagged in epoch_projected. The efficiencies above use throughputs, not epoch times.
- Accuracy gap: 100 (acc_N - acc_baseline), in points.
- Repeats: runs with equal CONFIG_KEYS at the same N and batch. `kind` is one of them:
  a profiled run (profile_steps > 0) or a run of another notebook than 01_train is
  never a repeat of a training point.
- Points that may not become a headline (contended, superlinear, disagreeing or too
  few repeats) are flagged in `flags` and `clean` (kernels/analysis/trust.py). A contended repeat
  of a point that also has a quiet one is left out of it (`superseded`): the re-run
  measured the point.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from kernels.analysis import trust
from kernels.records.schema import check_side_files, read_json, read_run
from kernels.base.stats import median_ci
from kernels.base.params import default

# The configuration that defines "the same experiment" apart from gpus and batch.
CONFIG_KEYS = (
    "workload",
    "dataset",
    "width",
    "model_source",
    "precision",
    "pipeline",
    "bucket_cap_mb",
    "gradient_as_bucket_view",
    "channels_last",
    "compile",
    "micro_batches",
    "train_samples",
    "synthetic_shape",
    "rnn_units",
    "gp",
    "engine",
    "kind",
)
# Optimisations compared before/after, with the "before" value.
FACTORS = {
    "precision": "fp32",
    "pipeline": "dataloader",
    "bucket_cap_mb": default("bucket_cap_mb"),
    "channels_last": False,
    "compile": False,
}
VERSION_KEYS = ("torch", "cuda", "nccl", "device")


def selected(params: dict, lab: dict, select: dict | None) -> bool:
    """Is a record in the selection? select: {'labels': [...], 'studies': [...]}; empty selects all."""
    select = select or {}
    labels, studies = list(select.get("labels") or []), list(select.get("studies") or [])
    if not labels and not studies:
        return True
    return params.get("label") in labels or lab.get("lab_study_id") in studies or params.get("label") in studies


def selection_names(runs_dir: Path) -> dict[str, int]:
    """Every study id and label the records in runs_dir carry, with how many records carry it: what a selection
    can name. A record whose config.json is missing or unreadable names nothing (load_runs says why)."""
    names: dict[str, int] = {}
    for cfg in sorted(Path(runs_dir).glob("*/config.json")) if Path(runs_dir).is_dir() else []:
        try:
            c = read_json(cfg)
            found = {str((c.get("lab") or {}).get("lab_study_id") or ""), str(c["params"].get("label") or "")}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        for name in found - {""}:
            names[name] = names.get(name, 0) + 1
    return names


def load_runs(runs_dir: Path, select: dict | None = None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(complete selected runs, problems, excluded): one row per record.

    problems: selected records that are not complete (failed, stopped, unreadable, untimed);
    excluded: records outside the selection (other studies, ad-hoc runs), named so nothing
    disappears silently.
    """
    rows, problems, excluded = [], [], []
    runs_dir = Path(runs_dir)
    for d in sorted(p for p in runs_dir.glob("*") if p.is_dir()) if runs_dir.is_dir() else []:
        try:
            kind, item = _load_one(d, select)
        except (OSError, ValueError) as e:  # RecordError is an OSError; a damaged file names itself
            kind, item = "problem", {"run_id": d.name, "status": "unreadable", "reason": str(e)}
        except (KeyError, TypeError, AttributeError) as e:  # valid files lacking what a record holds
            kind, item = (
                "problem",
                {
                    "run_id": d.name,
                    "status": "unreadable",
                    "reason": f"config.json or summary.json lacks or mistypes {e}; the record is "
                    f"damaged or from another program: remove it and run again",
                },
            )
        {"row": rows, "problem": problems, "excluded": excluded}[kind].append(item)
    runs = pd.DataFrame(rows)
    if "epoch_s" in runs:  # a float column even where no record measured one (all None)
        runs["epoch_s"] = pd.to_numeric(runs["epoch_s"], errors="coerce")
    return (
        runs,
        pd.DataFrame(problems, columns=["run_id", "status", "reason"]),
        pd.DataFrame(excluded, columns=["run_id", "label", "study", "status"]),
    )


def _load_one(d: Path, select: dict | None) -> tuple[str, dict]:
    """One record directory: ("row", its analysis row), ("problem", why it is not used) or ("excluded", ...)."""
    rec = read_run(d)
    check_side_files(d)
    cfg, summ = rec["config"], rec["summary"]
    if cfg is None or summ is None:
        return "problem", {"run_id": d.name, "status": "incomplete", "reason": "config.json or summary.json missing"}
    params = cfg["params"]
    if not selected(params, cfg.get("lab") or {}, select):
        return "excluded", {
            "run_id": d.name,
            "label": params.get("label", ""),
            "study": (cfg.get("lab") or {}).get("lab_study_id", ""),
            "status": summ.get("status"),
        }
    if summ.get("status") != "complete":
        return "problem", {"run_id": d.name, "status": summ.get("status"), "reason": summ.get("error") or ""}
    if not summ.get("samples_per_s"):
        return "problem", {
            "run_id": d.name,
            "status": "no timed steps",
            "reason": "every step was a warm-up step; lower timing_warmup_steps or run longer",
        }
    if cfg.get("schema_version", 1) < 2:
        return "problem", {
            "run_id": d.name,
            "status": "old schema",
            "reason": "schema 1 headline is a ratio of sums, not a median; rerun the point",
        }
    return "row", run_row(d, cfg, summ, rec["metrics"])


def nsight_summary(d: Path, folder: str) -> dict:
    """<run>/nsys/summary.json or <run>/ncu/summary.json (kernels/profiling/nsight.py, ncu.py), {} where the run
    has none."""
    from kernels.records.schema import read_json

    path = d / folder / "summary.json"
    return read_json(path) if path.is_file() else {}


def run_row(d: Path, cfg: dict, summ: dict, metrics) -> dict:
    """One complete record as a row of the analysis table (load_runs)."""
    params, lab = cfg["params"], cfg.get("lab") or {}
    derived, versions = cfg["derived"], cfg["versions"]
    row = {k: params.get(k) for k in CONFIG_KEYS}
    contention = summ.get("contention") or {}
    row.update(
        {
            "kind": run_kind(params, lab),
            "contended": contention.get("contended"),
            "contention": "; ".join(contention.get("evidence") or []),
            "params": params,
            "lab": lab,
            "study_repeats": int(lab["lab_study_repeats"]) if lab.get("lab_study_repeats") else None,
            "study_point_index": point_index(d.name, lab),
            # the study's global batch, where a GPU count that does not divide it ran a rounded one
            "strong_batch": int(lab["lab_study_batch"]) if lab.get("lab_study_batch") else params["batch"],
        }
    )
    row.update(
        {
            "run_id": d.name,
            "label": params.get("label", ""),
            "gpus": params["gpus"],
            "batch": params["batch"],
            "per_rank_batch": derived["per_rank_batch"],
            "nodes": derived.get("nodes", 1),
            "steps_per_epoch": derived["steps_per_epoch"],
            "epochs": params["epochs"],
            "device": summ["device_name"],
            "torch": versions.get("torch"),
            "cuda": versions.get("cuda"),
            "nccl": versions.get("nccl"),
            "python": versions.get("python"),
            "git": (cfg.get("git") or {}).get("commit"),
            "dirty": (cfg.get("git") or {}).get("dirty"),
            "model_variant": derived.get("model_variant"),
            "backend": derived.get("backend"),
            "device_type": derived.get("device_type"),
            "hosts": len(cfg.get("hosts") or []) or 1,
            "samples_per_s": summ["samples_per_s"],
            "samples_per_s_per_device": summ["samples_per_s_per_device"],
            "samples_per_s_p10": summ.get("samples_per_s_p10"),
            "samples_per_s_p90": summ.get("samples_per_s_p90"),
            "step_ms": summ.get("step_ms_p50"),
            "step_ms_p90": summ.get("step_ms_p90"),
            "epoch_s": summ.get("epoch_s_median"),
            "data_wait_frac": summ.get("data_wait_frac"),
            "mfu": summ.get("mfu"),
            "exposed_comm_ms": summ.get("exposed_comm_ms"),
            "peak_mem_gib": summ.get("peak_mem_gib"),
            "train_flops_per_sample": summ.get("train_flops_per_sample"),
            "final_eval_acc": summ.get("final_eval_acc"),
            "started_utc": summ.get("started_utc"),
            "slurm_job": cfg.get("slurm", {}).get("slurm_job_id"),
            "study": cfg.get("lab", {}).get("lab_study_id"),
            "engine": params.get("engine", "ddp"),
            "grad_param_bytes": summ.get("grad_param_bytes"),
            "exposed_comm_status": summ.get("exposed_comm_status"),
            "bottleneck": (summ.get("bottleneck") or {}).get("verdict"),
            "bottleneck_reason": (summ.get("bottleneck") or {}).get("reason"),
            "comm_frac": ((summ.get("bottleneck") or {}).get("evidence") or {}).get("comm_frac"),
            "comm_source": ((summ.get("bottleneck") or {}).get("evidence") or {}).get("comm_source"),
            "nsys_comm_share": nsight_summary(d, "nsys").get("comm_share_median"),
            "ncu_sm_throughput": nsight_summary(d, "ncu").get("sm_throughput_median"),
            "device_util": ((summ.get("bottleneck") or {}).get("evidence") or {}).get("device_util"),
            "gpu_util_mean_pct": (summ.get("monitor") or {}).get("gpu_util_mean_pct"),
            "cpu_util_mean_pct": (summ.get("monitor") or {}).get("cpu_util_mean_pct"),
            "own_cpu_cores": (summ.get("monitor") or {}).get("own_cpu_cores_mean"),
            "foreign_cpu_cores": (summ.get("monitor") or {}).get("foreign_cpu_cores_mean"),
            "energy_j": (summ.get("monitor") or {}).get("energy_j"),
            "profile": summ.get("profile") if (summ.get("profile") or {}).get("status") == "complete" else None,
            "run_path": str(d),
            **placement(cfg),
        }
    )
    io = summ.get("io") or {}
    ranks = io.get("ranks") or []
    row.update(
        {
            "io_source": io.get("source"),
            "io_cache": io.get("cache"),
            "io_bytes_read": io.get("bytes_read"),
            "io_read_mb_s": io.get("read_mb_s"),
            "io_storage_mb_s": io.get("storage_mb_s"),
            "io_read_ratio": io.get("read_ratio_max_epoch"),
            "io_wait_max": io.get("data_wait_frac_max"),
            "io_wait_min": io.get("data_wait_frac_min"),
            "io_devices": ", ".join(sorted({r.get("device_name") or "" for r in ranks})) or None,
            "io_ranks": ranks,
        }
    )
    row["final_eval"] = {k.removeprefix("final_eval_"): v for k, v in summ.items() if k.startswith("final_eval_")}
    row["workload_info"] = summ.get("workload") or {}
    row["rank_info"] = summ.get("ranks") or []
    row["metrics"] = metrics
    return row


def run_kind(params: dict, lab: dict) -> str:
    """What a run measured: 'train' (01_train or lab train), 'profiled' (a profiler window slows its steps), or the
    notebook that ran it. Only runs of one kind are repeats of each other."""
    if params.get("profile_steps"):
        return "profiled"
    notebook = lab.get("lab_notebook")
    return "train" if notebook in (None, "", "01_train") else notebook


def point_index(run_id: str, lab: dict) -> int | None:
    """A study run's point index (its run id is <study>-pNNN), else None."""
    point = lab.get("lab_study_point") or (run_id.rpartition("-")[2] if lab.get("lab_study_id") else "")
    return int(point[1:]) if point[:1] == "p" and point[1:].isdigit() else None


def system_of(config: dict) -> str:
    """Which machine a record (run or commbench) was measured on: the Slurm cluster's name, else rank 0's host."""
    slurm = config.get("slurm") or {}
    name = slurm.get("SLURM_CLUSTER_NAME") or slurm.get("slurm_cluster_name")
    if name:
        return str(name)
    hosts = config.get("hosts") or [h.get("host") for h in config.get("rank_list") or []]
    return str(hosts[0]) if hosts else ""


def placement(config: dict) -> dict:
    """What the step predictor needs of where a run's ranks sat: its system, ranks on the busiest physical host
    (emulated Slurm nodes can share one), compute threads per rank, and that host's cores."""
    ranks = config.get("ranks") or []
    per_host: dict[str, int] = {}
    for r in ranks:
        per_host[r.get("host")] = per_host.get(r.get("host"), 0) + 1
    threads = [r["threads"] for r in ranks if r.get("threads")]
    return {
        "system": system_of(config),
        "ranks_per_host": max(per_host.values()) if per_host else 1,
        "threads": max(threads) if threads else None,
        "host_cores": (config.get("system") or {}).get("cpu_cores"),
    }


def version_mix(runs: pd.DataFrame) -> dict[str, list]:
    """Fields whose values differ across the runs (software or hardware): the numbers are not comparable as-is."""
    if runs.empty:
        return {}
    return {
        k: sorted(map(str, runs[k].dropna().unique()))
        for k in VERSION_KEYS
        if k in runs and runs[k].dropna().nunique() > 1
    }


def _key(row) -> tuple:
    return tuple(row[k] for k in CONFIG_KEYS)


def scaling(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (series, N): repeats aggregated, speedup and efficiency against the series baseline."""
    cols = [
        "mode",
        "series",
        "dataset",
        "gpus",
        "nodes",
        "batch",
        "per_rank_batch",
        "repeats",
        "samples_per_s",
        "samples_per_s_ci_lo",
        "samples_per_s_ci_hi",
        "ci_level",
        "samples_per_s_min",
        "samples_per_s_max",
        "samples_per_s_per_device",
        "step_s",
        "epoch_s",
        "epoch_projected",
        "speedup",
        "efficiency",
        "final_eval_acc",
        "acc_gap_points",
        "baseline_gpus",
        "reasons",
        "flags",
        "clean",
        "run_ids",
        "superseded",
    ]
    if runs.empty:
        return pd.DataFrame(columns=cols)
    runs = runs.assign(_key=runs.apply(_key, axis=1), epoch_s=runs.get("epoch_s", float("nan")))
    out = []
    for mode, by in (("strong", "strong_batch"), ("weak", "per_rank_batch")):
        for (key, fixed), series in runs.groupby(["_key", by], sort=True):
            if series["gpus"].nunique() < 2:
                continue
            if mode == "weak" and series["batch"].nunique() < 2:
                continue  # fixed per-rank AND fixed global batch: same N only; nothing weak about it
            gone = trust.superseded(series)  # contended repeats of a point that a quiet re-run measured
            dropped = series[gone]
            series = series[~gone]
            agg = (
                series.groupby("gpus")
                .agg(
                    nodes=("nodes", "max"),
                    batch=("batch", "first"),
                    per_rank_batch=("per_rank_batch", "first"),
                    repeats=("run_id", "count"),
                    samples_per_s=("samples_per_s", "median"),
                    samples_per_s_min=("samples_per_s", "min"),
                    samples_per_s_max=("samples_per_s", "max"),
                    final_eval_acc=("final_eval_acc", "median"),
                    steps_per_epoch=("steps_per_epoch", "first"),
                    epoch_s=("epoch_s", "median"),
                )
                .reset_index()
            )
            ci = {n: median_ci(list(g["samples_per_s"])) for n, g in series.groupby("gpus")}
            agg["samples_per_s_ci_lo"] = [ci[n]["ci_lo"] for n in agg["gpus"]]
            agg["samples_per_s_ci_hi"] = [ci[n]["ci_hi"] for n in agg["gpus"]]
            agg["ci_level"] = [ci[n]["ci_level"] for n in agg["gpus"]]
            base = agg.iloc[0]
            n0, x0 = base["gpus"], base["samples_per_s"]
            agg["samples_per_s_per_device"] = agg["samples_per_s"] / agg["gpus"]
            agg["step_s"] = agg["batch"] / agg["samples_per_s"]
            # the records' measured epoch time (median over repeats); a projection from the step time where a
            # record has none, flagged as one
            agg["epoch_projected"] = agg["epoch_s"].isna()
            agg["epoch_s"] = agg["epoch_s"].where(~agg["epoch_projected"], agg["steps_per_epoch"] * agg["step_s"])
            # Both definitions reduce to the per-device throughput ratio: strong, T = epoch time of
            # the same total work; weak, T = step time of the same per-rank work (see module doc).
            agg["speedup"] = agg["samples_per_s"] / x0
            agg["efficiency"] = (agg["samples_per_s"] / agg["gpus"]) / (x0 / n0)
            acc0 = base["final_eval_acc"]
            known = acc0 is not None and not pd.isna(acc0)
            agg["acc_gap_points"] = (agg["final_eval_acc"] - acc0) * 100 if known else None
            agg["mode"], agg["baseline_gpus"] = mode, n0
            agg["series"] = series_name(dict(zip(CONFIG_KEYS, key)), by, fixed)
            agg["dataset"] = dict(zip(CONFIG_KEYS, key))["dataset"]
            agg["run_ids"] = [list(series[series["gpus"] == n]["run_id"]) for n in agg["gpus"]]
            agg["superseded"] = [list(dropped[dropped["gpus"] == n]["run_id"]) for n in agg["gpus"]]
            agg["reasons"] = trust.point_reasons(agg, series)
            agg["flags"] = ["; ".join(t for _, t in why) for why in agg["reasons"]]
            agg["clean"] = agg["flags"] == ""
            out.append(agg[cols])
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=cols)


def main_series(scal: pd.DataFrame, mode: str = "strong", workload: str | None = None) -> pd.DataFrame:
    """The series the documents quote and the criteria judge: of `mode` (and `workload`), the one with the most rank
    counts, then the largest one."""
    s = scal[scal["mode"] == mode] if not scal.empty else scal
    if workload and not s.empty:
        s = s[s["series"].str.startswith(workload + " ")]
    if s.empty:
        return s
    best = max(
        s["series"].unique(),
        key=lambda name: (s[s["series"] == name]["gpus"].nunique(), s[s["series"] == name]["gpus"].max()),
    )
    return s[s["series"] == best].sort_values("gpus")


def series_name(key: dict, by: str, fixed) -> str:
    what = f"B={fixed}" if by in ("batch", "strong_batch") else f"b={fixed}/rank"
    extras = [f"{k}={key[k]}" for k in ("precision", "pipeline") if key.get(k) is not None]
    extras += [f"engine={key['engine']}"] if key.get("engine") not in (None, "ddp") else []
    extras += [f"({key['kind']} runs)"] if key.get("kind") not in (None, "train") else []
    return f"{key['workload']} {key['dataset']} {what} " + " ".join(extras)


def optimisation_gains(runs: pd.DataFrame) -> pd.DataFrame:
    """Before/after throughput of each optimisation at equal everything else (medians over repeats)."""
    cols = ["factor", "before", "after", "gpus", "batch", "samples_per_s_before", "samples_per_s_after", "speedup"]
    rows = []
    if runs.empty:
        return pd.DataFrame(columns=cols)
    for factor, before in FACTORS.items():
        others = [k for k in CONFIG_KEYS if k != factor] + ["gpus", "batch"]
        for _, grp in runs.groupby(others, dropna=False):
            med = grp.groupby(factor)["samples_per_s"].median()
            if before not in med.index or len(med) < 2:
                continue
            for after, x in med.items():
                if after == before:
                    continue
                rows.append(
                    {
                        "factor": factor,
                        "before": before,
                        "after": after,
                        "gpus": grp["gpus"].iloc[0],
                        "batch": grp["batch"].iloc[0],
                        "samples_per_s_before": med[before],
                        "samples_per_s_after": x,
                        "speedup": x / med[before],
                    }
                )
    return pd.DataFrame(rows, columns=cols)


def optimisations_together(runs: pd.DataFrame) -> pd.DataFrame:
    """The best configuration over the one with every optimisation off (FACTORS at their "before" values), at equal
    everything else, ranks and batch (medians over repeats). One row per group where both exist."""
    cols = ["after", "gpus", "batch", "samples_per_s_before", "samples_per_s_after", "speedup"]
    if runs.empty:
        return pd.DataFrame(columns=cols)
    factors = list(FACTORS)
    others = [k for k in CONFIG_KEYS if k not in FACTORS] + ["gpus", "batch"]
    rows = []
    for _, grp in runs.groupby(others, dropna=False):
        med = grp.groupby(factors, dropna=False)["samples_per_s"].median()
        off = tuple(FACTORS.values())
        if off not in med.index or len(med) < 2:
            continue
        best = med.idxmax()
        if best == off:
            best = med.drop(off).idxmax()
        changed = ", ".join(f"{k}={v}" for k, v, b in zip(factors, best, off) if v != b)
        rows.append(
            {
                "after": changed,
                "gpus": grp["gpus"].iloc[0],
                "batch": grp["batch"].iloc[0],
                "samples_per_s_before": med[off],
                "samples_per_s_after": med[best],
                "speedup": med[best] / med[off],
            }
        )
    return pd.DataFrame(rows, columns=cols)


def node_hours(
    plan: dict, epoch_s_by_gpus: dict[int, float], predicted: dict[int, tuple[float, str]] | None = None
) -> tuple[pd.DataFrame, float]:
    """Node-hours of the planned runs (plan["points"]: gpus and epochs of every run of the study files) from
    the measured time per epoch.

    For each planned N: T(N) = measured time per epoch at N when measured, else the step predictor's T(N)
    where `predicted` has it ({N: (seconds, source)}), else T(N0) * N0 / (N * E_assumed) from the largest
    measured N0 < N, or, below every measured N, the upper bound T(N0) * N0 / N from the smallest one.
    Node-hours at N = nodes(N) * T(N) / 3600 * the sum of the epochs of the runs at N; the total adds
    profiling_overhead (a fraction) on top.
    """
    gpn = int(plan["gpus_per_node"])
    eff = float(plan["assumed_efficiency"])
    measured = {int(k): float(v) for k, v in epoch_s_by_gpus.items() if v}
    if not measured:
        raise ValueError("no measured time per epoch: no complete run records to base the request on")
    rows = []
    for n, runs in plan["points"].groupby("gpus"):
        n = int(n)
        if n in measured:
            t, source = measured[n], "measured"
        elif predicted and n in predicted:
            t, source = predicted[n]
        elif any(m < n for m in measured):
            n0 = max(m for m in measured if m < n)
            t, source = measured[n0] * n0 / (n * eff), f"from N={n0} at E={eff:g}"
        else:  # below every measured N: n0 ranks at efficiency <= 1 bound one rank's time from above
            n0 = min(measured)
            t, source = measured[n0] * n0 / n, f"from N={n0}, upper bound"
        nodes = math.ceil(n / gpn)
        hours = nodes * t / 3600 * int(runs["epochs"].sum())
        rows.append(
            {
                "gpus": n,
                "nodes": nodes,
                "runs": len(runs),
                "epochs": int(runs["epochs"].sum()),
                "epoch_s": t,
                "source": source,
                "node_hours": hours,
            }
        )
    table = pd.DataFrame(rows)
    total = table["node_hours"].sum() * (1 + float(plan["profiling_overhead"]))
    return table, total


IO_GROUP = ("dataset", "pipeline", "io_cache", "gpus", "nodes", "per_rank_batch")


# a source that reads nothing per step: windows of one series held on the device (kernels/data/series.py's kind)
RESIDENT_SERIES = "index-batched series"


def io_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The I/O study: one row per (data set, pipeline, cache, ranks, nodes, per-rank batch), medians over repeats.

    samples_per_s: headline throughput; read_mb_s: aggregate delivered read bandwidth
    (bytes read / training time); storage_mb_s: what the reads themselves achieved; wait_max:
    the slowest rank's data-wait share (it bounds a DDP step); wait_spread: that minus the
    fastest rank's; devices: the device names of the ranks (mixed node types show here).
    """
    cols = [
        *IO_GROUP,
        "repeats",
        "samples_per_s",
        "read_mb_s",
        "storage_mb_s",
        "read_ratio",
        "wait_max",
        "wait_spread",
        "devices",
    ]
    if runs.empty or "io_source" not in runs:
        return pd.DataFrame(columns=cols)
    r = runs[runs["io_source"].notna() & (runs["io_source"] != RESIDENT_SERIES)].copy()
    r = r[r["kind"] == "train"] if "kind" in r else r  # a profiled run is no repeat of a training point
    if r.empty:
        return pd.DataFrame(columns=cols)
    r["io_cache"] = r["io_cache"].fillna("memory")
    r["wait_spread"] = r["io_wait_max"] - r["io_wait_min"]
    rows = []
    for key, g in r.groupby(list(IO_GROUP), dropna=False, sort=True):
        med = lambda c: float(g[c].median()) if g[c].notna().any() else None  # noqa: E731
        rows.append(
            {
                **dict(zip(IO_GROUP, key)),
                "repeats": len(g),
                "samples_per_s": med("samples_per_s"),
                "read_mb_s": med("io_read_mb_s"),
                "storage_mb_s": med("io_storage_mb_s"),
                "read_ratio": med("io_read_ratio"),
                "wait_max": med("io_wait_max"),
                "wait_spread": med("wait_spread"),
                "devices": "; ".join(sorted(set(g["io_devices"].dropna()))),
            }
        )
    by = ["dataset", "pipeline", "io_cache", "gpus"]
    return pd.DataFrame(rows, columns=cols).sort_values(by).reset_index(drop=True)
