"""The scaling section: throughput, speedup, efficiency, accuracy and optimisation gains.

Writes figures (throughput, efficiency, epoch_time, accuracy, gains), tables
(scaling_table, scaling_table_compact) and the sentences and paragraphs that
quote their numbers (abstract_results, results_text, optim_section,
slide_results). A sentence is written only when its numbers exist; otherwise
the document gets a framed gap that says what is missing.
"""

from __future__ import annotations

import pandas as pd

from kernels.analysis import runs as analysis, trust
from kernels.analysis.runs import main_series
from kernels.report.context import Context
from kernels.analysis.figures import (
    FONT_PT,
    figure_snippet,
    finish_rank_plot,
    hardware_line,
    log_value_axis,
    rank_axis,
    save_figure,
    style,
    wrapped,
)
from kernels.analysis.tex import booktabs, gap_note, listing, missing, num, pct, tex_escape

TARGET_E8 = 0.70  # the seeds' target: 70% strong-scaling efficiency at 8 GPUs
TARGET_E = 0.80  # and 80% as the general line
TARGET_ACC_GAP = 2.0  # final accuracy within 2 points of the 1-GPU baseline

NO_SERIES = (
    "no scaling series yet: a series needs complete runs of one configuration at two or more rank "
    "counts (make demo gives 1 and 2 CPU processes)"
)

SCALING_COLUMNS = {
    "mode": ("Mode", "s"),
    "gpus": ("$N$", "d"),
    "nodes": ("Nodes", "d"),
    "batch": ("$B$", "d"),
    "repeats": ("Rep.", "d"),
    "samples_per_s": ("Samples/s", ",.1f"),
    "ci": ("Interval", "raw"),
    "samples_per_s_per_device": ("per rank", ",.1f"),
    "epoch_cell": ("Epoch (s)", "raw"),
    "speedup": ("Speedup", ".2f"),
    "efficiency": ("Eff.", ".2f"),
    "acc_gap_points": ("Acc. gap (pt)", "+.2f"),
    "mark": ("", "raw"),
}
COMPACT_COLUMNS = {
    "mode": ("Mode", "s"),
    "gpus": ("$N$", "d"),
    "batch": ("$B$", "d"),
    "repeats": ("Rep.", "d"),
    "samples_per_s": ("Samples/s", ",.0f"),
    "ci": ("Interval", "raw"),
    "speedup": ("Speedup", ".2f"),
    "efficiency": ("Eff.", ".2f"),
    "mark": ("", "raw"),
}
GAINS_COLUMNS = {
    "factor": ("Optimisation", "s"),
    "before": ("Before", "s"),
    "after": ("After", "s"),
    "gpus": ("$N$", "d"),
    "samples_per_s_before": ("Samples/s before", ",.1f"),
    "samples_per_s_after": ("after", ",.1f"),
    "speedup": ("Speedup", ".2f"),
}
FACTOR_WORDS = {
    "precision": "{after} over {before}",
    "pipeline": "the {after} input pipeline over the {before} one",
    "bucket_cap_mb": "DDP buckets of {after} MiB over {before} MiB",
    "channels_last": "channels-last over the default layout",
    "compile": "torch.compile over eager",
}


def _epoch(row) -> str:
    """An epoch time as the text quotes it: the records' measured median, or a projection that says so."""
    if row.get("epoch_projected"):
        return f"about {num(row['epoch_s'])}\\,s (projected from the median step time; the records measured none)"
    return f"{num(row['epoch_s'])}\\,s"


def _epoch_cell(row) -> str:
    mark = "$^\\ast$" if row.get("epoch_projected") else ""
    return f"{row['epoch_s']:.2f}{mark}"


def _interval(row) -> str:
    if missing(row["samples_per_s_ci_lo"]):
        return "--"
    lo, hi = (f"{v:,.0f}".replace(",", "{,}") for v in (row["samples_per_s_ci_lo"], row["samples_per_s_ci_hi"]))
    return f"{lo}--{hi} ({100 * row['ci_level']:.0f}\\,\\%)"


RERUN_COLUMNS = {
    "series": ("Series", "s"),
    "gpus": ("$N$", "d"),
    "reasons": ("Set aside because", "s"),
    "command": ("Re-run with", "raw"),
}
SET_ASIDE_MARK = "$\\dagger$"


