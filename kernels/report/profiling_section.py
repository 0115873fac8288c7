"""The profiling section: where the step time goes (profiled records' breakdowns), what the resource monitor saw,
and each run's bottleneck verdict across the selected records (does it move as ranks grow?).

Writes profiling_text.tex, profile_table.tex, bottleneck_table.tex, fig_profile.tex (+ figures/profile_breakdown),
profiling_brief.tex (the proposal) and slide_profile.tex, and the labProf* macros; every number is read from
the records' summary.json (profile, monitor, bottleneck), none is typed.
"""

from __future__ import annotations

import pandas as pd

from kernels.profiling import verdict
from kernels.profiling.breakdown import CATEGORIES
from kernels.report.context import Context
from kernels.analysis.figures import figure_snippet, save_figure, style
from kernels.report import quantities
from kernels.report.quantities import DATA_WAIT, EXPOSED_COMM, trace_name
from kernels.analysis.tex import booktabs, gap_note, listing, num, pct, tex_escape

# every category of the breakdown, so that a record's shares add up to its whole step (memory copies and other
# operators were left out, and a table summed to 95 %)
SHOWN = CATEGORIES
# one row per profiled record (the notebook's frame; the paper shows it transposed: profile_table)
PROFILE_COLUMNS = ("run", "gpus", "timeline", "ms_per_step", *SHOWN, "verdict")
BOTTLENECK_COLUMNS = {
    "series": ("Series", "s"),
    "gpus": ("N", "d"),
    "runs": ("Runs", "d"),
    "verdict": ("Verdict", "s"),
    "data_wait": ("Data wait \\%", ".1f"),
    "comm": ("Exp.\\ comm.\\ \\%", "raw"),
    "util": ("Util. \\%", ".0f"),
    "mfu": ("MFU \\%", ".1f"),
}
TRACE_MARK = "$^{t}$"  # an exposed-communication cell taken from the trace (no probe resolved a value)


def profiled(runs: pd.DataFrame) -> pd.DataFrame:
    if runs.empty or "profile" not in runs:
        return runs.iloc[0:0]
    return runs[runs["profile"].notna()]


def headline(prof: pd.DataFrame) -> pd.Series | None:
    """The profiled record the sentences quote: the most ranks, then the latest."""
    if prof.empty:
        return None
    return prof.sort_values(["gpus", "started_utc"]).iloc[-1]


def _series(r) -> str:
    from kernels.analysis.runs import series_name

    return series_name(r, "batch", r["batch"]) + (f" [{r['label']}]" if r.get("label") else "")


def profile_rows(prof: pd.DataFrame) -> pd.DataFrame:
    rows = []
    if prof.empty:
        return pd.DataFrame(rows, columns=list(PROFILE_COLUMNS))
    for _, r in prof.sort_values(["workload", "gpus", "started_utc"]).iterrows():
        p = r["profile"]
        run = f"{r['workload']} {r['dataset']} {r['precision']}"
        rows.append(
            {
                "run": run,
                "gpus": int(r["gpus"]),
                "timeline": p["timeline"],
                "ms_per_step": p["profiled_ms_per_step"],
                **{c: 100 * p["share"][c] for c in SHOWN},
                "verdict": r["bottleneck"] or "--",
            }
        )
    return pd.DataFrame(rows, columns=list(PROFILE_COLUMNS))


MAX_PROFILE_COLUMNS = 4  # profiled records shown side by side in the paper (the latest, most ranks first)


def profile_table(rows: pd.DataFrame) -> str:
    """The paper's profile table: one row per category, one column per profiled record (share of the step, %)."""
    shown = rows.tail(MAX_PROFILE_COLUMNS)
    cols = {"what": ("", "s")}
    body = {"what": ["ms per step", *[trace_name(c) for c in SHOWN], "verdict"]}
    for i, (_, r) in enumerate(shown.iterrows()):
        key = f"r{i}"
        cols[key] = (f"{tex_escape(r['run'])}, {r['gpus']}r", "raw")
        body[key] = [num(r["ms_per_step"]), *[f"{r[c]:.1f}\\,\\%" for c in SHOWN], tex_escape(r["verdict"])]
    table = booktabs(pd.DataFrame(body), cols, size="\\scriptsize", spec="@{}l" + "r" * (len(cols) - 1) + "@{}")
    if len(rows) > len(shown):
        table += (
            f"{{\\scriptsize The {len(shown)} latest of {len(rows)} "
            "profiled records; all are in the analysis notebook.}\n"
        )
    return table


