"""The criteria section: every project target judged met / not met / not measured (kernels/criteria.py).

Writes tables/criteria_table.tex (a full-width table, tab:criteria) and the macros
\\labCriteriaMet, \\labCriteriaNotMet, \\labCriteriaNotMeasured. Set-aside points and
contended runs never judge a criterion.
"""
from __future__ import annotations

import pandas as pd

from kernels import analysis, criteria
from kernels.report.context import Context
from kernels.report.request import quiet
from kernels.report.tex import booktabs, tex_escape

COLUMNS = {"what": ("Criterion (source)", "raw"), "threshold": ("Target", "s"), "status": ("Verdict", "raw"),
           "detail": ("Measured, or how to measure", "raw")}
STATUS_TEX = {criteria.MET: "\\textbf{met}", criteria.NOT_MET: "\\textbf{not met}",
              criteria.NOT_MEASURED: "not measured"}


def table(ctx: Context) -> pd.DataFrame:
    runs = quiet(ctx.runs)
    scal = ctx.results.get("scaling", pd.DataFrame())
    return criteria.judge(runs, scal, ctx.results.get("gains", pd.DataFrame()),
                          analysis.optimisations_together(runs), analysis.dcrnn_table(runs))


def section(ctx: Context) -> None:
    t = table(ctx)
    shown = t.assign(
        what=[f"{tex_escape(r.definition)} \\emph{{({tex_escape(r.source)})}}" for r in t.itertuples()],
        status=[STATUS_TEX[s] for s in t["status"]],
        detail=[(tex_escape(r.value) + ": " if r.value else "") +
                (f"\\texttt{{{tex_escape(r.evidence)}}}" if r.status == criteria.NOT_MEASURED
                 and r.evidence.startswith("lab ") else tex_escape(r.evidence)) for r in t.itertuples()])
    ctx.put("criteria_table.tex",
            "\\begin{table*}[t]\\centering\n\\caption{The project's targets as criteria, judged on the selected "
            "records (set-aside points excluded)}\\label{tab:criteria}\n"
            + booktabs(shown, COLUMNS, size="\\footnotesize",
                       spec="@{}p{0.42\\linewidth}p{0.1\\linewidth}lp{0.34\\linewidth}@{}") + "\\end{table*}\n")
    counts = t["status"].value_counts()
    ctx.macro("labCriteriaMet", int(counts.get(criteria.MET, 0)))
    ctx.macro("labCriteriaNotMet", int(counts.get(criteria.NOT_MET, 0)))
    ctx.macro("labCriteriaNotMeasured", int(counts.get(criteria.NOT_MEASURED, 0)))
    ctx.macro("labCriteriaCount", len(t))
    ctx.results["criteria"] = t
