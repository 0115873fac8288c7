"""Which scaling points may become a headline, and how to re-run the others.

A point (one configuration at one rank count, its repeats aggregated) is set aside, shown
but never quoted in the abstract, the request or the slides, when:
- contended: a repeat shared its cores or GPUs with foreign work (summary.json's
  `contention`, from the resource monitor and the allocation) and no quiet repeat of the
  point exists (a quiet re-run supersedes the contended repeats: `superseded`);
- superlinear: its efficiency exceeds 1 + EFFICIENCY_TOL (faster per rank than the
  baseline by more than cache effects plausibly give: usually a slowed baseline);
- spread: its repeats disagree, (max - min) / median above SPREAD_TOL;
- too few repeats: fewer complete repeats than its study asked for;
- baseline set aside: the point its speedup and efficiency are taken against is.
"""

from __future__ import annotations

import shlex

import pandas as pd

from kernels.base.params import COMMON

EFFICIENCY_TOL = 0.10  # efficiency above 110 % is not believed without a re-run
SPREAD_TOL = 0.20  # repeats more than 20 % of their median apart disagree
# never part of a re-run command: a new record gets a new id; the ranks record launcher=none (they are the ranks)
RUN_ONLY = ("run_id", "results_dir", "launcher")


# Why a point is set aside: a kind per reason (the documents count them by these words), its detail in `flags`.
REASON_WORDS = {
    "contended": "contended",
    "superlinear": "superlinear efficiency",
    "spread": "disagreeing repeats",
    "repeats": "too few repeats",
    "baseline": "measured against a set-aside baseline",
}


def contended(runs: pd.DataFrame) -> pd.Series:
    """True for the runs that foreign work shared cores or GPUs with (summary.json's contention)."""
    return runs["contended"].fillna(False).astype(bool) if "contended" in runs else pd.Series(False, index=runs.index)


def superseded(series: pd.DataFrame) -> pd.Series:
    """True for a contended run whose point (its rank count in the series) also has a quiet repeat: the quiet
    re-run measures the point, the contended one is left out of its median (and named in `superseded`)."""
    hit = contended(series)
    quiet_at = set(series.loc[~hit, "gpus"])
    return hit & series["gpus"].isin(quiet_at)


def quiet(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs no foreign work shared cores or GPUs with: the only ones a gain, a request or a criterion uses."""
    return runs if runs.empty else runs[~contended(runs)]


def point_reasons(agg: pd.DataFrame, series: pd.DataFrame) -> list[list[tuple[str, str]]]:
    """Per row of `agg` (a series' points, baseline first) its reasons to be set aside, [(kind, detail)]; [] when
    clean. series: the series' runs."""
    own = []
    for _, p in agg.iterrows():
        runs = series[series["gpus"] == p["gpus"]]
        why = []
        hit = runs[contended(runs)]
        if len(hit):
            why.append(("contended", f"contended ({', '.join(hit['run_id'])}: {hit['contention'].iloc[0]})"))
        if p["efficiency"] > 1 + EFFICIENCY_TOL:
            why.append(("superlinear", f"efficiency {p['efficiency']:.2f} above {1 + EFFICIENCY_TOL:.2f}"))
        if p["repeats"] > 1 and p["samples_per_s"]:
            spread = (p["samples_per_s_max"] - p["samples_per_s_min"]) / p["samples_per_s"]
            if spread > SPREAD_TOL:
                why.append(("spread", f"repeats {100 * spread:.0f} % apart (more than {100 * SPREAD_TOL:.0f} %)"))
        asked = pd.to_numeric(runs.get("study_repeats"), errors="coerce").max() if "study_repeats" in runs else None
        if asked and not pd.isna(asked) and p["repeats"] < asked:
            why.append(("repeats", f"{int(p['repeats'])} of {int(asked)} repeats"))
        own.append(why)
    base = ("baseline", f"baseline N={agg['gpus'].iloc[0]} set aside") if own and own[0] else None
    return [why + [base] if i and base else why for i, why in enumerate(own)]


def common_defaults(params: dict) -> dict:
    """The common parameters' defaults (a caller that can resolve a workload's own defaults passes better ones)."""
    return {p.name: p.default for p in COMMON}


def rerun_command(row: dict | pd.Series, defaults_of=common_defaults) -> str:
    """The notebook or CLI call that measures a run's configuration again: the record's parameters that differ
    from the defaults (defaults_of(params) -> {name: default}). Study runs are resubmitted instead (_commands)."""
    params, lab = row["params"], row.get("lab") or {}
    defaults = defaults_of(params)
    args = [
        (k, v)
        for k, v in params.items()
        if k not in RUN_ONLY and v is not None and (k not in defaults or v != defaults[k])
    ]
    notebook = lab.get("lab_notebook")
    if notebook:
        return shlex.join(
            ["lab", "run", f"notebooks/{notebook}.ipynb", *[x for k, v in args for x in ("-p", k, _text(v))]]
        )
    return shlex.join(["lab", "train", *[x for k, v in args for x in (f"--{k}", _text(v))]])


def _text(v) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def rerun_table(runs: pd.DataFrame, scal: pd.DataFrame, defaults_of=common_defaults) -> pd.DataFrame:
    """'Results to re-run': one row per set-aside point with reasons of its own (not only its baseline's), and
    the commands that re-run it (one per study, or one per distinct ad-hoc configuration)."""
    cols = ["series", "gpus", "repeats", "reasons", "commands"]
    if scal.empty or "flags" not in scal:
        return pd.DataFrame(columns=cols)
    rows = []
    for _, p in scal[~scal["clean"]].iterrows():
        mine = [(k, t) for k, t in p["reasons"] if k != "baseline"]  # a baseline's own row says what to re-run
        if not mine:
            continue
        kinds, own = {k for k, _ in mine}, "; ".join(t for _, t in mine)
        pick = runs[runs["run_id"].isin(p["run_ids"])]
        studies = sorted({(lab or {}).get("lab_study_id") for lab in pick["lab"]} - {None})
        if kinds == {"repeats"} and studies:  # only missing repeats: submit the missing points
            commands = [f"lab study resubmit studies/{sid}.yaml" for sid in studies]
        else:
            commands = _commands(pick[contended(pick)] if kinds == {"contended"} else pick, defaults_of)
        rows.append(
            {
                "series": p["series"],
                "gpus": int(p["gpus"]),
                "repeats": int(p["repeats"]),
                "reasons": own,
                "commands": commands,
            }
        )
    return pd.DataFrame(rows, columns=cols)


def _commands(runs: pd.DataFrame, defaults_of) -> list[str]:
    """Study runs: one resubmit per study with all their point indices; others: one command per configuration."""
    out: list[str] = []
    studies: dict[str, list[int]] = {}
    for _, r in runs.iterrows():
        sid = (r["lab"] or {}).get("lab_study_id")
        if sid and r["study_point_index"] is not None:
            studies.setdefault(sid, []).append(int(r["study_point_index"]))
            continue
        cmd = rerun_command(r, defaults_of)
        if cmd not in out:
            out.append(cmd)
    for sid, idx in studies.items():
        out.append(f"lab study resubmit studies/{sid}.yaml --points {','.join(map(str, sorted(set(idx))))}")
    return out
