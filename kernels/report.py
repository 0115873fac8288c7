"""Figures, LaTeX tables, snippets and number macros from the analysis (for `make paper`).

Everything the paper, the proposal and the slides show comes from here:
    <out>/figures/*.pdf|png     figures (PDF for LaTeX, PNG for slides/README)
    <out>/tables/*.tex          booktabs tables and snippets (\\input by the documents)
    <out>/tables/numbers.tex    \\newcommand macros: the prose quotes numbers it never types
Files are rewritten only when their content changes, so `make` rebuilds only
the documents whose inputs really changed. Missing data gives a marked gap in
the document (a framed note), never an error from deep inside matplotlib.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from kernels import analysis

TARGET_E8 = 0.70       # the seeds' target: 70% strong-scaling efficiency at 8 GPUs
TARGET_E = 0.80        # and 80% as the general line
TARGET_ACC_GAP = 2.0   # final accuracy within 2 points of the 1-GPU baseline


def write_if_changed(path: Path, data: bytes | str) -> bool:
    data = data.encode() if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.read_bytes() == data:
        return False
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return True


def tex_escape(s) -> str:
    s = str(s)
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("$", r"\$"), ("#", r"\#"),
                 ("_", r"\_"), ("{", r"\{"), ("}", r"\}"), ("~", r"\textasciitilde{}"), ("^", r"\^{}")):
        s = s.replace(a, b)
    return s


def gap_note(text: str) -> str:
    return "\\noindent\\fbox{\\parbox{0.95\\linewidth}{\\small\\textbf{Gap:} " + tex_escape(text) + "}}\n"


def booktabs(df: pd.DataFrame, columns: dict[str, tuple[str, str]], caption: str = "", label: str = "") -> str:
    """A booktabs tabular of `df`; columns: name -> (header, python format spec)."""
    align = "".join("l" if fmt in ("s", "raw") else "r" for _, fmt in columns.values())
    lines = [f"\\begin{{tabular}}{{{align}}}", "\\toprule",
             " & ".join(h for h, _ in columns.values()) + r" \\", "\\midrule"]
    for _, row in df.iterrows():
        cells = []
        for name, (_, fmt) in columns.items():
            v = row[name]
            if v is None or (isinstance(v, float) and math.isnan(v)):
                cells.append("--")
            elif fmt == "s":
                cells.append(tex_escape(v))
            elif fmt == "raw":
                cells.append(str(v))
            else:
                cells.append(format(v, fmt))
        lines.append(" & ".join(cells) + r" \\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    body = "\n".join(lines) + "\n"
    if caption:
        body = ("\\begin{table}[t]\\centering\\small\n" + f"\\caption{{{caption}}}\\label{{{label}}}\n" + body +
                "\\end{table}\n")
    return body


def fmt_num(v, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if abs(v) >= 100:
        return f"{v:,.0f}".replace(",", "{,}")
    return f"{v:.{digits}g}"


# ------------------------------------------------------------------ figures
def _style():
    import matplotlib

    matplotlib.use("Agg")
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    matplotlib.rcParams["pdf.fonttype"] = 42  # TrueType glyphs, not Type 3 bitmaps, in the PDFs


def save_figure(fig, out: Path, name: str) -> list[Path]:
    import io

    paths = []
    for ext, kw in (("pdf", {"metadata": {"CreationDate": None, "ModDate": None}}), ("png", {"dpi": 160})):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, bbox_inches="tight", **kw)
        p = out / "figures" / f"{name}.{ext}"
        write_if_changed(p, buf.getvalue())
        paths.append(p)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return paths


def rank_axis(ax, ranks) -> None:
    """Log-2 rank axis with a tick at each measured rank count and no minor labels."""
    from matplotlib.ticker import NullFormatter, NullLocator

    ranks = sorted({int(r) for r in ranks})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ranks, [str(r) for r in ranks])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("ranks (GPUs or CPU processes)")


def hardware_line(runs: pd.DataFrame) -> str:
    if runs.empty:
        return "no records"
    devs = ", ".join(sorted(runs["device"].unique()))
    return f"{devs}; torch {', '.join(sorted(runs['torch'].unique()))}"


def _finish_rank_plot(fig, ax, ranks, title: str, out: Path, name: str) -> str:
    rank_axis(ax, ranks)
    ax.set_title(title, fontsize=6)
    ax.legend(fontsize=5)
    save_figure(fig, out, name)
    return name


def scaling_figures(scal: pd.DataFrame, runs: pd.DataFrame, out: Path) -> list[str]:
    """throughput / efficiency / epoch-time vs ranks; returns the names written."""
    import matplotlib.pyplot as plt

    _style()
    if scal.empty:
        return []
    hw = hardware_line(runs)
    names = []
    fig, ax = plt.subplots(figsize=(4.2, 3.1))
    for (mode, series), s in scal.groupby(["mode", "series"]):
        ax.plot(s["gpus"], s["samples_per_s"], marker="o", label=f"{mode}: {series}")
        ax.fill_between(s["gpus"], s["samples_per_s_min"], s["samples_per_s_max"], alpha=0.2)
        n0, x0 = s["gpus"].iloc[0], s["samples_per_s"].iloc[0]
        ax.plot(s["gpus"], x0 * s["gpus"] / n0, ls="--", color="grey", lw=1)
    ax.plot([], [], ls="--", color="grey", label="ideal (linear)")
    ax.set(yscale="log", ylabel="throughput (samples/s)")
    names.append(_finish_rank_plot(fig, ax, scal["gpus"], hw, out, "throughput"))

    fig, ax = plt.subplots(figsize=(4.2, 3.1))
    for (mode, series), s in scal.groupby(["mode", "series"]):
        ax.plot(s["gpus"], 100 * s["efficiency"], marker="o", label=f"{mode}: {series}")
    ax.axhline(100 * TARGET_E, ls="--", color="tab:red", lw=1, label=f"{100 * TARGET_E:.0f}% target")
    ax.plot([8], [100 * TARGET_E8], marker="*", ms=10, color="tab:red", ls="none",
            label=f"{100 * TARGET_E8:.0f}% at 8 GPUs")
    ax.set(ylabel="scaling efficiency (%)", ylim=(0, 110))
    names.append(_finish_rank_plot(fig, ax, set(scal["gpus"]) | {8}, hw, out, "efficiency"))

    fig, ax = plt.subplots(figsize=(4.2, 3.1))
    for (mode, series), s in scal.groupby(["mode", "series"]):
        ax.plot(s["gpus"], s["epoch_s"], marker="o", label=f"{mode}: {series}")
    ax.set(yscale="log", ylabel="time per epoch (s)")
    names.append(_finish_rank_plot(fig, ax, scal["gpus"], hw, out, "epoch_time"))
    return names


def accuracy_figure(runs: pd.DataFrame, scal: pd.DataFrame, out: Path) -> bool:
    import matplotlib.pyplot as plt

    _style()
    with_acc = runs[runs["final_eval_acc"].notna()] if not runs.empty else runs
    if with_acc.empty:
        return False
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(7.2, 2.8))
    for (gpus, batch), grp in with_acc.groupby(["gpus", "batch"]):
        m = pd.DataFrame(grp.iloc[0]["metrics"])
        if "eval_acc" in m:
            ax.plot(m["epoch"] + 1, 100 * m["eval_acc"], marker="o", label=f"N={gpus}, B={batch}")
    ax.set(xlabel="epoch", ylabel="eval accuracy (%)", title="accuracy per configuration")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=6)
    strong = scal[(scal["mode"] == "strong") & scal["acc_gap_points"].notna()] if not scal.empty else scal
    if not strong.empty:
        labels = [f"{r.gpus}" for r in strong.itertuples()]
        bx.bar(range(len(strong)), strong["acc_gap_points"], color="tab:blue")
        bx.set_xticks(range(len(strong)), labels)
        bx.axhline(-TARGET_ACC_GAP, ls="--", color="tab:red", lw=1, label=f"-{TARGET_ACC_GAP:g} points target")
        bx.axhline(TARGET_ACC_GAP, ls="--", color="tab:red", lw=1)
        bx.legend(fontsize=6)
    bx.set(xlabel="ranks", ylabel="accuracy gap to baseline (points)", title="final-accuracy gap")
    fig.suptitle(hardware_line(runs), fontsize=6)
    save_figure(fig, out, "accuracy")
    return True


def gains_figure(gains: pd.DataFrame, runs: pd.DataFrame, out: Path) -> bool:
    import matplotlib.pyplot as plt

    _style()
    if gains.empty:
        return False
    fig, ax = plt.subplots(figsize=(4.2, 2.6))
    labels = [f"{r.factor}: {r.before}→{r.after} (N={r.gpus})" for r in gains.itertuples()]
    ax.barh(range(len(gains)), gains["speedup"], color="tab:green")
    ax.set_yticks(range(len(gains)), labels, fontsize=6)
    ax.axvline(1.0, color="grey", lw=1)
    ax.set(xlabel="speedup (throughput after / before)")
    ax.set_title(hardware_line(runs), fontsize=6)
    save_figure(fig, out, "gains")
    return True


# ------------------------------------------------------------------- tables
def setup_table(runs: pd.DataFrame) -> str:
    """The experimental setup, from the records' metadata only."""
    if runs.empty:
        return gap_note("no complete run records: the setup is filled in from the first records.")
    def vals(col):
        return ", ".join(sorted({str(v) for v in runs[col].dropna()})) or "--"
    rows = [("Hardware", vals("device")), ("Nodes (max)", str(int(runs["nodes"].max()))),
            ("Ranks", vals("gpus")), ("Backend", vals("backend")),
            ("PyTorch", vals("torch")), ("CUDA / NCCL", f"{vals('cuda')} / {vals('nccl')}"),
            ("Python", vals("python")), ("Model", vals("model_variant")), ("Data set", vals("dataset")),
            ("Precision", vals("precision")), ("Input pipeline", vals("pipeline")),
            ("Global batch", vals("batch")), ("Epochs", vals("epochs")),
            ("Code (git)", ", ".join(sorted({(c or "unknown")[:10] + ("+dirty" if d else "")
                                             for c, d in zip(runs["git"], runs["dirty"])})))]
    body = ["\\begin{tabular}{@{}ll@{}}", "\\toprule"]
    body += [f"{tex_escape(k)} & {tex_escape(v)} \\\\" for k, v in rows]
    body += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(body) + "\n"