def clean(scal: pd.DataFrame) -> pd.DataFrame:
    """The points that may be quoted: none of trust.py's reasons to set them aside."""
    return scal[scal["clean"]] if not scal.empty else scal


def _reason_counts(out: pd.DataFrame) -> dict[str, int]:
    """Set-aside points per reason, in words (trust.REASON_WORDS), in the order they first appear."""
    kinds: dict[str, int] = {}
    for reasons in out["reasons"]:
        for kind, _ in reasons:
            kinds[trust.REASON_WORDS[kind]] = kinds.get(trust.REASON_WORDS[kind], 0) + 1
    return kinds


def set_aside_note(scal: pd.DataFrame, in_paper: bool = True) -> str:
    """'k of n points were set aside (reasons)': what the headline sentences left out, and why ('' when none).
    in_paper: point to the re-run table by its reference (the paper holds it), else by name."""
    if scal.empty or scal["clean"].all():
        return ""
    out = scal[~scal["clean"]]
    kinds = _reason_counts(out)
    why = listing([f"{tex_escape(k)} ({'all' if v == len(out) > 1 else v})" for k, v in kinds.items()])
    several = " (a point may have more than one reason)" if sum(kinds.values()) > len(out) else ""
    return (
        f"{len(out)} of {len(scal)} scaling point{'s' if len(scal) > 1 else ''} "
        f"{'were' if len(out) > 1 else 'was'} set aside and not quoted{several}: {why}; "
        + (
            "Table~\\ref{tab:rerun} lists them with the commands that re-run them."
            if in_paper
            else "the paper's table of results to re-run lists them with the commands that re-run them."
        )
    )


ASIDE_STYLE = {"ls": "none", "marker": "o", "mfc": "none", "color": "0.55", "ms": 6}
ASIDE_LABEL = "set aside, not quoted"


def plot_points(ax, s: pd.DataFrame, y: pd.Series, label: str | None = None, **kw):
    """A series' clean points as a line with markers; its set-aside points hollow and grey, off the line (one
    legend entry for them, added by aside_legend). Returns the line."""
    ok = s["clean"].astype(bool).to_numpy()
    (line,) = ax.plot(s["gpus"][ok], y[ok], marker="o", label=label, **kw)
    if (~ok).any():
        ax.plot(s["gpus"][~ok], y[~ok], **ASIDE_STYLE)
    return line


def aside_legend(ax, scal: pd.DataFrame) -> None:
    if not scal["clean"].astype(bool).all():
        ax.plot([], [], label=ASIDE_LABEL, **ASIDE_STYLE)


def efficiency_top(scal: pd.DataFrame) -> float:
    """The efficiency axis holds every plotted point: 110 %, or more where a (set-aside) point is above it."""
    return max(110.0, 105.0 * float(scal["efficiency"].max()))


def superseded_note(points: pd.DataFrame) -> str:
    """Which contended runs the quoted points leave out because a quiet re-run measured them ('' when none)."""
    gone = [(int(p["gpus"]), r) for _, p in points.iterrows() for r in (p.get("superseded") or [])]
    if not gone:
        return ""
    runs = listing([f"{tex_escape(r)} ({n} rank{'s' if n > 1 else ''})" for n, r in gone])
    if len(gone) == 1:
        return (
            f"The run {runs} shared its cores with other work and is left out: a quiet re-run of the same "
            f"configuration measured its point. "
        )
    return (
        f"The runs {runs} shared their cores with other work and are left out: quiet re-runs of the same "
        f"configurations measured their points. "
    )


def set_aside_brief(scal: pd.DataFrame) -> str:
    """The set-aside note in a slide's few words: 'k of n points set aside (reasons)'."""
    out = scal[~scal["clean"]]
    kinds = list(_reason_counts(out))
    return (
        f"{len(out)} of {len(scal)} point{'s' if len(scal) > 1 else ''} set aside "
        f"({tex_escape(', '.join(kinds[:2]) + (', ...' if len(kinds) > 2 else ''))}); the paper lists the re-runs"
    )


# The pitch's scaling figure, drawn at the width it is shown (0.74 of a 16:9 Beamer slide's text width) with 9 pt
# text: 19 pt on the 13.33 in slide a projector shows, where the paper's column figures would print at 8.5 pt.
SLIDE_FIGURE_IN = (4.08, 2.25)
SLIDE_FONT_PT = 9


