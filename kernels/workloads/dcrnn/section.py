"""DCRNN's section of the paper: per-horizon errors against the references and the historical average, scaling of data
and graph parallelism (throughput, efficiency, accuracy gap, memory, halo traffic), and the pipeline benchmark."""

from __future__ import annotations

import pandas as pd

from kernels.analysis import benchmarks
from kernels.analysis.figures import figure_snippet, finish_rank_plot, hardware_line, log_value_axis, rank_axis, style
from kernels.analysis.tex import booktabs, gap_note, listing, num, pct, tex_escape
from kernels.workloads.dcrnn import LABELS, REFERENCE_MAE
from kernels.workloads.dcrnn.scaling_table import NAME, table

TARGET_EFFICIENCY = 0.80  # the plan's level (brief 000, line 9), drawn as a guide; judged from 1 to 8 nodes only
H = LABELS
METRIC_COLUMNS = {
    "model": ("Model", "s"),
    "ranks": ("Ranks", "raw"),
    **{f"mae_{h}": (f"MAE {h[:-3]}", ".2f") for h in H},
    **{f"rmse_{h}": (f"RMSE {h[:-3]}", ".2f") for h in H},
    **{f"mape_pct_{h}": (f"MAPE {h[:-3]}", ".1f") for h in H},
}
SCALING_COLUMNS = {
    "series": ("Series", "s"),
    "gpus": ("Ranks", "d"),
    "nodes": ("Nodes", "d"),
    "repeats": ("Rep.", "d"),
    "samples_per_s": ("Samples/s", ",.4g"),
    "epoch_s": ("Epoch s", ",.4g"),
    "efficiency": ("Eff.", ".2f"),
    "mae_gap_pct": ("MAE gap (\\%)", "+.2f"),
    "peak_mem_gib": ("Mem GiB/rank", ".2f"),
    "halo_mb_per_step": ("Halo MB/step", ".3g"),
    "edge_cut": ("Cut", "d"),
}


def metric_rows(t: pd.DataFrame) -> pd.DataFrame:
    """Per data set: the lab's baseline and largest run of each series, the historical average, the references."""
    rows = []
    for ds, g in t.groupby("dataset", sort=True):
        name = "synthetic" if ds == "synthetic" else ds.upper()
        for _, s in g.groupby("series", sort=True):
            s = s.sort_values("gpus")
            for _, p in (s.iloc[[0, -1]] if len(s) > 1 else s.iloc[[0]]).iterrows():
                rows.append(
                    {
                        "model": f"DCRNN, {p['series']}",
                        "ranks": str(p["gpus"]),
                        **{f"{m}_{h}": p[f"{m}_{h}"] for m in ("mae", "rmse") for h in H},
                        **{f"mape_pct_{h}": 100 * p[f"mape_{h}"] if p[f"mape_{h}"] is not None else None for h in H},
                    }
                )
        ha = g.iloc[0]
        rows.append(
            {
                "model": f"historical average, {name}",
                "ranks": "",
                **{f"{m}_{h}": ha[f"ha_{m}_{h}"] for m in ("mae", "rmse") for h in H},
                **{f"mape_pct_{h}": 100 * ha[f"ha_mape_{h}"] if ha[f"ha_mape_{h}"] is not None else None for h in H},
            }
        )
        for src, maes in REFERENCE_MAE.get(ds, {}).items():
            who = "Li et al. (2018), Table 2" if src == "paper" else "original code, README after its 2018 fix"
            rows.append({"model": f"{who}, {name}", "ranks": "", **{f"mae_{h}": v for h, v in zip(H, maes)}})
    return pd.DataFrame(rows, columns=list(METRIC_COLUMNS))


def figures(ctx, t: pd.DataFrame) -> bool:
    import matplotlib.pyplot as plt

    multi = t.groupby("series").filter(lambda g: g["gpus"].nunique() > 1)
    if multi.empty:
        return False
    style()
    ranks = sorted(multi["gpus"].unique())
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(5.3, 2.6), gridspec_kw={"wspace": 0.35})
    for name, g in multi.groupby("series", sort=True):
        g = g.sort_values("gpus")
        ax.plot(g["gpus"], g["samples_per_s"], marker="o", label=name)
        bx.plot(g["gpus"], 100 * g["efficiency"], marker="o", label=name)
    log_value_axis(ax, multi["samples_per_s"], "samples/s")
    bx.axhline(100 * TARGET_EFFICIENCY, color="grey", linestyle=":", linewidth=0.8)
    bx.set_ylabel("strong-scaling efficiency (%)")
    bx.set_ylim(bottom=0)
    rank_axis(ax, ranks)
    ax.set_title("DCRNN: throughput")
    ax.legend()
    finish_rank_plot(
        fig,
        bx,
        ranks,
        f"DCRNN: efficiency (dotted: the plan's 80 %)\n{hardware_line(ctx.runs[ctx.runs['workload'] == NAME])}",
        ctx.out,
        "dcrnn_scaling",
    )
    plt.close(fig)
    return True