def bottleneck_rows(runs: pd.DataFrame) -> pd.DataFrame:
    """Per series and rank count: the verdicts (the most frequent first) and the median evidence."""
    rows = []
    if runs.empty or "bottleneck" not in runs:
        return pd.DataFrame(columns=list(BOTTLENECK_COLUMNS))
    have = runs[runs["bottleneck"].notna()]
    short = [f"{r['workload']} {r['dataset']} B={r['batch']}" for _, r in have.iterrows()]
    for (name, gpus), g in have.assign(series=short).groupby(["series", "gpus"]):
        counts = g["bottleneck"].value_counts()
        verdict = " / ".join(f"{v}" + (f" ({n})" if len(counts) > 1 else "") for v, n in counts.items())
        rows.append(
            {
                "series": name,
                "gpus": int(gpus),
                "runs": len(g),
                "verdict": verdict,
                "data_wait": _med(g["data_wait_frac"], 100),
                "comm": _comm_cell(g),
                "util": _med(g["device_util"], 100),
                "mfu": _med(g["mfu"], 100),
            }
        )
    return pd.DataFrame(rows, columns=list(BOTTLENECK_COLUMNS)).sort_values(["series", "gpus"])


def _comm_cell(g: pd.DataFrame) -> str | None:
    """The median exposed-communication share, marked when any record took it from the trace (no probe value)."""
    med = _med(g["comm_frac"], 100)
    if med is None:
        return None
    traced = g["comm_source"].fillna("").str.startswith("trace").any() if "comm_source" in g else False
    return f"{med:.1f}" + (TRACE_MARK if traced else "")


def _records(n: int) -> str:
    return f"{n} record{'s' if n != 1 else ''}"


def _med(s: pd.Series, scale: float):
    s = pd.to_numeric(s, errors="coerce").dropna()
    return float(s.median()) * scale if len(s) else None


def figure(ctx: Context, prof: pd.DataFrame) -> bool:
    """Stacked bars: each profiled record's share of the step by category."""
    if prof.empty:
        return False
    import matplotlib.pyplot as plt

    style()
    rows = prof.sort_values(["workload", "gpus", "started_utc"])
    labels = [
        f"{r['workload']} {r['dataset']} {int(r['gpus'])}r" + (f" {r['label']}" if r.get("label") else "")
        for _, r in rows.iterrows()
    ]
    used = [c for c in CATEGORIES if any(r["profile"]["share"][c] > 0.001 for _, r in rows.iterrows())]
    colors = dict(zip(CATEGORIES, plt.get_cmap("tab20").colors[::2] + plt.get_cmap("tab20").colors[1::2]))
    fig, ax = plt.subplots(figsize=(3.5, 0.9 + 0.25 * len(rows)))
    left = [0.0] * len(rows)
    for c in used:
        vals = [100 * r["profile"]["share"][c] for _, r in rows.iterrows()]
        ax.barh(labels, vals, left=left, color=colors[c], label=trace_name(c), height=0.7)
        left = [a + b for a, b in zip(left, vals)]
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of the profiled step (%)")
    ax.invert_yaxis()
    ax.legend(
        ncol=3,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.5 - 0.1 / len(rows)),
        frameon=False,
        handlelength=1,
        columnspacing=0.8,
    )
    save_figure(fig, ctx.out, "profile_breakdown")
    return True


