"""What the lab contains and what it has been validated on: generated from the registry and the records.

Nothing here is a claim typed by hand: the workloads and data sets come from
their registries (kernels/workloads, kernels/data), the validation level from
the hardware and node counts found in the selected records.
"""

from __future__ import annotations

from kernels.report.context import Context
from kernels.analysis.tex import gap_note, listing, note_box, tex_escape


def _vals(runs, col) -> str:
    return ", ".join(sorted({str(v) for v in runs[col].dropna()})) or "--"


def setup_table(ctx: Context) -> str:
    """The experimental setup, from the records' metadata only."""
    runs = ctx.runs
    if runs.empty:
        return gap_note("no complete run records: the setup is filled in from the first records.")
    rows = [
        ("Hardware", ", ".join(sorted(ctx.hardware))),
        ("Nodes (max)", str(int(runs["nodes"].max()))),
        ("Ranks", _vals(runs, "gpus")),
        ("Backend", _vals(runs, "backend")),
        ("PyTorch", _vals(runs, "torch")),
        ("CUDA / NCCL", f"{_vals(runs, 'cuda')} / {_vals(runs, 'nccl')}"),
        ("Python", _vals(runs, "python")),
        ("Model", _vals(runs, "model_variant")),
        ("Data set", _vals(runs, "dataset")),
        ("Precision", _vals(runs, "precision")),
        ("Input pipeline", _vals(runs, "pipeline")),
        ("Global batch", _vals(runs, "batch")),
        ("Epochs", _vals(runs, "epochs")),
        (
            "Code (git)",
            ", ".join(
                sorted({(c or "unknown")[:10] + ("+dirty" if d else "") for c, d in zip(runs["git"], runs["dirty"])})
            ),
        ),
    ]
    body = ["\\begin{tabular}{@{}lp{0.62\\linewidth}@{}}", "\\toprule"]
    body += [f"{tex_escape(k)} & {tex_escape(v)} \\\\" for k, v in rows]
    body += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(body) + "\n"


def contents_text() -> tuple[str, str]:
    """(workloads sentence, data sets sentence) from the registries."""
    from kernels.data import DATASETS
    from kernels.workloads import WORKLOADS, get_workload

    def title(w, d: str) -> str:  # one synthetic generator per kind of input: say which this workload gets
        if d != "synthetic":
            return DATASETS[d].title
        traffic = any("traffic" in DATASETS[x].title.lower() for x in w.datasets if x != "synthetic")
        return "synthetic traffic series" if traffic else "synthetic images"

    wls = [get_workload(name) for name in WORKLOADS]
    items = [f"{tex_escape(w.title)} (data: {', '.join(tex_escape(title(w, d)) for d in w.datasets)})" for w in wls]
    work = "; ".join(items[:-1]) + ("; and " if len(items) > 1 else "") + items[-1]
    n = len(wls)
    workloads = f"The lab currently provides {'one workload' if n == 1 else f'{n} workloads'}: {work}."
    public = [d for d in DATASETS.values() if d.verified]
    datasets = (
        "Input data sets are public and verified by checksum before every run: "
        + listing([f"{tex_escape(d.title)} ({tex_escape(d.verified)})" for d in public])
        + ". "
        + " ".join(f"{tex_escape(d.title)} is {tex_escape(d.terms)}." for d in public if d.terms)
        if public
        else ""
    )
    return workloads + "\n", datasets + "\n"


def validation_text(ctx: Context) -> tuple[str, str]:
    """(the readiness paragraph, a short phrase) from what the selected records ran on."""
    runs = ctx.runs
    if runs.empty:
        return (
            "No run records are selected yet, so no validation can be claimed from them. \n",
            "not yet validated by records",
        )
    hosts = int(runs["hosts"].max())
    nodes = int(runs["nodes"].max())
    ranks = int(runs["gpus"].max())
    devs = tex_escape(", ".join(sorted(runs["device"].unique())))
    if ctx.on_gpu and hosts >= 2:
        level = (
            f"TRL~5: the pipeline is validated on a GPU cluster, up to {ranks} GPUs ({devs}) on {hosts} nodes, "
            f"from the records this document is built from."
        )
        short = f"validated on {hosts} GPU nodes"
    elif ctx.on_gpu:
        level = (
            f"TRL~4: the pipeline is validated on one GPU node, up to {ranks} GPUs ({devs}); runs across "
            f"nodes are the first milestone on the target system."
        )
        short = "validated on one GPU node"
    else:
        emulated = (
            f", including a real Slurm installation whose {nodes} nodes are emulated on that machine"
            if nodes > hosts
            else ""
        )
        level = (
            f"TRL~3 to~4: the complete pipeline (job, ranks, records, analysis, documents) is validated with up "
            f"to {ranks} CPU processes (gloo) on one machine{emulated}. The GPU path (NCCL, CUDA-event timers, "
            f"bf16) is part of the same code but has not been measured yet; its first records are milestone M1."
        )
        short = "validated with CPU processes on one machine, not yet on GPUs"
    return level + "\n", short


