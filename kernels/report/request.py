"""The proposal's resource request: node-hours of the planned study from measured times per epoch."""

from __future__ import annotations

import math

import pandas as pd

from kernels.analysis import runs as analysis
from kernels.analysis.trust import quiet
from kernels.report.context import Context
from kernels.report.evidence import (
    PILOT_EPOCHS,
    committed_pilot_runs,
    on_target,
    pilot_basis,
    pilot_command,
    proposed_runs,
    stand_in_note,
)
from kernels.report.io import STREAMED
from kernels.report.scaling import clean, main_series, set_aside_note
from kernels.analysis.tex import booktabs, gap_note, listing, num, pct, tex_escape
from kernels.base.params import default

NODEHOURS_COLUMNS = {
    "gpus": ("GPUs", "d"),
    "nodes": ("Nodes", "d"),
    "runs": ("Runs", "d"),
    "epochs": ("Epochs", "d"),
    "epoch_s": ("Epoch (s)", ".3g"),
    "source": ("Time per epoch", "s"),
    "node_hours": ("Node-hours", ",.3g"),
}
# data sets streamed from storage (bigMNIST): their runs belong to the I/O study
SLIDE_COLUMNS = {"gpus": ("GPUs", "d"), "nodes": ("Nodes", "d"), "node_hours": ("Node-hours", ",.3g")}


def requested(total: float, plan: dict) -> int:
    """The plan's margin on top of the computed total, rounded up to the plan's unit."""
    unit = int(plan["round_to"])
    return int(math.ceil(total * (1 + float(plan["margin"])) / unit) * unit)


def command_tex(command: str) -> str:
    """A command line for \\texttt: lines break between an option and the next, never inside `-p NAME VALUE`."""
    groups: list[list[str]] = []
    for word in command.split():
        if groups and groups[-1][0].startswith("-") and not word.startswith("-"):
            groups[-1].append(word)
        else:
            groups.append([word])
    return " ".join("~".join(tex_escape(w) for w in g) for g in groups)