SCALING_COLUMNS = {"mode": ("Mode", "s"), "gpus": ("$N$", "d"), "nodes": ("Nodes", "d"), "batch": ("$B$", "d"),
                   "repeats": ("Rep.", "d"), "samples_per_s": ("Samples/s", ",.1f"),
                   "samples_per_s_per_device": ("per rank", ",.1f"), "epoch_s": ("Epoch (s)", ".2f"),
                   "speedup": ("Speedup", ".2f"), "efficiency": ("Eff.", ".2f"),
                   "acc_gap_points": ("Acc. gap (pt)", "+.2f")}
GAINS_COLUMNS = {"factor": ("Optimisation", "s"), "before": ("Before", "s"), "after": ("After", "s"),
                 "gpus": ("$N$", "d"), "samples_per_s_before": ("Samples/s before", ",.1f"),
                 "samples_per_s_after": ("after", ",.1f"), "speedup": ("Speedup", ".2f")}
NODEHOURS_COLUMNS = {"gpus": ("GPUs", "d"), "nodes": ("Nodes", "d"), "epoch_s": ("Epoch (s)", ".1f"),
                     "source": ("Time per epoch", "s"), "node_hours": ("Node-hours", ",.2f")}


def figure_snippet(name: str, present: bool, why_missing: str, width: str = "\\linewidth") -> str:
    """The figure for the documents' own figure environments, or a marked gap saying why it is missing."""
    return f"\\includegraphics[width={width}]{{{name}.pdf}}\n" if present else gap_note(why_missing)