def slide_figure(ctx: Context, scal: pd.DataFrame) -> str:
    """Throughput and efficiency side by side for the pitch, with short labels (the series' workload, data and
    batch) and no title: the slide's heading and bullets name the hardware."""
    import matplotlib.pyplot as plt

    sizes = {k: SLIDE_FONT_PT for k in FONT_PT}
    with plt.rc_context(sizes):
        fig, (ax, bx) = plt.subplots(1, 2, figsize=SLIDE_FIGURE_IN, gridspec_kw={"wspace": 0.45})
        ys = []
        for (mode, series), s in scal.groupby(["mode", "series"]):
            short = f"{mode}: {series.split(' precision=')[0]}"
            line = plot_points(ax, s, s["samples_per_s"], label=short)
            ideal = s["samples_per_s"].iloc[0] * s["gpus"] / s["gpus"].iloc[0]
            ax.plot(s["gpus"], ideal, ls="--", color="grey", lw=1)
            plot_points(bx, s, 100 * s["efficiency"], color=line.get_color())
            ys += list(s["samples_per_s"]) + list(ideal)
        ax.plot([], [], ls="--", color="grey", label="ideal")
        aside_legend(ax, scal)
        log_value_axis(ax, ys, "samples/s")
        bx.axhline(100 * TARGET_E, ls="--", color="tab:red", lw=1, label=f"{100 * TARGET_E:.0f}% target")
        bx.set(ylabel="efficiency (%)", ylim=(0, efficiency_top(scal)))
        for a in (ax, bx):
            rank_axis(a, scal["gpus"])
            a.set_xlabel("ranks")
        handles = ax.get_legend_handles_labels()[0] + bx.get_legend_handles_labels()[0]
        labels = ax.get_legend_handles_labels()[1] + bx.get_legend_handles_labels()[1]
        fig.subplots_adjust(bottom=0.45, top=0.97)
        fig.legend(
            handles,
            [wrapped(t, 34) for t in labels],
            loc="lower center",
            ncol=2,
            frameon=False,
            bbox_to_anchor=(0.5, 0.0),
            handlelength=1.5,
            columnspacing=1.0,
        )
        save_figure(fig, ctx.out, "slide_scaling")
    return "slide_scaling"


