"""The paper's conclusion: the plan's three research questions (how far the workload scales, what limits it,
which settings help) answered from the selected records, one sentence each, or the gap that keeps one open;
then the count of the briefs' targets met. Writes tables/conclusion.tex. Every number is a table's number:
the scaling series and the gains (scaling section), the verdicts (profiling section), the criteria."""

from __future__ import annotations

import pandas as pd

from kernels.analysis.runs import main_series
from kernels.analysis.tex import listing, pct, tex_escape
from kernels.report.context import Context


def scaling_answer(scal: pd.DataFrame, mode: str) -> str | None:
    """The main series of `mode`: its clean points' efficiencies, and the points set aside; None without one."""
    s = main_series(scal, mode)
    if s.empty:
        return None
    above = s[s["gpus"] > s["baseline_gpus"]]
    clean, aside = above[above["clean"]], above[~above["clean"]]
    name = f"{mode} scaling ({tex_escape(s['series'].iloc[0])})"
    if clean.empty:
        return (
            f"{name} has no clean point beyond N={int(s['baseline_gpus'].iloc[0])} yet"
            if not aside.empty
            else f"{name} has only its baseline"
        )
    effs = listing([f"{pct(e)} at N={int(n)}" for n, e in zip(clean["gpus"], clean["efficiency"])])
    out = f"{name} reaches an efficiency of {effs} against N={int(s['baseline_gpus'].iloc[0])}"
    if not aside.empty:
        out += f" (N={', '.join(str(int(n)) for n in aside['gpus'])} set aside)"
    return out


def rq1(scal: pd.DataFrame) -> str:
    parts = [a for a in (scaling_answer(scal, "strong"), scaling_answer(scal, "weak")) if a]
    if not parts:
        return "RQ1 (how far it scales) stays open: no scaling series is selected."
    return "RQ1 (how far it scales): " + "; ".join(parts) + "."


def rq2(bt: pd.DataFrame) -> str:
    if bt.empty:
        return "RQ2 (what limits it) stays open: no record carries a bottleneck verdict."
    top = bt.loc[bt["gpus"].idxmax()]
    out = (
        "RQ2 (what limits it): the verdict is "
        + listing([f"\\emph{{{tex_escape(v)}}} at N={int(n)}" for n, v in zip(bt["gpus"], bt["verdict"])])
        + f"; at N={int(top['gpus'])} the ranks wait for data "
        + (f"{top['data_wait']:.1f}\\,\\%" if top["data_wait"] is not None else "an unmeasured share")
        + " of the step"
    )
    if top["comm"] is not None:
        out += f" and communication not hidden by backward takes {tex_escape(top['comm'])}\\,\\%"
    return out + "."


def rq3(gains: pd.DataFrame, scal: pd.DataFrame) -> str:
    parts = []
    if not gains.empty:
        best = gains.loc[gains["speedup"].idxmax()]
        parts.append(
            f"the largest measured gain is {tex_escape(best['factor'])} ({tex_escape(best['before'])} to "
            f"{tex_escape(best['after'])}), {100 * (best['speedup'] - 1):+.0f}\\,\\% at N={int(best['gpus'])}"
        )
    s = main_series(scal, "strong")
    s = s[s["clean"] & s["acc_gap_points"].notna() & (s["gpus"] > s["baseline_gpus"])] if not s.empty else s
    if not s.empty:
        worst = s.loc[s["acc_gap_points"].abs().idxmax()]
        parts.append(
            f"the final accuracy at N={int(worst['gpus'])} differs from the baseline's by "
            f"{worst['acc_gap_points']:+.2f} points"
        )
    if not parts:
        return "RQ3 (which settings help, at what accuracy cost) stays open: no before/after pair is selected."
    return "RQ3 (which settings help, at what accuracy cost): " + "; ".join(parts) + "."


def targets(crit: pd.DataFrame) -> str:
    if crit is None or crit.empty:
        return ""
    n = crit["status"].value_counts()
    return (
        f"Of the briefs' {len(crit)} targets, {int(n.get('met', 0))} are met, {int(n.get('not met', 0))} are not "
        f"met and {int(n.get('not measured', 0))} are not measured yet (Table~\\ref{{tab:criteria}})."
    )


def text(ctx: Context) -> str:
    scal = ctx.results.get("scaling", pd.DataFrame())
    hardware = tex_escape(", ".join(sorted(ctx.hardware))) or "no hardware yet"
    lines = [
        f"On the selected records ({hardware}):",
        rq1(scal),
        rq2(ctx.results.get("bottleneck", pd.DataFrame())),
        rq3(ctx.results.get("gains", pd.DataFrame()), scal),
        targets(ctx.results.get("criteria")),
    ]
    return " ".join(x for x in lines if x) + "\n"


def section(ctx: Context) -> None:
    ctx.put("conclusion.tex", text(ctx))