def build(runs_dir: Path, out: Path, plan: dict, systems: dict, label: str = "") -> dict:
    """Run the whole analysis and write figures, tables, snippets and macros under `out`."""
    runs, problems = analysis.load_runs(runs_dir, label)
    scal = analysis.scaling(runs)
    gains = analysis.optimisation_gains(runs)
    mix = analysis.version_mix(runs)
    system = systems[plan["system"]]
    tables = out / "tables"
    written: dict[str, bool] = {}

    def put(name, text):
        written[name] = write_if_changed(tables / name, text)

    figs = scaling_figures(scal, runs, out)
    have_acc = accuracy_figure(runs, scal, out)
    have_gains = gains_figure(gains, runs, out)
    why = ("no scaling series yet: a series needs complete runs of one configuration at two or more rank "
           "counts (make demo gives 1 and 2 CPU processes)")
    put("fig_throughput.tex", figure_snippet("throughput", "throughput" in figs, why))
    put("fig_efficiency.tex", figure_snippet("efficiency", "efficiency" in figs, why))
    put("fig_epoch_time.tex", figure_snippet("epoch_time", "epoch_time" in figs, why))
    put("fig_accuracy.tex", figure_snippet("accuracy", have_acc, "no complete runs with evaluation yet"))
    put("fig_gains.tex", figure_snippet("gains", have_gains,
                                        "no before/after pairs yet: the optimisation runs (precision, input "
                                        "pipeline, bucket size, channels_last, compile) have not been measured"))
    put("setup.tex", setup_table(runs))
    put("scaling_table.tex", booktabs(scal, SCALING_COLUMNS) if not scal.empty else gap_note(why))
    put("gains_table.tex", booktabs(gains, GAINS_COLUMNS) if not gains.empty else
        gap_note("no before/after pairs of optimisations among the records yet"))
    notes = []
    if not problems.empty:
        notes.append("Runs left out: " + "; ".join(f"{r.run_id} ({r.status}{': ' + r.reason if r.reason else ''})"
                                                   for r in problems.itertuples()) + ".")
    if mix:
        notes.append("Records differ in " + "; ".join(f"{k}: {', '.join(v)}" for k, v in mix.items()) +
                     ": numbers from different software or hardware are not directly comparable.")
    put("data_notes.tex", "".join(gap_note(n) for n in notes) if notes else "")

    # resource request from the measured time per epoch (largest series' baseline per N)
    epoch_by_n = {}
    if not scal.empty:
        strong = scal[scal["mode"] == "strong"]
        src = strong if not strong.empty else scal
        epoch_by_n = src.groupby("gpus")["epoch_s"].median().to_dict()
    elif not runs.empty:
        epoch_by_n = (runs.assign(e=runs["steps_per_epoch"] * runs["batch"] / runs["samples_per_s"])
                      .groupby("gpus")["e"].median().to_dict())
    plan_with_gpn = {**plan, "gpus_per_node": system["gpus_per_node"]}
    if epoch_by_n:
        nh_table, nh_total = analysis.node_hours(plan_with_gpn, epoch_by_n)
        put("nodehours_table.tex", booktabs(nh_table, NODEHOURS_COLUMNS))
    else:
        nh_table, nh_total = pd.DataFrame(), None
        put("nodehours_table.tex", gap_note("no complete run records: the node-hours cannot be computed yet"))

    sys_rows = pd.DataFrame([{"key": k, **v} for k, v in systems.items()])
    sys_rows["target"] = ["$\\leftarrow$" if k == plan["system"] else "" for k in sys_rows["key"]]
    put("systems_table.tex", booktabs(sys_rows, {"name": ("System", "s"), "gpu": ("GPU", "s"),
                                                 "gpus_per_node": ("GPUs/node", "d"), "network": ("Network", "s"),
                                                 "target": ("", "raw")}))
    put("numbers.tex", macros(runs, scal, gains, problems, mix, plan_with_gpn, system, nh_total))
    return {"runs": runs, "problems": problems, "scaling": scal, "gains": gains, "versions": mix,
            "node_hours": nh_table, "node_hours_total": nh_total, "written": written}


