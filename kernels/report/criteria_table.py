"""The criteria table: every project target judged met / not met / not measured (kernels/analysis/criteria.py).

Writes tables/criteria_table.tex (the tabular; the paper and the proposal float it as tab:criteria) and the macros
\\labCriteriaMet, \\labCriteriaNotMet, \\labCriteriaNotMeasured. Set-aside points and
contended runs never judge a criterion.
"""
from __future__ import annotations

import pandas as pd

from kernels.analysis import runs as analysis, criteria
from kernels.analysis.trust import quiet
from kernels.report.context import Context
from kernels.report.tex import booktabs, tex_escape

COLUMNS = {"short": ("Criterion", "raw"), "target": ("Target", "raw"), "status": ("Verdict", "raw"),
           "detail": ("Measured, or the study that measures it", "raw")}
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
        target=[tex_escape(x).replace(">=", "$\\geq$").replace("> ", "$>$ ") for x in t["threshold"]],
        status=[STATUS_TEX[x] for x in t["status"]],
        detail=[tex_escape(r.value) if r.value else
                tex_escape(r.evidence.removeprefix("lab study submit ")) if r.evidence.startswith("lab ")
                else tex_escape(r.evidence) for r in t.itertuples()])
    ctx.put("criteria_table.tex", booktabs(shown, COLUMNS, size="\\scriptsize",
                                           spec="@{}p{0.3\\linewidth}p{0.13\\linewidth}lp{0.33\\linewidth}@{}"))
    counts = t["status"].value_counts()
    ctx.macro("labCriteriaMet", int(counts.get(criteria.MET, 0)))
    ctx.macro("labCriteriaNotMet", int(counts.get(criteria.NOT_MET, 0)))
    ctx.macro("labCriteriaNotMeasured", int(counts.get(criteria.NOT_MEASURED, 0)))
    ctx.macro("labCriteriaCount", len(t))
    ctx.results["criteria"] = t
