"""The criteria table: every target of the briefs judged met / not met / not measured (kernels/analysis/criteria.py;
the criteria come from the registered workloads' reporting modules, in their order).

Writes tables/criteria_table.tex (the tabular; the paper and the proposal float it as tab:criteria) and the macros
\\labCriteriaMet, \\labCriteriaNotMet, \\labCriteriaNotMeasured. Set-aside points and
contended runs never judge a criterion.
"""

from __future__ import annotations

import pandas as pd

from kernels.analysis import runs as analysis, criteria
from kernels.analysis.trust import quiet
from kernels.report.context import Context
from kernels.analysis.tex import tex_escape

COLUMNS = {
    "short": ("Criterion", "raw"),
    "target": ("Target", "raw"),
    "status": ("Verdict", "raw"),
    "detail": ("Measured, or the study that measures it", "raw"),
}
STATUS_TEX = {
    criteria.MET: "\\textbf{met}",
    criteria.NOT_MET: "\\textbf{not met}",
    criteria.NOT_MEASURED: "not measured",
}


def all_criteria() -> list:
    from kernels.workloads import registered, reporting_of

    return [c for m in map(reporting_of, registered()) if m is not None for c in getattr(m, "CRITERIA", ())]


def table(ctx: Context) -> pd.DataFrame:
    runs = quiet(ctx.runs)
    tables = {
        "runs": runs,
        "scaling": ctx.results.get("scaling", pd.DataFrame()),
        "gains": ctx.results.get("gains", pd.DataFrame()),
        "together": analysis.optimisations_together(runs),
        "bench_dirs": [ctx.out / "bench"],  # benchmark records beside the repository's (analysis/benchmarks.py)
    }
    return criteria.judge(all_criteria(), tables)


def target_tex(threshold: str) -> str:
    """A threshold with its comparison typeset: >= 70 % as $\\geq$ 70 %."""
    out = tex_escape(threshold)
    for a, b in ((">=", "$\\geq$"), ("<=", "$\\leq$"), ("> ", "$>$ "), ("< ", "$<$ ")):
        out = out.replace(tex_escape(a), b)
    return out


def tabular(t: pd.DataFrame) -> str:
    """The criteria as a tabular, grouped by the brief that sets them (a row naming it), each with its line."""
    rag = ">{\\raggedright\\arraybackslash}"
    lines = [
        f"\\begin{{tabular}}{{@{{}}{rag}p{{0.27\\linewidth}}{rag}p{{0.2\\linewidth}}l{rag}p{{0.3\\linewidth}}@{{}}}}",
        "\\toprule",
        " & ".join(h for h, _ in COLUMNS.values()) + r" \\",
    ]
    for brief, g in t.groupby("brief_title", sort=False):
        lines += ["\\midrule", f"\\multicolumn{{4}}{{@{{}}l}}{{\\textit{{{tex_escape(brief)}}}, line}} \\\\"]
        for r in g.itertuples():
            detail = (
                r.value
                if r.value
                else r.evidence.removeprefix("lab study submit ")
                if r.evidence.startswith("lab ")
                else r.evidence
            )
            cells = [
                f"{r.short} {{\\tiny {r.line}}}",
                target_tex(r.threshold),
                STATUS_TEX[r.status],
                tex_escape(detail),
            ]
            lines.append(" & ".join(cells) + r" \\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "{\\scriptsize\n" + "\n".join(lines) + "\n}\n"


def section(ctx: Context) -> None:
    t = table(ctx)
    ctx.put("criteria_table.tex", tabular(t))
    counts = t["status"].value_counts()
    ctx.macro("labCriteriaMet", int(counts.get(criteria.MET, 0)))
    ctx.macro("labCriteriaNotMet", int(counts.get(criteria.NOT_MET, 0)))
    ctx.macro("labCriteriaNotMeasured", int(counts.get(criteria.NOT_MEASURED, 0)))
    ctx.macro("labCriteriaCount", len(t))
    ctx.results["criteria"] = t
