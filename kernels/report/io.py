"""The I/O section: read bandwidth, samples/s and data wait against ranks, MNIST vs bigMNIST, per-rank spread."""

from __future__ import annotations

import pandas as pd

from kernels.analysis import runs as analysis
from kernels.data import DATASETS
from kernels.report.context import Context
from kernels.analysis.figures import (
    figure_snippet,
    finish_rank_plot,
    hardware_line,
    log_value_axis,
    save_figure,
    style,
    wrapped,
)
from kernels.report.quantities import DATA_WAIT_SLOWEST
from kernels.analysis.tex import booktabs, gap_note, listing, num, pct, tex_escape

STREAMED = frozenset(name for name, ds in DATASETS.items() if ds.streamed)  # data sets read from storage

TABLE_COLUMNS = {
    "dataset": ("Data", "s"),
    "pipeline": ("Pipeline", "s"),
    "io_cache": ("Cache", "s"),
    "gpus": ("Ranks", "d"),
    "nodes": ("Nodes", "d"),
    "repeats": ("Rep.", "d"),
    "samples_per_s": ("Samples/s", ",.4g"),
    "read_mb_s": ("Read MB/s", ",.3g"),
    "wait_max_s": ("Wait (slowest)", "raw"),
    "wait_spread_s": ("Wait spread", "raw"),
}


def io_runs(ctx: Context) -> pd.DataFrame:
    """The records of the I/O figures: those with an input pipeline that reads (not DCRNN's resident series)."""
    return ctx.runs[ctx.runs["io_source"].notna() & (ctx.runs["io_source"] != analysis.RESIDENT_SERIES)]


def _series(t: pd.DataFrame):
    """(name, rows) per series: a data set, pipeline and cache mode, then the batch held fixed across its rank
    counts: the global batch B where the runs kept it (strong scaling, as make demo's), else the per-rank b (the
    I/O studies scale weakly). One strong series is not split into one-point series by its per-rank batch."""
    for (ds, pipe, cache), g in t.groupby(["dataset", "pipeline", "io_cache"], sort=True, dropna=False):
        name = f"{ds}, {pipe}" + (f" ({cache})" if cache not in ("memory", None) else "")
        whole = g["per_rank_batch"] * g["gpus"]
        fixed, letter = (whole, "B") if whole.nunique() < g["per_rank_batch"].nunique() else (g["per_rank_batch"], "b")
        for b, h in g.groupby(fixed, sort=True):
            yield f"{name}, {letter}={int(b)}", h


def figures(ctx: Context, t: pd.DataFrame) -> set[str]:
    import matplotlib.pyplot as plt

    made = set()
    if t.empty:
        return made
    style()
    ranks = sorted(t["gpus"].unique())
    hw = hardware_line(io_runs(ctx))
    fig, ax = plt.subplots(figsize=(3.4, 2.5))
    for name, g in _series(t):
        ax.plot(g["gpus"], g["samples_per_s"], marker="o", label=name)
    log_value_axis(ax, t["samples_per_s"].dropna(), "samples/s")
    finish_rank_plot(fig, ax, ranks, f"Throughput by input pipeline\n{hw}", ctx.out, "io_samples")
    made.add("io_samples")
    streamed = t[t["read_mb_s"].notna()]
    if not streamed.empty:
        fig, ax = plt.subplots(figsize=(3.4, 2.5))
        for name, g in _series(streamed):
            ax.plot(g["gpus"], g["read_mb_s"], marker="o", label=f"{name}: delivered")
            if g["storage_mb_s"].notna().any():
                ax.plot(g["gpus"], g["storage_mb_s"], marker="x", linestyle=":", label=f"{name}: inside reads")
        log_value_axis(ax, pd.concat([streamed["read_mb_s"], streamed["storage_mb_s"]]).dropna(), "MB/s")
        finish_rank_plot(fig, ax, ranks, f"Aggregate read bandwidth\n{hw}", ctx.out, "io_bandwidth")
        made.add("io_bandwidth")
    fig, ax = plt.subplots(figsize=(3.4, 2.5))
    for name, g in _series(t):
        ax.plot(g["gpus"], 100 * g["wait_max"], marker="o", label=name)
    ax.set_ylabel("slowest rank's data wait (%)")
    ax.set_ylim(0, 1.15 * max(100 * t["wait_max"].max(), 0.1))  # the highest point inside the frame
    finish_rank_plot(fig, ax, ranks, f"Share of the step waiting for data\n{hw}", ctx.out, "io_wait")
    made.add("io_wait")
    # the per-rank spread of the largest streamed run: the slowest rank bounds a DDP step
    runs = io_runs(ctx)
    big = runs.sort_values(["gpus", "run_id"]).iloc[-1] if not runs.empty else None
    if big is not None and big["gpus"] > 1 and big["io_ranks"]:
        per = pd.DataFrame(big["io_ranks"])
        fig, ax = plt.subplots(figsize=(3.4, 2.3))
        devs = sorted(per["device_name"].unique())
        for dev in devs:
            p = per[per["device_name"] == dev]
            ax.bar(p["rank"], 100 * p["data_wait_frac"].fillna(0), label=dev)
        ax.set_xticks(sorted(per["rank"]))
        ax.set_xlabel("rank")
        ax.set_ylabel("data wait (%)")
        ax.set_title(wrapped(f"Per-rank data wait, {big['run_id']}"))
        ax.legend()
        save_figure(fig, ctx.out, "io_ranks")
        plt.close(fig)
        made.add("io_ranks")
    return made