def figures(ctx: Context, scal: pd.DataFrame, gains: pd.DataFrame) -> set[str]:
    import matplotlib.pyplot as plt

    style()
    runs, out, made = ctx.runs, ctx.out, set()
    if not scal.empty:
        hw = hardware_line(runs)
        fig, ax = plt.subplots(figsize=(3.5, 2.6))
        ys = []
        for (mode, series), s in scal.groupby(["mode", "series"]):
            plot_points(ax, s, s["samples_per_s"], label=f"{mode}: {series}")
            lo = s["samples_per_s_ci_lo"].astype(float).fillna(s["samples_per_s"])
            hi = s["samples_per_s_ci_hi"].astype(float).fillna(s["samples_per_s"])
            ax.fill_between(s["gpus"], lo, hi, alpha=0.2)
            n0, x0 = s["gpus"].iloc[0], s["samples_per_s"].iloc[0]
            ideal = x0 * s["gpus"] / n0
            ax.plot(s["gpus"], ideal, ls="--", color="grey", lw=1)
            ys += list(lo) + list(hi) + list(ideal)
        ax.plot([], [], ls="--", color="grey", label="ideal (linear)")
        aside_legend(ax, scal)
        log_value_axis(ax, ys, "throughput (samples/s, median)")
        made.add(finish_rank_plot(fig, ax, scal["gpus"], hw, out, "throughput"))

        fig, ax = plt.subplots(figsize=(3.5, 2.6))
        for (mode, series), s in scal.groupby(["mode", "series"]):
            plot_points(ax, s, 100 * s["efficiency"], label=f"{mode}: {series}")
        aside_legend(ax, scal)
        ax.axhline(100 * TARGET_E, ls="--", color="tab:red", lw=1, label=f"{100 * TARGET_E:.0f}% target")
        ax.plot(
            [8],
            [100 * TARGET_E8],
            marker="*",
            ms=10,
            color="tab:red",
            ls="none",
            label=f"{100 * TARGET_E8:.0f}% at 8 GPUs",
        )
        ax.set(ylabel="scaling efficiency (%)", ylim=(0, efficiency_top(scal)))
        made.add(finish_rank_plot(fig, ax, set(scal["gpus"]) | {8}, hw, out, "efficiency"))

        fig, ax = plt.subplots(figsize=(3.5, 2.6))
        for (mode, series), s in scal.groupby(["mode", "series"]):
            plot_points(ax, s, s["epoch_s"], label=f"{mode}: {series}")
        aside_legend(ax, scal)
        log_value_axis(ax, scal["epoch_s"], "time per epoch (s)")
        made.add(finish_rank_plot(fig, ax, scal["gpus"], hw, out, "epoch_time"))

        made.add(slide_figure(ctx, scal))

    with_acc = runs[runs["final_eval_acc"].notna()] if not runs.empty else runs
    if not with_acc.empty:
        fig, (ax, bx) = plt.subplots(1, 2, figsize=(7.0, 2.8), layout="constrained")  # room for the suptitle
        for (gpus, batch), grp in with_acc.groupby(["gpus", "batch"]):
            m = pd.DataFrame(grp.iloc[0]["metrics"])
            if "eval_acc" in m:
                ax.plot(m["epoch"], 100 * m["eval_acc"], marker="o", label=f"N={gpus}, B={batch}")
        ax.set(xlabel="epoch", ylabel="eval accuracy (%)", title="accuracy per configuration")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend()
        strong = scal[(scal["mode"] == "strong") & scal["acc_gap_points"].notna()] if not scal.empty else scal
        if not strong.empty:  # a set-aside point's gap is hollow, as in the scaling figures: not quoted
            ok = strong["clean"].astype(bool).to_numpy()
            xs, gaps = list(range(len(strong))), list(strong["acc_gap_points"])
            bx.bar([x for x, k in zip(xs, ok) if k], [g for g, k in zip(gaps, ok) if k], color="tab:blue")
            if not ok.all():
                bx.bar(
                    [x for x, k in zip(xs, ok) if not k],
                    [g for g, k in zip(gaps, ok) if not k],
                    fill=False,
                    edgecolor=ASIDE_STYLE["color"],
                    label=ASIDE_LABEL,
                )
            bx.set_xticks(range(len(strong)), [f"{r.gpus}" for r in strong.itertuples()])
            bx.axhline(-TARGET_ACC_GAP, ls="--", color="tab:red", lw=1, label=f"±{TARGET_ACC_GAP:g} points target")
            bx.axhline(TARGET_ACC_GAP, ls="--", color="tab:red", lw=1)
            bx.legend()
        bx.set(xlabel="ranks", ylabel="gap to the baseline (points)", title="final-accuracy gap")
        fig.suptitle(wrapped(hardware_line(runs), 90))
        save_figure(fig, out, "accuracy")
        made.add("accuracy")

    if not gains.empty:
        fig, ax = plt.subplots(figsize=(3.1, 2.4))
        labels = [wrapped(f"{r.factor}: {r.before}→{r.after} (N={r.gpus})", 18) for r in gains.itertuples()]
        ax.barh(range(len(gains)), gains["speedup"], color="tab:green")
        ax.set_yticks(range(len(gains)), labels)
        ax.axvline(1.0, color="grey", lw=1)
        ax.set(xlabel="speedup (throughput after / before)")
        ax.set_title(wrapped(hardware_line(runs), 36))
        save_figure(fig, out, "gains")
        made.add("gains")
    return made


