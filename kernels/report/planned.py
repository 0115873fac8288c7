"""The planned study the proposal costs: the points of the study files that paper/plan.yaml names.

The request is priced from these files, as they will be submitted (`lab study submit`), not from a
summary typed into the plan: every point's GPU count, epochs and repeat come from its study file.
"""

from __future__ import annotations

import pandas as pd

from kernels.base.errors import ConfigError
from kernels.base.files import PROJECT_ROOT
from kernels.base.params import default
from kernels.analysis.tex import listing, tex_escape

MODES = {"strong": "strong scaling", "weak": "weak scaling", "sweep": "a sweep"}


def planned_points(plan: dict, where: str = "paper/plan.yaml") -> pd.DataFrame:
    """One row per run of the plan's studies: study, mode, gpus, epochs, repeat, and what a sweep varies."""
    from kernels.slurm import study

    studies = plan.get("studies") or []
    if not studies:
        raise ConfigError(
            f"{where}: key 'studies' must list the study files the proposal costs, e.g. [studies/strong_resnet18.yaml]"
        )
    rows = []
    for ref in studies:
        try:
            s = study.load(PROJECT_ROOT / ref)
        except ConfigError as e:
            raise ConfigError(f"{where}: key 'studies': {e}") from None
        keys = set().union(*(q.params for q in s.points)) - {"run_id", "seed"}
        swept = (
            sorted(k for k in keys if len({repr(q.params.get(k)) for q in s.points}) > 1) if s.mode == "sweep" else []
        )
        for p in s.points:
            rows.append(
                {
                    "study": s.name,
                    "mode": s.mode,
                    "gpus": int(p.gpus),
                    "repeat": int(p.repeat),
                    "epochs": int(p.params.get("epochs", default("epochs"))),
                    "swept": " x ".join(swept),
                }
            )
    return pd.DataFrame(rows)


def describe(points: pd.DataFrame) -> str:
    """The study design in one sentence per study, from its points."""
    parts = []
    for name, g in points.groupby("study", sort=False):
        mode = g["mode"].iloc[0]
        swept = tex_escape(g["swept"].iloc[0]).replace(" x ", " $\\times$ ")
        how = MODES.get(mode, mode) + (f" of {swept}" if mode == "sweep" and swept else "")
        gpus = sorted(g["gpus"].unique())
        epochs = sorted(g["epochs"].unique())
        parts.append(
            f"\\texttt{{{tex_escape(name)}}} ({how} at {listing([str(n) for n in gpus])} GPU"
            f"{'s' if gpus != [1] else ''}, {listing([str(e) for e in epochs])} epochs, "
            f"{int(g['repeat'].max()) + 1} repeats: {len(g)} runs)"
        )
    return "The planned runs are those of the study files: " + "; ".join(parts) + "."
