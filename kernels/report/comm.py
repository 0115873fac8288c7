"""The communication section: collective bandwidths per backend (one table, NCCL next to MPI and gloo), the
alpha-beta fits, the step predictor checked against measured runs, and DDP against Horovod."""

from __future__ import annotations

import pandas as pd

from kernels.comm import predict
from kernels.report.context import Context
from kernels.analysis.figures import figure_snippet, rank_axis, save_figure, style
from kernels.analysis.tex import booktabs, gap_note, listing, num, pct, tex_escape

TARGET_ERROR = 0.15  # the predictor's goal on the local two-node Slurm
COMPARE_COLUMNS = {
    "backend": ("Backend", "s"),
    "op": ("Collective", "s"),
    "ranks": ("Ranks", "d"),
    "nodes": ("Nodes", "d"),
    "system": ("System", "s"),
    "small_bytes": ("Small (B)", "d"),
    "small_us": ("Latency (us)", ",.4g"),
    "large_bytes": ("Large (B)", ",d"),
    "large_busbw": ("busbw (GB/s)", ".3g"),
}
FIT_COLUMNS = {
    "backend": ("Backend", "s"),
    "op": ("Collective", "s"),
    "placement": ("Placement", "s"),
    "system": ("System", "s"),
    "alpha_us": ("$\\alpha$ (us)", ",.4g"),
    "busbw_GBps": ("busbw (GB/s)", ".3g"),
    "ranks": ("Ranks", "s"),
    "points": ("Points", "d"),
    "rms_rel_err": ("rms err.", ".2f"),
    "status": ("Fit", "s"),
}
VALIDATION_COLUMNS = {
    "series": ("Series", "s"),
    "gpus": ("Ranks", "d"),
    "nodes": ("Nodes", "d"),
    "repeats": ("Rep.", "d"),
    "measured_step_ms": ("Measured (ms)", ",.4g"),
    "predicted_step_ms": ("Predicted (ms)", ",.4g"),
    "error_pct": ("Error (\\%)", "+.1f"),
    "measured_efficiency": ("Eff. meas.", ".2f"),
    "predicted_efficiency": ("Eff. pred.", ".2f"),
}
ENGINE_COLUMNS = {
    "series": ("Configuration", "s"),
    "gpus": ("Ranks", "d"),
    "ddp": ("DDP (samples/s)", ",.4g"),
    "horovod": ("Horovod (samples/s)", ",.4g"),
    "ratio": ("Horovod/DDP", ".2f"),
}


def compare_rows(recs: list[dict]) -> pd.DataFrame:
    """Per record and collective: latency at the smallest size and bus bandwidth at the largest (fp32)."""
    from kernels.analysis.runs import system_of

    rows = []
    for rec in recs:
        system = system_of(rec["config"])
        by_op: dict[str, list] = {}
        for r in rec["rows"]:
            if r["dtype"] == "fp32":
                by_op.setdefault(r["op"], []).append(r)
        for op, rs in by_op.items():
            rs = sorted(rs, key=lambda r: r["size_bytes"])
            rows.append(
                {
                    "backend": rs[0]["backend"],
                    "op": op,
                    "ranks": int(rs[0]["ranks"]),
                    "nodes": int(rs[0]["nodes"]),
                    "system": system,
                    "small_bytes": int(rs[0]["size_bytes"]),
                    "small_us": _form(rs[0], "time_us"),
                    "large_bytes": int(rs[-1]["size_bytes"]),
                    "large_busbw": _form(rs[-1], "busbw"),
                }
            )
    cols = list(COMPARE_COLUMNS)
    return (
        pd.DataFrame(rows, columns=cols).sort_values(["op", "backend", "ranks", "nodes"])
        if rows
        else pd.DataFrame(columns=cols)
    )


def _form(row: dict, column: str):
    """A CSV row's out-of-place value of `column`, else its in-place one (the API may have only that form)."""
    v = row.get(f"{column}_out")
    return v if v not in (None, "") else row.get(f"{column}_in")


def engine_rows(runs: pd.DataFrame) -> pd.DataFrame:
    """Median throughput of DDP and Horovod at equal everything else, where both ran."""
    from kernels.analysis.runs import CONFIG_KEYS, series_name

    if runs.empty or "engine" not in runs or runs["engine"].nunique() < 2:
        return pd.DataFrame(columns=list(ENGINE_COLUMNS))
    rows = []
    keys = [k for k in CONFIG_KEYS if k in runs and k != "engine"] + ["gpus", "batch"]
    for vals, g in runs.groupby(keys, dropna=False):
        med = g.groupby("engine")["samples_per_s"].median()
        if {"ddp", "horovod"} <= set(med.index):
            key = dict(zip(keys, vals))
            rows.append(
                {
                    "series": series_name(key, "batch", key["batch"]),
                    "gpus": key["gpus"],
                    "ddp": med["ddp"],
                    "horovod": med["horovod"],
                    "ratio": med["horovod"] / med["ddp"],
                }
            )
    return pd.DataFrame(rows, columns=list(ENGINE_COLUMNS))