def results_text(ctx: Context, scal: pd.DataFrame) -> tuple[str, str, str]:
    """(results paragraph, one abstract sentence, slide bullets) from the main strong series' clean points."""
    note = set_aside_note(scal)
    main = main_series(clean(scal))
    if main.empty or main["gpus"].nunique() < 2:
        if scal.empty:
            return gap_note(NO_SERIES), "", "\\item " + tex_escape(NO_SERIES) + "\n"
        return (
            f"No scaling figure is quoted. {note}\n",
            f"No scaling figure is quoted yet: {note}\n",
            f"\\item No scaling figure quoted yet: {set_aside_brief(scal)}.\n",
        )
    base, top = main.iloc[0], main.iloc[-1]
    n0, n = int(base["gpus"]), int(top["gpus"])
    series = tex_escape(base["series"])
    eff, spd = top["efficiency"], top["speedup"]
    text = (
        f"For the series {series}, at {n0} rank{'s' if n0 > 1 else ''} the workload trains at "
        f"{num(base['samples_per_s'])} samples/s and an epoch takes {_epoch(base)}. "
        f"At {n} ranks on {int(top['nodes'])} node{'s' if top['nodes'] > 1 else ''} it reaches "
        f"{num(top['samples_per_s'])} samples/s, a speedup of {spd:.2f} and a strong-scaling efficiency of "
        f"{pct(eff)} (targets: {pct(TARGET_E8)} at 8 GPUs and {pct(TARGET_E)} "
        f"overall), and an epoch takes {_epoch(top)}. "
    )
    reps = sorted(set(main["repeats"]))
    if max(reps) > 1:
        cov = main[main["repeats"] == max(reps)]["ci_level"].dropna()
        text += (
            f"Each point is the median of up to {max(reps)} repeats; the interval in Table~\\ref{{tab:scaling}} "
            f"covers the median with the stated confidence"
            + (f" ({pct(cov.iloc[0])} with {max(reps)} repeats; 95\\,\\% needs six)" if len(cov) else "")
            + ". "
        )
    else:
        text += "Each point is a single run: no interval can be given before repeats exist. "
    text += note + (" " if note else "") + superseded_note(main)
    weak = main_series(clean(scal), "weak")
    if not weak.empty:
        wt = weak.iloc[-1]
        text += (
            f"In weak scaling ({tex_escape(wt['series'])}) the efficiency at {int(wt['gpus'])} ranks is "
            f"{pct(wt['efficiency'])}. "
        )
    gaps = main["acc_gap_points"].dropna()
    if len(gaps) > 1:
        worst = gaps.abs().max()
        verdict = "within" if worst <= TARGET_ACC_GAP else "outside"
        text += (
            f"The final accuracy stays {verdict} the {TARGET_ACC_GAP:g}-point criterion: the largest gap to the "
            f"{n0}-rank baseline is {worst:.1f} points (best accuracy "
            f"{100 * main['final_eval_acc'].max():.1f}\\,\\%). "
        )
    aside = int((~scal["clean"]).sum())
    abstract = (
        f"On that hardware the largest strong-scaling point ({n} ranks) reaches a speedup of {spd:.2f} over "
        f"{n0} rank{'s' if n0 > 1 else ''}, a scaling efficiency of {pct(eff)}"
        + (f" ({aside} suspicious point{'s' if aside > 1 else ''} set aside for a re-run)." if aside else ".")
    )
    slide = (
        f"\\item {n} ranks: speedup {spd:.2f}, efficiency {pct(eff)}\n"
        f"\\item {num(top['samples_per_s'])} samples/s at {n} ranks (median of {int(top['repeats'])})\n"
    )
    if len(gaps) > 1:
        slide += f"\\item accuracy gap $\\le$ {gaps.abs().max():.1f} points\n"
    if aside:
        slide += f"\\item {aside} suspicious point{'s' if aside > 1 else ''} set aside, to re-run\n"
    return text + "\n", abstract + "\n", slide


def resolved_defaults(params: dict) -> dict:
    """Every parameter's default for a record's workload (what a re-run command may leave out)."""
    from kernels.launch import config
    from kernels.base.errors import ConfigError

    try:
        return config.resolve({"workload": params.get("workload")}).to_dict()
    except ConfigError:
        return trust.common_defaults(params)


def rerun_section(runs: pd.DataFrame, scal: pd.DataFrame) -> tuple[str, pd.DataFrame]:
    """The 'results to re-run' table (tab:rerun): every set-aside point, why, and the command that re-runs it."""
    t = trust.rerun_table(runs, scal, resolved_defaults)
    if t.empty:
        return "", t
    t = t.assign(command=[" \\newline ".join(f"\\texttt{{{tex_escape(c)}}}" for c in cmds) for cmds in t["commands"]])
    table = booktabs(
        t, RERUN_COLUMNS, size="\\footnotesize", spec="@{}p{0.2\\linewidth}rp{0.3\\linewidth}p{0.42\\linewidth}@{}"
    )
    return (
        "\\begin{table*}[t]\\centering\n\\caption{Results to re-run: points set aside ("
        + SET_ASIDE_MARK
        + " in the scaling tables), why, and the command that measures them again}\\label{tab:rerun}\n"
        + table
        + "\\end{table*}\n"
    ), t