def io_text(t: pd.DataFrame) -> str:
    if t.empty:
        return gap_note(
            "no records with I/O figures are selected: run the I/O study (studies/io_mnist.yaml, "
            "studies/io_bigmnist.yaml) and select it in paper/plan.yaml"
        )
    parts = []
    for name, g in _series(t):
        lo, hi = g.iloc[0], g.iloc[-1]
        s = (
            f"{tex_escape(name)} delivers {num(lo['samples_per_s'])} samples/s on {int(lo['gpus'])} "
            f"rank{'s' if lo['gpus'] > 1 else ''}"
        )
        if hi["gpus"] != lo["gpus"]:
            s += f" and {num(hi['samples_per_s'])} on {int(hi['gpus'])}"
        if hi["read_mb_s"] is not None and not pd.isna(hi["read_mb_s"]):
            s += f", reading {num(hi['read_mb_s'])}\\,MB/s in aggregate"
        if hi["wait_max"] is not None and not pd.isna(hi["wait_max"]):
            s += f", with a {DATA_WAIT_SLOWEST} of {pct(hi['wait_max'], 1)}"
        parts.append(s)
    text = "In the selected records, " + listing(parts) + ". "
    ratio = t["read_ratio"].dropna()
    if len(ratio):
        text += (
            f"The streamed source read at most {ratio.max():.2f} times the data set's bytes in any epoch "
            f"(its own counters; 1 is each byte once). "
        )
    mixed = t[t["devices"].str.contains(",")]  # a run's ranks on more than one device type
    if not mixed.empty:
        text += (
            "Some points mix device types (" + tex_escape(mixed["devices"].iloc[0]) + "): the slowest rank "
            "bounds every step, so \\inappendix{Fig.}{fig:iowait} shows the per-rank data wait. "
        )
    return text + "\n"


def compare_sentence(t: pd.DataFrame) -> str:
    """What the I/O table and figures compare: in-memory and streamed records side by side where both exist; where
    one kind is missing, a gap saying which (the paper lists it under "Not yet measured")."""
    streamed = t["dataset"].isin(STREAMED)
    if streamed.any() and not streamed.all():
        return (
            "Table~\\ref{tab:io} and \\inappendix{Fig.}{fig:io} compare data sets held in memory with data "
            "streamed from storage.\n"
        )
    have = (
        "no records with I/O figures"
        if t.empty
        else "only streamed records"
        if streamed.all()
        else "only records of data held in memory"
    )
    return gap_note(
        f"the comparison of MNIST held in memory with bigMNIST streamed from storage: the selection has "
        f"{have}; run studies/io_mnist.yaml and studies/io_bigmnist.yaml and select both"
    )


def section(ctx: Context) -> None:
    t = analysis.io_table(ctx.runs)
    ctx.results["io"] = t
    made = figures(ctx, t)
    why = "no records with I/O figures are selected"
    ctx.put("fig_io_samples.tex", figure_snippet("io_samples", "io_samples" in made, why))
    ctx.put(
        "fig_io_bandwidth.tex",
        figure_snippet("io_bandwidth", "io_bandwidth" in made, "no streamed (bigMNIST) records are selected"),
    )
    ctx.put("fig_io_wait.tex", figure_snippet("io_wait", "io_wait" in made, why))
    ctx.put(
        "fig_io_ranks.tex",
        figure_snippet("io_ranks", "io_ranks" in made, "no multi-rank record with I/O figures is selected"),
    )
    shown = t.assign(
        wait_max_s=[pct(v, 1) if not pd.isna(v) else None for v in t["wait_max"]],
        wait_spread_s=[pct(v, 1) if not pd.isna(v) else None for v in t["wait_spread"]],
    )
    ctx.put("io_table.tex", booktabs(shown, TABLE_COLUMNS, size="\\small") if not t.empty else gap_note(why))
    ctx.put("io_text.tex", io_text(t))
    ctx.put("io_compare.tex", compare_sentence(t))