def predictor_figure(ctx: Context, v: pd.DataFrame) -> bool:
    import matplotlib.pyplot as plt

    multi = v[v["gpus"] > 1]
    if multi.empty:
        return False
    style()
    fig, ax = plt.subplots(figsize=(3.5, 2.6))
    for name, g in v.groupby("series", sort=True):
        g = g.sort_values("gpus")
        line = ax.plot(g["gpus"], g["measured_step_ms"], marker="o", label=f"measured: {name}")[0]
        ax.fill_between(
            g["gpus"],
            g["measured_step_ms_min"],
            g["measured_step_ms_max"],
            color=line.get_color(),
            alpha=0.15,
            linewidth=0,
        )
        predicted = pd.to_numeric(g["predicted_step_ms"])  # a point without a prediction: a gap in the line
        ax.plot(g["gpus"], predicted, marker="x", linestyle="--", color=line.get_color(), label="predicted")
        for _, r in g[(g["gpus"] > 1) & g["error"].notna()].iterrows():
            ax.annotate(
                f"{100 * r['error']:+.0f}%",
                (r["gpus"], r["predicted_step_ms"]),
                textcoords="offset points",
                xytext=(4, -8),
            )
    rank_axis(ax, v["gpus"])
    ax.set_ylabel("step time (ms)")
    ax.set_ylim(bottom=0)
    systems = ", ".join(sorted(v["system"].unique()))
    ax.set_title(f"Step predictor against measurement ({systems}; band: min-max of repeats)")
    ax.legend()
    save_figure(fig, ctx.out, "predictor")
    return True


def text(recs: list[dict], fits: pd.DataFrame, v: pd.DataFrame, eng: pd.DataFrame) -> str:
    if not recs:
        return gap_note(
            "no commbench records are selected: run `python -m kernels.comm bench` or the study "
            "studies/commbench_local.yaml (03_commbench), and select its label in paper/plan.yaml"
        )
    backends = sorted({r["config"]["params"]["backend"] for r in recs})
    out = (
        f"The selected {len(recs)} commbench record{'s' if len(recs) > 1 else ''} cover "
        f"{listing([tex_escape(b) for b in backends])}. "
    )
    ok = fits[fits["status"] == "resolved"] if not fits.empty else fits
    ar = ok[ok["op"] == "all_reduce"] if not ok.empty else ok
    if not ar.empty:
        parts = [
            f"{tex_escape(r['backend'])} {tex_escape(r['placement'])} on {tex_escape(r['system'])}: "
            f"$\\alpha$ = {num(r['alpha_us'])}\\,us and {num(r['busbw_GBps'])}\\,GB/s bus bandwidth "
            f"(rms error of the fit {pct(r['rms_rel_err'])})"
            for _, r in ar.iterrows()
        ]
        out += "The all-reduce fits are " + listing(parts) + ". "
    if len(ok) < len(fits):
        n = len(fits) - len(ok)
        out += (
            f"{n} fit{'s are' if n > 1 else ' is'} unresolved (too few message sizes, no bandwidth term, or an "
            f"rms error above {pct(predict.MAX_FIT_RMS_REL_ERR)}): listed in "
            f"\\inappendix{{Table}}{{tab:commfit}}, used "
            f"by no prediction. "
        )
    every = v[v["gpus"] > 1] if not v.empty else v
    multi, unpredicted = every[every["error"].notna()], every[every["error"].isna()]
    if not unpredicted.empty:
        parts = [
            f"{int(r['gpus'])} ranks on {int(r['nodes'])} node{'s' if r['nodes'] > 1 else ''} "
            f"({tex_escape(r['algorithm'].removeprefix('no prediction: '))})"
            for _, r in unpredicted.iterrows()
        ]
        out += f"No prediction at {listing(parts)}: measured only. "
    if multi.empty:
        out += gap_note(
            "no series has both a 1-rank run with gradient sizes and multi-rank runs on a system with "
            "all-reduce fits, so the predictor is not checked yet: run studies/predictor_local.yaml "
            "and studies/commbench_local.yaml on the local Slurm (or their equivalents on a cluster)"
        )
    else:
        worst = multi.loc[multi["error"].abs().idxmax()]
        within = (multi["error"].abs() <= TARGET_ERROR).sum()
        out += (
            f"Predicted against measured step times (Table~\\ref{{tab:predictor}}, Fig.~\\ref{{fig:predictor}}): "
            f"{within} of {len(multi)} multi-rank point{'s' if len(multi) > 1 else ''} within "
            f"{pct(TARGET_ERROR)}; the largest error is {100 * worst['error']:+.1f}\\,\\% at "
            f"{int(worst['gpus'])} ranks on {int(worst['nodes'])} node{'s' if worst['nodes'] > 1 else ''} "
            f"({tex_escape(worst['system'])}, {tex_escape(worst['backend'])}). "
        )
        out += topology_text(multi)
    if not eng.empty:
        parts = [
            f"{num(r['ratio'], 2)}$\\times$ DDP's throughput at {int(r['gpus'])} ranks ({tex_escape(r['series'])})"
            for _, r in eng.iterrows()
        ]
        out += "Horovod reaches " + listing(parts) + ". "
    return out + "\n"