def profiling_text(ctx: Context, prof: pd.DataFrame, bt: pd.DataFrame) -> str:
    runs = ctx.runs
    if runs.empty:
        return gap_note("no complete run records: nothing has been profiled yet")
    parts = []
    h = headline(prof)
    if h is not None:
        p = h["profile"]
        top = sorted(((c, v) for c, v in p["share"].items() if c != "idle"), key=lambda kv: -kv[1])[:4]
        parts.append(
            f"The profiler's breakdown of {tex_escape(_series(h))} on {int(h['gpus'])} rank"
            f"{'s' if h['gpus'] > 1 else ''} ({tex_escape(h['device'])}, {p['steps']} profiled steps per rank, "
            f"{p['timeline']} timeline, {num(p['profiled_ms_per_step'])}\\,ms per step) gives "
            + listing([f"{tex_escape(trace_name(c))} {pct(v, 1)}" for c, v in top])
            + f" of the step, and {pct(p['share']['idle'], 1)} outside any operator"
            + (
                f"; the top operator by self time is \\texttt{{{tex_escape(p['top_ops'][0]['name'])}}}"
                if p.get("top_ops")
                else ""
            )
            + ". "
        )
        if p["hta"]["status"] != "done":
            why = p["hta"]["status"].split(":", 1)[-1].strip()
            parts.append(f"Holistic Trace Analysis did not run on it: {tex_escape(why)}. ")
    else:
        parts.append(
            "No selected record was profiled (\\texttt{profile\\_steps} $>0$): there is no breakdown by operator yet. "
        )
    wait = runs["data_wait_frac"].dropna()
    if len(wait):
        parts.append(f"The {DATA_WAIT} is {pct(wait.median(), 1)} of the step (median over {_records(len(wait))}). ")
    multi = runs[runs["gpus"] > 1]
    meas = multi[multi["exposed_comm_status"] == "measured"]["exposed_comm_ms"].dropna()
    below = int((multi["exposed_comm_status"] == "below noise").sum())
    if len(meas) or below:
        s = []
        if len(meas):
            s.append(
                f"is {num(meas.median())}\\,ms per step (median over {len(meas)} multi-rank "
                f"record{'s' if len(meas) > 1 else ''} where the probe resolved a value)"
            )
        if below:
            s.append(f"cannot be told from zero in {_records(below)}")
        parts.append(f"The {EXPOSED_COMM} " + listing(s) + ". ")
    cpu = runs["cpu_util_mean_pct"].dropna() if "cpu_util_mean_pct" in runs else pd.Series(dtype=float)
    gpu = runs["gpu_util_mean_pct"].dropna() if "gpu_util_mean_pct" in runs else pd.Series(dtype=float)
    if len(gpu):
        parts.append(
            f"The resource monitor sees the GPUs busy {num(gpu.median())}\\,\\% of the training loop "
            f"(median over {_records(len(gpu))}). "
        )
    elif "own_cpu_cores" in runs and runs["own_cpu_cores"].notna().any():  # the run's own share, not the host's
        own = runs[runs["own_cpu_cores"].notna()]
        other = pd.to_numeric(own["foreign_cpu_cores"], errors="coerce").dropna()
        busy = num(own["own_cpu_cores"].median())
        parts.append(
            f"The resource monitor sees no GPU; this run's processes kept {busy} "
            f"cores busy during the training loop"
            + (f", other work on the host {num(other.median())}" if len(other) else "")
            + f" (medians over {_records(len(own))}). "
        )
    elif len(cpu):
        parts.append(
            f"The resource monitor sees no GPU; the host's CPUs, this run and any other work together, are "
            f"busy {num(cpu.median())}\\,\\% of the training loop (median over {_records(len(cpu))}). "
        )
    if not bt.empty:
        counts = runs["bottleneck"].value_counts()
        parts.append(
            "The verdict is "
            + listing([f"\\emph{{{tex_escape(v)}}} in {_records(n)}" for v, n in counts.items()])
            + f" (thresholds: {DATA_WAIT} {pct(verdict.DATA_WAIT)}, {EXPOSED_COMM} {pct(verdict.COMM)}, "
            f"utilisation {pct(verdict.UTILISATION)}); \\inappendix{{Table}}{{tab:bottleneck}} lists "
            f"them by rank count. "
        )
    mfu = runs["mfu"].dropna()
    if len(mfu):
        parts.append(f"The model FLOPs utilisation reaches {pct(mfu.max(), 1)} of the device's dense peak. ")
    else:
        parts.append(
            "No model FLOPs utilisation is reported: no dense peak is known for "
            + tex_escape(", ".join(sorted(runs["device"].unique())))
            + ". "
        )
    return "".join(parts) + "\n"