def optim_section(gains: pd.DataFrame) -> str:
    """The paper's optimisation paragraph with its table and figure, or one gap note when nothing is measured."""
    if gains.empty:
        # the run-in \paragraph heading takes a line of its own, or the box starts mid-line and overruns the column
        why = (
            "no before/after pairs yet: the optimisation runs (precision, input pipeline, bucket size, "
            "channels_last, compile) have not been measured at otherwise equal settings"
        )
        return "\\leavevmode\\par" + gap_note(why)
    return (
        "Table~\\ref{tab:gains} and Fig.~\\ref{fig:gains} compare each optimisation with its baseline at "
        "otherwise equal settings. "
        + optim_text(gains)
        + "\\begin{table}[t]\\centering\n\\caption{Before/after throughput of the optimisations}\\label{tab:gains}\n"
        + booktabs(gains, GAINS_COLUMNS, size="\\footnotesize")
        + "\\end{table}\n"
        "\\begin{figure}[t]\\centering\n\\includegraphics[width=\\linewidth]{gains.pdf}\n"
        "\\caption{Speedup of each optimisation over its baseline.}\\label{fig:gains}\n\\end{figure}\n"
    )


def optim_text(gains: pd.DataFrame) -> str:
    parts = []
    for factor, g in gains.groupby("factor", sort=False):
        best = g.loc[g["speedup"].idxmax()]
        words = FACTOR_WORDS[factor].format(before=tex_escape(best["before"]), after=tex_escape(best["after"]))
        parts.append(
            f"{best['speedup']:.2f}$\\times$ for {words} ({int(best['gpus'])} rank"
            f"{'s' if best['gpus'] > 1 else ''}, $B={int(best['batch'])}$)"
        )
    return "Measured side by side at otherwise equal settings, the best speedups are " + listing(parts) + ".\n"


def section(ctx: Context) -> None:
    runs = ctx.runs
    scal = analysis.scaling(runs)
    gains = analysis.optimisation_gains(trust.quiet(runs))
    if not scal.empty:
        scal = scal.assign(
            ci=scal.apply(_interval, axis=1),
            epoch_cell=scal.apply(_epoch_cell, axis=1),
            mark=[("" if c else SET_ASIDE_MARK) for c in scal["clean"]],
        )
    made = figures(ctx, scal, gains)
    ctx.put("fig_throughput.tex", figure_snippet("throughput", "throughput" in made, NO_SERIES))
    ctx.put("fig_efficiency.tex", figure_snippet("efficiency", "efficiency" in made, NO_SERIES))
    ctx.put("fig_slide_scaling.tex", figure_snippet("slide_scaling", "slide_scaling" in made, NO_SERIES))
    ctx.put("fig_epoch_time.tex", figure_snippet("epoch_time", "epoch_time" in made, NO_SERIES))
    ctx.put("fig_accuracy.tex", figure_snippet("accuracy", "accuracy" in made, "no complete runs with evaluation yet"))
    ctx.put(
        "scaling_table.tex",
        booktabs(scal, SCALING_COLUMNS, size="\\footnotesize") if not scal.empty else gap_note(NO_SERIES),
    )
    ctx.put(
        "scaling_table_compact.tex",
        booktabs(scal, COMPACT_COLUMNS, size="\\small") if not scal.empty else gap_note(NO_SERIES),
    )
    text, abstract, slide = results_text(ctx, scal)
    ctx.put("results_text.tex", text)
    ctx.put("abstract_results.tex", abstract)
    ctx.put("slide_results.tex", slide)
    ctx.put("optim_section.tex", optim_section(gains))
    rerun_tex, rerun = rerun_section(runs, scal)
    ctx.put("rerun_table.tex", rerun_tex)
    ctx.macro("labEffTolerance", pct(trust.EFFICIENCY_TOL))
    ctx.macro("labSpreadTolerance", pct(trust.SPREAD_TOL))
    ctx.results.update(scaling=scal, gains=gains, rerun=rerun)
