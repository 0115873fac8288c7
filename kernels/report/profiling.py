"""The profiling section: where the step time goes, from what the records measured."""
from __future__ import annotations

from kernels.report.context import Context
from kernels.report.tex import gap_note, listing, pct, tex_escape


def profiling_text(ctx: Context) -> str:
    runs = ctx.runs
    if runs.empty:
        return gap_note("no complete run records: nothing has been profiled yet")
    parts = []
    wait = runs["data_wait_frac"].dropna()
    if len(wait):
        parts.append(f"waiting for input data takes {pct(wait.median(), 1)} of the step (median over "
                     f"{len(wait)} record{'s' if len(wait) > 1 else ''})")
    comm = runs[runs["gpus"] > 1]["exposed_comm_ms"].dropna()
    if len(comm):
        m = comm.median()
        parts.append(f"the communication probe measures {m:.1f}\\,ms of all-reduce time per step that backward does "
                     f"not hide (median over {len(comm)} multi-rank record{'s' if len(comm) > 1 else ''})"
                     if m > 0 else
                     f"the communication probe finds no exposed all-reduce time (median {m:.1f}\\,ms over "
                     f"{len(comm)} multi-rank record{'s' if len(comm) > 1 else ''}, within its noise)")
    mfu = runs["mfu"].dropna()
    if len(mfu):
        parts.append(f"the model FLOPs utilisation reaches {pct(mfu.max(), 1)} of the device's dense peak")
    text = ("Across the selected records, " + listing(parts) + ". ") if parts else ""
    if not len(mfu):
        text += ("No model FLOPs utilisation is reported: no dense peak is known for "
                 + tex_escape(", ".join(sorted(runs["device"].unique()))) + ". ")
    return text + "\n"


def section(ctx: Context) -> None:
    ctx.put("profiling_text.tex", profiling_text(ctx))
