"""The criteria's machinery: a target of the user's briefs, judged met / not met / not measured from the records.

The criteria themselves belong to the workloads whose briefs set them (a workload's reporting module holds
CRITERIA; kernels/workloads/base.py). Each `Criterion` cites the brief and the line that states its target
(../shared/briefs/, named in its README) and carries its own judge; `judge` runs them over the analysis tables.
A point set aside by kernels/analysis/trust.py (contended, superlinear, disagreeing or too few repeats) never
judges a criterion: the criterion is then "not measured" and names the re-run. "not measured" always says which
study or command would measure it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pandas as pd

MET, NOT_MET, NOT_MEASURED = "met", "not met", "not measured"


@dataclass(frozen=True)
class Brief:
    """One of the user's briefs: its file in ../shared/briefs and how the documents name it."""

    file: str
    title: str


@dataclass(frozen=True)
class Criterion:
    key: str
    short: str  # the paper's column
    brief: Brief
    line: int  # the brief's line that states the target
    definition: str
    threshold: str  # the target, as the lab judges it
    measure: str  # the study or command that measures it
    judge: Callable  # (criterion, tables) -> row (see `row`); tables: see `judge` below
    lab_threshold: bool = False  # the brief names the target but no number: the threshold is the lab's reading

    @property
    def source(self) -> str:
        return f"{self.brief.title}, line {self.line}"

    @property
    def cites(self) -> str:
        return f"{self.brief.file}:{self.line}"


def row(c: Criterion, status: str, value: str = "", evidence: str = "") -> dict:
    return {
        "key": c.key,
        "short": c.short,
        "source": c.source,
        "brief": c.cites,
        "brief_title": c.brief.title,
        "line": c.line,
        "definition": c.definition,
        "threshold": c.threshold + (" (the lab's reading)" if c.lab_threshold else ""),
        "status": status,
        "value": value,
        "evidence": evidence or (c.measure if status == NOT_MEASURED else ""),
    }


def set_aside(c: Criterion, point: pd.Series) -> dict:
    """Not measured: the point is set aside. The reasons by their kind only; the detail (which runs, how much
    foreign work) is the table of results to re-run's, beside the command."""
    from kernels.analysis.trust import REASON_WORDS

    reasons = point.get("reasons")
    why = ", ".join(dict.fromkeys(REASON_WORDS.get(k, k) for k, _ in reasons)) if reasons else point["flags"]
    return row(
        c,
        NOT_MEASURED,
        evidence=f"the N={int(point['gpus'])} point is set aside ({why}); re-run it (Table of results to re-run)",
    )


def judge(criteria, tables: dict) -> pd.DataFrame:
    """One row per criterion: key, short, source, brief (file:line), brief_title, line, definition, threshold, status,
    value, evidence (or how to measure). tables: runs (the quiet records), scaling, gains (each optimisation),
    together (all of them), bench_dirs (folders of benchmark records besides the repository's results/bench)."""
    cols = [
        "key",
        "short",
        "source",
        "brief",
        "brief_title",
        "line",
        "definition",
        "threshold",
        "status",
        "value",
        "evidence",
    ]
    return pd.DataFrame([c.judge(c, tables) for c in criteria], columns=cols)


def metric_value(row: dict, prefix: str) -> float | None:
    """The mean of a metrics row's columns named prefix or prefix_<label> (e.g. eval_mae_15min, ...)."""
    vals = [float(v) for k, v in row.items() if (k == prefix or k.startswith(prefix + "_")) and v not in (None, "")]
    return sum(vals) / len(vals) if vals else None


def last_value(metrics, prefix: str) -> float | None:
    vals = [v for v in (metric_value(m, prefix) for m in metrics or []) if v is not None]
    return vals[-1] if vals else None


def time_to(metrics, prefix: str, target) -> float | None:
    """Training seconds (epoch times summed) until the metric first reaches target (lower is better)."""
    if target is None:
        return None
    t = 0.0
    for m in metrics or []:
        t += float(m.get("epoch_s") or 0)
        v = metric_value(m, prefix)
        if v is not None and v <= target * (1 + 1e-9):
            return t
    return None