def section(ctx: Context) -> None:
    prof = profiled(ctx.runs)
    bt = bottleneck_rows(ctx.runs)
    rows = profile_rows(prof)
    ctx.results["profile"], ctx.results["bottleneck"] = rows, bt
    made = figure(ctx, prof)
    ctx.put("fig_profile.tex", figure_snippet("profile_breakdown", made, "no profiled record (profile_steps > 0) yet"))
    ctx.put(
        "profile_table.tex",
        profile_table(rows)
        if not rows.empty
        else gap_note("no profiled record (profile_steps > 0) among the selected records"),
    )
    shown = {
        k: v
        for k, v in BOTTLENECK_COLUMNS.items()  # evidence no record has (MFU on CPUs) is left out
        if v[1] == "s" or k in ("gpus", "runs") or bt[k].notna().any()
    }
    spec = "@{}" + "".join("l" if k in ("series", "verdict") else "r" for k in shown) + "@{}"  # marked cells right
    ctx.put(
        "bottleneck_table.tex",
        booktabs(bt, shown, size="\\scriptsize", spec=spec)
        if not bt.empty
        else gap_note("no record carries a bottleneck verdict yet"),
    )
    ctx.put("profiling_text.tex", profiling_text(ctx, prof, bt))
    ctx.put("quantities_text.tex", quantities.text())
    ctx.put("quantity_rows.tex", quantities.table_rows())
    h = headline(prof)
    share = h["profile"]["share"] if h is not None else {}
    for name, cat in (
        ("Conv", "convolution"),
        ("Gemm", "gemm/linear"),
        ("Norm", "normalisation"),
        ("Comm", "communication"),
        ("Data", "data pipeline"),
        ("Idle", "idle"),
    ):
        ctx.macro(f"labProf{name}Pct", f"{100 * share[cat]:.1f}" if share else "--")
    ctx.macro("labThrData", f"{100 * verdict.DATA_WAIT:.0f}")
    ctx.macro("labThrComm", f"{100 * verdict.COMM:.0f}")
    ctx.macro("labThrUtil", f"{100 * verdict.UTILISATION:.0f}")
    ctx.macro(
        "labProfRun",
        tex_escape(f"{_series(h)}, {int(h['gpus'])} ranks, {h['device']}") if h is not None else "no profiled run",
    )
    ctx.macro("labProfVerdict", tex_escape(h["bottleneck"]) if h is not None and h["bottleneck"] else "--")
    brief = (
        f"Profiled from the ranks' traces, a step of {tex_escape(h['workload'])} on {int(h['gpus'])} ranks "
        f"({tex_escape(h['device'])}) is \\labProfConvPct\\,\\% convolution, \\labProfNormPct\\,\\% "
        f"normalisation and \\labProfCommPct\\,\\% {trace_name('communication')}: "
        f"\\emph{{\\labProfVerdict}}-bound. Every "
        f"run records a resource monitor and a bottleneck verdict.\n"
        if h is not None
        else "Every run records a resource monitor and a bottleneck verdict (data, communication, compute, launch "
        "overhead); no run has been profiled by operator yet.\n"
    )
    ctx.put("profiling_brief.tex", brief)
    ctx.put(
        "slide_profile.tex",
        "\\item \\labProfVerdict-bound, conv.\\ \\labProfConvPct\\,\\%\n"
        if h is not None
        else "\\item No profiled run yet\n",
    )