def macros(runs, scal, gains, problems, mix, plan, system, nh_total) -> str:
    m: dict[str, str] = {}
    m["labRecords"] = str(len(runs))
    m["labLeftOut"] = str(len(problems))
    m["labHardware"] = tex_escape(", ".join(sorted(runs["device"].unique()))) if not runs.empty else "no hardware yet"
    on_gpu = not runs.empty and not runs["device"].str.startswith("CPU").all()
    m["labHardwareNote"] = ("measured on GPUs" if on_gpu else
                            "measured on CPU processes (gloo), not on GPUs: they show the method, not GPU performance"
                            if not runs.empty else "no measurements yet")
    m["labHardwareCaveat"] = ("" if on_gpu or runs.empty else
                              "Efficiencies measured with CPU processes on one machine reflect memory bandwidth and "
                              "core sharing, not an interconnect: they validate the pipeline from job to paper, "
                              "not the scaling of GPUs.")
    m["labTorch"] = tex_escape(", ".join(sorted(runs["torch"].unique()))) if not runs.empty else "n/a"
    m["labCommit"] = tex_escape(", ".join(sorted({(c or "unknown")[:10] for c in runs["git"]}))) if not runs.empty else "n/a"
    m["labVersionNote"] = ("mixed software or hardware versions among the records" if mix
                           else "one software and hardware version across all records")
    strong = scal[scal["mode"] == "strong"] if not scal.empty else scal
    if not strong.empty:
        top = strong.loc[strong["gpus"].idxmax()]
        base = strong.loc[strong["gpus"].idxmin()]
        m.update(labMaxRanks=str(int(top["gpus"])), labMaxNodes=str(int(top["nodes"])),
                 labBaseRanks=str(int(base["gpus"])),
                 labThroughputBase=fmt_num(base["samples_per_s"]), labThroughputMax=fmt_num(top["samples_per_s"]),
                 labSpeedupMax=f"{top['speedup']:.2f}", labEffMax=f"{100 * top['efficiency']:.0f}",
                 labEpochTimeBase=fmt_num(base["epoch_s"]), labEpochTimeMax=fmt_num(top["epoch_s"]),
                 labAccGapMax=(f"{strong['acc_gap_points'].abs().max():.1f}"
                               if strong["acc_gap_points"].notna().any() else "n/a"))
    else:
        for k in ("labMaxRanks", "labMaxNodes", "labBaseRanks", "labThroughputBase", "labThroughputMax",
                  "labSpeedupMax", "labEffMax", "labEpochTimeBase", "labEpochTimeMax", "labAccGapMax"):
            m[k] = "n/a"
    weak = scal[scal["mode"] == "weak"] if not scal.empty else scal
    m["labEffWeakMax"] = f"{100 * weak.loc[weak['gpus'].idxmax(), 'efficiency']:.0f}" if not weak.empty else "n/a"
    m["labAccBest"] = f"{100 * runs['final_eval_acc'].max():.1f}" if not runs.empty and runs["final_eval_acc"].notna().any() else "n/a"
    mfu = runs["mfu"].dropna() if not runs.empty else pd.Series(dtype=float)
    m["labMfuBest"] = f"{100 * mfu.max():.1f}\\%" if not mfu.empty else "n/a (no known peak for this hardware)"
    comm = runs["exposed_comm_ms"].dropna() if not runs.empty else pd.Series(dtype=float)
    m["labExposedComm"] = f"{comm.median():.1f}" if not comm.empty else "n/a"
    wait = runs["data_wait_frac"].dropna() if not runs.empty else pd.Series(dtype=float)
    m["labDataWait"] = f"{100 * wait.median():.1f}" if not wait.empty else "n/a"
    for name, factor, after in (("ampSpeedup", "precision", "bf16"), ("pipelineSpeedup", "pipeline", "device"),
                                ("bucketSpeedup", "bucket_cap_mb", None)):
        g = gains[gains["factor"] == factor] if not gains.empty else gains
        if after is not None and not g.empty:
            g = g[g["after"] == after]
        m[name] = f"{g['speedup'].max():.2f}" if not g.empty else "n/a"
    m["labSystem"] = tex_escape(system["name"])
    m["labSystemGpu"] = tex_escape(system["gpu"])
    m["labSystemGpusPerNode"] = str(system["gpus_per_node"])
    m["labSystemNetwork"] = tex_escape(system["network"])
    m["labPlanEpochs"] = str(plan["epochs"])
    m["labPlanRepeats"] = str(plan["repeats"])
    m["labPlanRuns"] = str(plan["runs_per_point"])
    m["labPlanMaxGpus"] = str(max(plan["gpus"]))
    m["labPlanGpus"] = ", ".join(str(g) for g in plan["gpus"])
    m["labPlanOverhead"] = f"{100 * plan['profiling_overhead']:.0f}"
    m["labPlanEff"] = f"{100 * plan['assumed_efficiency']:.0f}"
    m["labPlanEffFrac"] = f"{plan['assumed_efficiency']:.2f}"
    m["labNodeHours"] = fmt_num(nh_total, 4) if nh_total is not None else "n/a"
    m["labNodeHoursRequest"] = (f"{max(1000, int(math.ceil(nh_total * 1.2 / 1000.0)) * 1000):,}".replace(",", "{,}")
                                if nh_total is not None else "n/a")
    lines = ["% Generated by kernels/report.py from the run records; do not edit."]
    lines += [f"\\newcommand{{\\{k}}}{{{v}}}" for k, v in m.items()]
    return "\n".join(lines) + "\n"