def bench_text(benches: list[dict], others: list[dict], hardware: str) -> str:
    """The pipeline benchmark's sentence from the records measured on this build's hardware; a gap naming where
    the others were measured when none was measured here."""
    if not benches:
        where = (
            f" (the recorded one{'s' if len(others) > 1 else ''} ran on {benchmarks.elsewhere(others)}, not "
            f"on this build's hardware)"
            if others
            else ""
        )
        return gap_note(
            f"no DCRNN pipeline benchmark on {hardware}{where}: run python benchmarks/bench_dcrnn.py (make bench) there"
        )
    parts = []
    for b in benches:
        r = b["rows"]
        pub, lab = r["public"], r["lab"]
        parts.append(
            f"on {tex_escape(b['device'])} ({b['cores']} cores, torch "
            f"{tex_escape(b['versions'].get('torch'))}) "
            f"the lab's workload trains a {b['layers']}$\\times${b['units']}-unit model on the "
            f"{b['sensors']}-sensor set at {num(lab['step_ms'])}\\,ms per step (median of {b['steps']}) "
            f"against {num(pub['step_ms'])}\\,ms for the public pipeline's mechanics, "
            f"{lab['speedup']:.2f}$\\times$ faster, an epoch of {num(lab['epoch_s'])}\\,s instead of "
            f"{num(pub['epoch_s'])}\\,s, holding {num(lab['data_bytes'] / 1e6)}\\,MB of data instead of "
            f"{num(pub['data_bytes'] / 1e6)}\\,MB"
        )
    return (
        "Benchmark (\\texttt{benchmarks/bench\\_dcrnn.py}; both models loaded with the same weights forecast the "
        "same batch within $10^{-5}$\\,mph): " + listing(parts) + ". The target of the seed study, at least "
        "3$\\times$, is a GPU target: there the public pipeline also pays a host-to-device copy and hundreds "
        "of small kernel launches per step.\n"
    )


def text(t: pd.DataFrame) -> str:
    if t.empty:
        return gap_note(
            "no DCRNN records are selected: run the DCRNN studies (studies/dcrnn_strong.yaml, "
            "studies/dcrnn_graph.yaml) or a run with workload=dcrnn, and select them in paper/plan.yaml"
        )
    parts = []
    for ds, g in t.groupby("dataset", sort=True):
        best = g.loc[g["mae_60min"].astype(float).idxmin()] if g["mae_60min"].notna().any() else g.iloc[0]
        hs = [h for h in H if best[f"mae_{h}"] is not None]  # a model forecasting 6 steps has no 60-min MAE
        s = (
            f"on {tex_escape(best['series'].split(',')[0])} the masked MAE at "
            f"{listing([h.removesuffix('min') for h in hs])} minutes is "
            + ", ".join(num(best[f"mae_{h}"]) for h in hs)
            + "\\,mph"
        )
        if hs and all(best[f"ha_mae_{h}"] is not None for h in hs):
            s += (
                " against "
                + ", ".join(num(best[f"ha_mae_{h}"]) for h in hs)
                + " for the historical average on the same test windows"
            )
        parts.append(s)
    out = "In the selected records, " + listing(parts) + ". "
    multi = t.groupby("series").filter(lambda g: g["gpus"].nunique() > 1)
    for name, g in multi.groupby("series", sort=True):
        g = g.sort_values("gpus")
        top = g.iloc[-1]
        if top["efficiency"] is None or pd.isna(top["efficiency"]):
            continue
        out += (
            f"For {tex_escape(name)}, {int(top['gpus'])} ranks reach {pct(top['efficiency'])} strong-scaling "
            f"efficiency against {int(top['baseline_gpus'])}"
        )
        gaps = g["mae_gap_pct"].dropna()
        if len(gaps) > 1:
            worst = gaps.loc[gaps.abs().idxmax()]
            out += (
                f", and the largest change of the MAE at any horizon against {int(top['baseline_gpus'])} "
                f"rank{'s' if top['baseline_gpus'] > 1 else ''} is {worst:+.2f}\\,\\%"
            )
        if top["halo_mb_per_step"] is not None and not pd.isna(top["halo_mb_per_step"]):
            out += (
                f"; each rank exchanges up to {num(top['halo_mb_per_step'])}\\,MB of halo rows per step "
                f"(edge cut {int(top['edge_cut'])})"
            )
        out += ". "
    if multi.empty:
        out += "No series has more than one rank count yet, so no scaling is reported. "
    return out + "\n"


def write(ctx) -> None:
    """The section's files from the report's context (kernels/report/context.py): tables, figure, text."""
    t = table(ctx.runs)
    ctx.results[NAME] = t
    made = figures(ctx, t) if not t.empty else False
    ctx.put(
        "fig_dcrnn_scaling.tex",
        figure_snippet("dcrnn_scaling", made, "no DCRNN series with more than one rank count is selected"),
    )
    why = "no DCRNN records are selected"
    ctx.put(
        "dcrnn_metrics_table.tex",
        booktabs(metric_rows(t), METRIC_COLUMNS, size="\\scriptsize") if not t.empty else gap_note(why),
    )
    ctx.put(
        "dcrnn_scaling_table.tex", booktabs(t, SCALING_COLUMNS, size="\\scriptsize") if not t.empty else gap_note(why)
    )
    ctx.put("dcrnn_text.tex", text(t))
    here, others = benchmarks.on_hardware(benchmarks.load("dcrnn", [ctx.out / "bench"]), ctx.hardware)
    ctx.put("dcrnn_bench.tex", bench_text(here, others, ", ".join(sorted(ctx.hardware)) or "the selected hardware"))