def topology_text(multi: pd.DataFrame) -> str:
    """The topology comparison: at each multi-node point, the step predicted with each all-reduce algorithm
    forced, beside the measured one."""
    across = multi[(multi["nodes"] > 1) & multi["closest"].notna()] if "closest" in multi else multi.iloc[:0]
    if across.empty:
        return ""
    parts = []
    for _, r in across.iterrows():
        each = [f"{a} {num(r[f'{a}_ms'])}" for a in predict.ALGORITHMS if pd.notna(r[f"{a}_ms"])]
        parts.append(
            rf"at {int(r['gpus'])} ranks on {int(r['nodes'])} nodes the measured {num(r['measured_step_ms'])}\,ms "
            rf"is closest to the {r['closest']} prediction ({', '.join(each)}\,ms)"
        )
    return "With each all-reduce algorithm forced in turn, " + listing(parts) + ". "


def section(ctx: Context) -> None:
    recs = ctx.selected_comm
    fitted = predict.fits(recs, unresolved=True)  # the table lists every fit, marked; predictions use resolved ones
    fits = pd.DataFrame(predict.fit_table(fitted))
    v = predict.validation(ctx.runs, recs)
    v = v.assign(error_pct=[100 * e if e is not None and e == e else None for e in v["error"]])
    eng = engine_rows(ctx.runs)
    ctx.results.update(comm_fits=fits, predictor=v, engines=eng, comm_compare=compare_rows(recs))
    why = "no commbench records are selected"
    cmp = ctx.results["comm_compare"]
    ctx.put("comm_table.tex", booktabs(cmp, COMPARE_COLUMNS, size="\\scriptsize") if not cmp.empty else gap_note(why))
    # the why: lab comm fit
    short = fits.assign(status=fits["status"].str.split(":").str[0]) if not fits.empty else fits
    ctx.put(
        "comm_fit_table.tex",
        booktabs(short, FIT_COLUMNS, size="\\scriptsize")
        if not fits.empty
        else gap_note(why + " (or none has two sizes at more than one rank)"),
    )
    ctx.put(
        "predictor_table.tex",
        booktabs(v, VALIDATION_COLUMNS, size="\\scriptsize")
        if not v.empty
        else gap_note("no series with a 1-rank run and commbench fits on the same system"),
    )
    made = predictor_figure(ctx, v) if not v.empty else False
    ctx.put("fig_predictor.tex", figure_snippet("predictor", made, "no predicted-against-measured points yet"))
    ctx.put(
        "engine_table.tex",
        booktabs(eng, ENGINE_COLUMNS, size="\\scriptsize")
        if not eng.empty
        else gap_note("no configuration ran with both engines (engine=ddp and engine=horovod)"),
    )
    ctx.put("comm_text.tex", text(recs, fits, v, eng))
    ctx.put(
        "comm_section.tex", "% commbench or engine-comparison records are selected\n" if recs or not eng.empty else ""
    )  # \\ifhas{comm_section}: the paper's Communication section stands only then
    multi = v[(v["gpus"] > 1) & v["error"].notna()] if not v.empty else v
    goal = f"{100 * TARGET_ERROR:.0f}\\,\\%"
    ctx.put(
        "predictor_goal.tex",  # a sentence with its numbers, or without the one that does not exist yet
        f"the goal on the local two-node Slurm is {goal} (largest error here: "
        f"{100 * multi['error'].abs().max():.1f}\\,\\%).\n"
        if not multi.empty
        else f"the goal on the local two-node Slurm is {goal}; no multi-rank point has been predicted here yet.\n",
    )
    ctx.macro("labFitMinSizes", str(predict.MIN_FIT_SIZES))
    ctx.macro("labFitMaxErr", f"{100 * predict.MAX_FIT_RMS_REL_ERR:.0f}")