def to_be_measured(ctx: Context, why: str) -> None:
    """The request when no record may price it: the planned points with 'to be measured', the pilot that
    measures them, and no total."""
    plan, system = ctx.plan, ctx.system
    gpn = int(system.get("gpus_per_node") or 4)
    points = plan["points"].groupby("gpus").agg(runs=("epochs", "size"), epochs=("epochs", "sum")).reset_index()
    points["nodes"] = [-(-int(n) // gpn) for n in points["gpus"]]
    points["node_hours"] = "to be measured"
    cols = {
        "gpus": ("GPUs", "d"),
        "nodes": ("Nodes", "d"),
        "runs": ("Runs", "d"),
        "epochs": ("Epochs", "d"),
        "node_hours": ("Node-hours", "s"),
    }
    ctx.put("nodehours_table.tex", booktabs(points, cols, size="\\small"))
    ctx.put("nodehours_slide.tex", booktabs(points, cols))
    ctx.put("io_request_text.tex", io_study_hours(ctx, in_total=False)[1])
    job = pilot_command(plan)
    if job:
        pilot = (
            f"One pilot job produces the record that prices them, on one GPU of {tex_escape(system['name'])} "
            f"(milestone M1):\n\\begin{{quote}}\\raggedright\\texttt{{{command_tex(job)}}}\\end{{quote}}\n"
            f"\\noindent Its label is selected by paper/plan.yaml; "
            f"\\texttt{{-p dataset synthetic}} measures the same step where the data set is not staged yet. "
            f"The request is then its time per epoch times the planned runs by the formula above, the larger "
            f"GPU counts predicted from this 1-GPU record by the step model until they are measured.\n"
        )
        slide = f"one GPU of {tex_escape(system['name'])}, {PILOT_EPOCHS} epochs, milestone M1"
    else:
        pilot = (
            f"A pilot on {tex_escape(system['name'])} (milestone M1: 1 GPU, "
            f"{tex_escape(listing(plan.get('workloads') or []))}) measures the time per epoch $T(N)$, and the "
            f"request is computed from it by the formula above; the larger GPU counts are predicted from the "
            f"pilot's 1-GPU record by the step model until they are measured.\n"
        )
        slide = f"1 GPU of {tex_escape(system['name'])}, milestone M1"
    ctx.put("request_text.tex", f"The node-hours are to be measured: {why}. No total is computed from them. {pilot}")
    ctx.put(
        "slide_request.tex",
        f"\\item Node-hours: to be measured by a pilot job ({slide})\n\\item {why[0].upper() + why[1:]}\n",
    )
    ctx.macro("labNodeHours", "to be measured")
    ctx.macro("labNodeHoursRequest", "to be measured")
    ctx.results.update(node_hours=pd.DataFrame(), node_hours_total=None, node_hours_request=None)


def section(ctx: Context) -> None:
    plan, system = ctx.plan, ctx.system
    could, why = proposed_runs(ctx.runs, plan, system)
    committed = False
    if why:  # nothing selected may price it: the pilot records committed with the lab, under the same rules
        pilots, not_those = committed_pilot_runs(ctx.pilot_dir, plan, system)
        committed, could = not pilots.empty, pilots if not pilots.empty else could
        why = "" if committed else why + (f", {not_those}" if not_those else "")
    runs = quiet(could)
    if not why and runs.empty:  # records that could price it, none of them quiet
        why = (
            f"all {len(could)} selected records that could price it shared their cores or GPUs with other work "
            f"(contended)"
        )
    if why:
        to_be_measured(ctx, why)
        return
    epoch_by_n, basis, main, aside = measured_epochs(ctx, runs)
    basis = pilot_basis(runs, ctx.pilot_dir) if committed else basis
    if not epoch_by_n:
        ctx.put("io_request_text.tex", "")
        ctx.put("nodehours_table.tex", gap_note("no complete run records: the node-hours cannot be computed yet"))
        ctx.put("nodehours_slide.tex", "")
        ctx.put(
            "request_text.tex",
            gap_note("no complete run records: the request is computed from the first measured time per epoch"),
        )
        ctx.put("slide_request.tex", "\\item " + tex_escape("No measured time per epoch yet: no request.") + "\n")
        ctx.results.update(node_hours=pd.DataFrame(), node_hours_total=None, node_hours_request=None)
        return
    predicted, pred_note = predicted_epochs(ctx, runs, main, epoch_by_n)
    table, total = analysis.node_hours(plan, epoch_by_n, predicted)
    io_hours, io_note = io_study_hours(ctx)
    total += io_hours
    ctx.put("io_request_text.tex", io_note)
    ask = requested(total, plan)
    ctx.put("nodehours_table.tex", booktabs(table, NODEHOURS_COLUMNS, size="\\small"))
    ctx.put("nodehours_slide.tex", booktabs(table, SLIDE_COLUMNS))
    hw = ", ".join(sorted(runs["device"].unique()))
    text = (
        f"The times per epoch come from {basis}, measured on {tex_escape(hw)} "
        f"({len(runs)} record{'s' if len(runs) > 1 else ''}), the target system's GPU model. "
        + stand_in_note(runs)
        + f"The computed total is \\textbf{{{num(total, 4)} node-hours}}. With the plan's margin of "
        f"{pct(float(plan['margin']))} for reruns and queue effects, rounded up to {int(plan['round_to'])}, we "
        f"request \\textbf{{{num(ask)} node-hours}}. Points without a measurement "
        + (
            "are predicted from 1-GPU measurements as described above"
            if predicted
            else "use the assumed efficiency (no 1-rank record with gradient sizes is selected)"
        )
        + " and are replaced by measurements as the study proceeds."
    )
    band, band_text = uncertainty(ctx, table, predicted)
    ctx.put("request_text.tex", pred_note + text + band_text + (" " + aside if aside else "") + "\n")
    source = "1-GPU time per epoch and the step model" if set(epoch_by_n) == {1} else "measured time per epoch"
    ctx.put(
        "slide_request.tex",
        f"\\item From the {source} ({tex_escape(hw)}): \\textbf{{{num(total, 4)} node-hours}}"
        + (f" ($\\pm${num(band, 2)})" if band else "")
        + f"\n\\item Request with {pct(float(plan['margin']))} margin: \\textbf{{{num(ask)} node-hours}} on "
        f"{tex_escape(system['name'])}\n",
    )
    ctx.macro("labNodeHours", num(total, 4))
    ctx.macro("labNodeHoursRequest", num(ask))
    ctx.results.update(node_hours=table, node_hours_total=total, node_hours_request=ask)


def measured_epochs(ctx: Context, runs: pd.DataFrame) -> tuple[dict, str, pd.DataFrame, str]:
    """(median time per epoch by GPU count, where they come from, the strong-scaling series used, the note on
    set-aside points): the main strong-scaling series of the pricing runs' data set where there is one, else
    the pricing runs themselves (stand-ins always: their series ran a synthetic set of another size)."""
    scal = ctx.results.get("scaling", pd.DataFrame())
    if not scal.empty:  # the series of the runs that may price the request only
        scal = scal[scal["dataset"].isin(set(runs["dataset"]))]
    if "stand_in_for" in runs:
        scal = scal.iloc[0:0]
    if not scal.empty and (~scal["dataset"].isin(STREAMED)).any():
        scal = scal[~scal["dataset"].isin(STREAMED)]  # the I/O study is costed on its own (io_study_hours)
    aside = set_aside_note(scal, in_paper=False)
    scal = clean(scal)  # a set-aside point never prices the request
    main = main_series(scal) if not scal.empty else scal
    if not main.empty:
        return (
            main.groupby("gpus")["epoch_s"].median().to_dict(),
            f"the strong-scaling series {tex_escape(main['series'].iloc[0])}",
            main,
            aside,
        )
    if runs.empty:
        return {}, "", main, aside
    projected = runs["steps_per_epoch"] * runs["batch"] / runs["samples_per_s"]
    by_n = runs.assign(e=runs["epoch_s"].fillna(projected)).groupby("gpus")["e"].median().to_dict()
    return by_n, "the complete runs (no scaling series yet)", main, aside


def uncertainty(ctx: Context, table: pd.DataFrame, predicted: dict) -> tuple[float, str]:
    """(node-hours either side of the total, the sentence): the predicted points' node-hours times the step
    model's largest error against measured multi-rank points among the selected records (the communication
    section's validation); (0, "") when nothing is predicted."""
    if not predicted:
        return 0.0, ""
    rows = table[table["gpus"].isin(list(predicted))]
    hours = float(rows["node_hours"].sum()) * (1 + float(ctx.plan["profiling_overhead"]))
    v = ctx.results.get("predictor", pd.DataFrame())
    errors = v.loc[v["gpus"] > 1, "error"].abs().dropna() if not v.empty else pd.Series(dtype=float)
    counts = listing([str(int(n)) for n in sorted(predicted)])
    if errors.empty:
        return 0.0, (
            f" The {num(hours, 3)} node-hours at {counts} GPUs are predicted from 1-GPU measurements by a step "
            f"model that no selected record validates yet (no multi-rank series with commbench fits): their error "
            f"is not known."
        )
    worst = float(errors.max())
    return hours * worst, (
        f" The {num(hours, 3)} node-hours at {counts} GPUs are predicted from 1-GPU measurements; the step "
        f"model's largest error against {len(errors)} measured multi-rank point{'s' if len(errors) > 1 else ''} "
        f"is {pct(worst)} (the paper's communication section), so the computed total is uncertain by "
        f"$\\pm${num(hours * worst, 3)} node-hours."
    )


def predicted_epochs(ctx: Context, runs: pd.DataFrame, main: pd.DataFrame, epoch_by_n: dict) -> tuple[dict, str]:
    """Time per epoch at the planned GPU counts without a measurement, from the step predictor
    (kernels/comm/predict.py): a 1-rank record with gradient sizes, strong scaling at its global batch on the
    target system's GPUs, with the all-reduce fits of commbench records labelled with the system's key, else
    the system's published link bandwidths. ({}, gap note) when there is no such record."""
    from kernels.comm import predict

    if runs.empty or "grad_param_bytes" not in runs:
        return {}, ""
    base = runs[(runs["gpus"] == 1) & runs["grad_param_bytes"].notna() & ~runs["dataset"].isin(STREAMED)]
    if not main.empty:
        same = base[base["batch"].isin(main["batch"])]
        base = same if not same.empty else base
    if base.empty:
        return {}, ""
    b = base.sort_values("started_utc").iloc[-1]
    key, system = ctx.plan["system"], ctx.system
    recs = [r for r in ctx.comm_records if (r["config"].get("params") or {}).get("label") == key]
    fitted = predict.fits(recs, by="label")
    intra = fitted.get(("nccl", "all_reduce", "fp32", "intra-node", key))
    inter = fitted.get(("nccl", "all_reduce", "fp32", "inter-node", key))
    if intra or inter:
        source, how = "predicted (fitted)", f"NCCL all-reduce fits of {len(recs)} commbench record(s) of the system"
    else:
        pub = predict.published_fits(system)
        intra, inter = pub.get("intra-node"), pub.get("inter-node")
        source = "predicted (published bw)"
        how = (
            rf"the system's published link bandwidths ({num(system.get('intranode_GBps'))}\,GB/s per GPU inside "
            rf"a node, {num(system.get('internode_GBps'))}\,GB/s per node between nodes, latencies assumed; "
            f"paper/systems.yaml), no commbench record of it being selected"
        )
    if intra is None and inter is None:
        return {}, ""
    t1 = float(b["step_ms"]) / 1e3
    data = t1 * float(b["data_wait_frac"] or 0.0)
    bks = predict.buckets(list(b["grad_param_bytes"]), float(b["bucket_cap_mb"] or default("bucket_cap_mb")))
    gpn = int(ctx.plan["gpus_per_node"])
    epoch1 = float(b["epoch_s"] or b["steps_per_epoch"] * t1)
    out = {}
    rounded = []  # (n, the global batch it runs): the studies round a batch that does not split down
    for n in ctx.plan["gpus"]:
        n = int(n)
        batch = int(b["batch"]) - int(b["batch"]) % n
        if n in epoch_by_n or n == 1 or not batch:
            continue  # measured, or fewer samples than ranks
        share = batch / int(b["batch"])  # the 1-GPU step at that batch: the same time per sample
        try:
            p90 = share * b["step_ms_p90"] / 1e3 if b.get("step_ms_p90") else None
            p = predict.predict_step(
                t1 * share,
                bks,
                n,
                -(-n // gpn),
                intra,
                inter,
                "strong",
                predict.straggler_factor(t1 * share, p90, n),
                overlap=True,
                data_s=data * share,
                choose=predict.CHOICES["nccl"],  # the target's GPUs: NCCL's ring or tree, whichever is cheaper
            )
        except ValueError:
            continue
        out[n] = (epoch1 * p["step_s"] / (t1 * share), source)
        if share < 1:
            rounded.append((n, batch))
    uneven = listing([f"{batch} at {n} GPUs, {batch // n} per GPU" for n, batch in rounded])
    note = (
        (
            f"Points without a measurement are predicted by the step model (the paper's communication section; "
            rf"\texttt{{kernels/comm/predict.py}}) from the 1-rank record {tex_escape(b['run_id'])} "
            rf"({num(1e3 * t1)}\,ms per step, {num(sum(b['grad_param_bytes']) / 1e6)}\,MB of gradients in "
            f"{len(bks)} buckets), strong scaling at its global batch of {int(b['batch'])} on nodes of {gpn} GPUs"
            + (f", rounded down where it does not split, as the studies run it ({uneven})" if rounded else "")
            + f", with {how}. "
        )
        if out
        else ""
    )
    return out, note


def io_study_hours(ctx: Context, in_total: bool = True) -> tuple[float, str]:
    """Node-hours of the plan's I/O study (its own gpus, epochs, runs and repeats) from the selected
    bigMNIST records' time per epoch on the target system's GPU model; 0 and a sentence saying it is to be
    measured while there is none. in_total: whether the main study's total exists to include it in."""
    io = ctx.plan.get("io_study")
    if not io:
        return 0.0, ""
    runs = ctx.runs[ctx.runs["dataset"].isin(STREAMED)] if not ctx.runs.empty else ctx.runs
    runs = on_target(runs, ctx.system)
    if runs.empty:
        return 0.0, (
            f"The planned I/O study (paper/plan.yaml: io\\_study) is to be measured as well: no bigMNIST "
            f"record on the {tex_escape(ctx.system['gpu'])} is selected to measure its time per epoch.\n"
        )
    # a record's set may be a small build: scale its time per sample to the planned set's size
    per_sample = runs.assign(t=runs["epoch_s"] / (runs["steps_per_epoch"] * runs["batch"]))
    epoch_by_n = (per_sample.groupby("gpus")["t"].median() * float(io["samples"])).to_dict()
    points = pd.DataFrame(
        [
            {"gpus": int(n), "epochs": int(io["epochs"])}
            for n in io["gpus"]
            for _ in range(int(io["runs_per_point"]) * int(io["repeats"]))
        ]
    )
    table, hours = analysis.node_hours({**ctx.plan, "points": points}, epoch_by_n)
    ctx.put("io_nodehours_table.tex", booktabs(table, NODEHOURS_COLUMNS, size="\\small"))
    return hours, (
        f"The I/O study (MNIST and bigMNIST on {', '.join(str(g) for g in io['gpus'])} GPUs, "
        f"{io['epochs']} epochs of {num(io['samples'])} samples, {io['runs_per_point']} runs per point, "
        f"{io['repeats']} repeats) adds {num(hours, 3)} node-hours, from the time per sample of "
        f"{len(runs)} selected bigMNIST record{'s' if len(runs) > 1 else ''} scaled to that size; "
        + (
            "it is included in the total.\n"
            if in_total
            else "it joins the total when the main study's time per epoch is measured.\n"
        )
    )