def timing_words(ctx: Context) -> tuple[str, str, str]:
    """(the Measurements paragraph's first sentence, the slides' timer phrase, the slides' rank box) for the
    hardware and precisions of the selected records: no CUDA or bf16 words for runs that had neither."""
    runs = ctx.runs
    on_gpu = ctx.on_gpu
    on_cpu = not runs.empty and bool(runs["device"].str.startswith("CPU").any())
    gpu_way = "CUDA events that are read once per epoch, so timing adds no synchronisation"
    if on_gpu and not on_cpu:
        sentence = f"Each step records three {gpu_way} (start, batch ready, step done)."
    elif on_gpu:
        sentence = (
            f"Each step records three marks (start, batch ready, step done): on the GPU runs {gpu_way}; on "
            f"the CPU runs the host clock, exact where the work is synchronous."
        )
    else:
        sentence = (
            "Each step records three marks (start, batch ready, step done). "
            + (
                "The runs here are on CPUs, where the work is synchronous and the host clock times it exactly; "
                if on_cpu
                else "On CPUs the host clock times them exactly, as the work is synchronous; "
            )
            + f"on a GPU the same marks are {gpu_way}."
        )
    timers = "CUDA-event step timers" if on_gpu and not on_cpu else "step timers (CUDA events on GPUs)"
    precisions = " / ".join(sorted(runs["precision"].dropna().unique())) if not runs.empty else ""
    ranks = "one rank per GPU" if on_gpu else "one rank per CPU process" if on_cpu else "one rank per GPU"
    box = f"{ranks}\\\\DDP" + (f" + {tex_escape(precisions)}" if precisions else "")
    return sentence + "\n", timers, box


def selection_text(ctx: Context) -> str:
    """Which records the documents use: the selection's labels and studies that records carry, and those of the
    plan's selection that none does (named apart, so the text never claims records that are not there)."""
    sel = ctx.plan.get("select") or {}
    runs = ctx.runs
    wanted = [("label", x) for x in sel.get("labels") or []] + [("study", x) for x in sel.get("studies") or []]
    found = [(kind, x) for kind, x in wanted if kind in runs and (runs[kind] == x).any()]
    unused = [(kind, x) for kind, x in wanted if (kind, x) not in found]
    crit = listing([f"{kind} {tex_escape(x)}" for kind, x in found])
    k = len(runs)
    text = (
        f"This version is built from {k} complete run record{'s' if k != 1 else ''}"
        + (f" selected by {crit}" if crit else " (all records; no selection in the plan)" if not wanted else "")
        + ". "
    )
    if unused:
        text += (
            f"The selection also names {listing([f'{kind} {tex_escape(x)}' for kind, x in unused])}, which no "
            f"record carries. "
        )
    if len(ctx.problems):
        text += (
            f"{len(ctx.problems)} selected record{'s are' if len(ctx.problems) > 1 else ' is'} not complete and "
            f"left out (listed below). "
        )
    if len(ctx.excluded):
        text += (
            f"{len(ctx.excluded)} further record{'s' if len(ctx.excluded) > 1 else ''} outside the selection "
            f"(other studies, ad-hoc runs) {'are' if len(ctx.excluded) > 1 else 'is'} not used. "
        )
    return text + "\n"


def data_notes(ctx: Context, mix: dict) -> str:
    notes = []
    if not ctx.problems.empty:
        notes.append(
            "Runs left out: "
            + "; ".join(
                f"{r.run_id} ({r.status}{': ' + r.reason[:120] if r.reason else ''})" for r in ctx.problems.itertuples()
            )
            + "."
        )
    if mix:
        notes.append(
            "Records differ in "
            + "; ".join(f"{k}: {', '.join(v)}" for k, v in mix.items())
            + ": numbers from different software or hardware are not directly comparable."
        )
    return "".join(note_box(n) for n in notes)


def section(ctx: Context) -> None:
    from kernels.analysis import runs as analysis

    runs = ctx.runs
    mix = analysis.version_mix(runs)
    ctx.put("setup.tex", setup_table(ctx))
    workloads, datasets = contents_text()
    ctx.put("lab_contents.tex", workloads)
    ctx.put("lab_datasets.tex", datasets)
    validation, short = validation_text(ctx)
    ctx.put("validation_text.tex", validation)
    ctx.put("selection_text.tex", selection_text(ctx))
    timing, timers, box = timing_words(ctx)
    ctx.put("timing_text.tex", timing)
    ctx.macro("labTimers", timers)
    ctx.macro("labRanksBox", box)
    ctx.put("data_notes.tex", data_notes(ctx, mix))
    ctx.macro("labRecords", len(runs))
    ctx.macro("labValidationShort", short)
    hw = ", ".join(sorted(runs["device"].unique())) if not runs.empty else ""
    ctx.macro("labHardware", tex_escape(hw) if hw else "no hardware yet")
    ctx.macro(
        "labHardwareNote",
        "measured on GPUs"
        if ctx.on_gpu
        else "measured on CPU processes (gloo), not on GPUs: they show the method, not GPU performance"
        if not runs.empty
        else "no measurements yet",
    )
    ctx.macro(
        "labHardwareCaveat",
        ""
        if ctx.on_gpu or runs.empty
        else "Efficiencies measured with CPU processes on one machine reflect memory bandwidth and core sharing, "
        "not an interconnect: they validate the pipeline from job to paper, not the scaling of GPUs.",
    )
    ctx.macro("labTorch", tex_escape(", ".join(sorted(runs["torch"].unique()))) if not runs.empty else "--")
    ctx.macro(
        "labCommit",
        tex_escape(", ".join(sorted({(c or "unknown")[:10] for c in runs["git"]}))) if not runs.empty else "--",
    )
    ctx.macro(
        "labVersionNote",
        "mixed software or hardware versions among the records"
        if mix
        else "one software and hardware version across all records",
    )
    ctx.results.update(versions=mix)
