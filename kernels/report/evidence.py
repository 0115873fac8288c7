"""What a resource request may be priced from, and the pilot job that produces it where nothing may.

The nearest evidence for a GPU-hour request is a record of the proposed workload on the target system's GPU
model: on the proposed data set, or on synthetic data standing in for it (the workload shapes its synthetic set
as its own data, so a step costs the same; its time per sample is scaled to the data set's published size).
Records of another workload, or of another GPU model, price nothing. Where the selected records hold none that
may, the pilot records committed with the lab (results/pilot/runs, written by `make bench-gpu` on a lent GPU) are
the next evidence, under the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kernels.analysis.tex import listing, tex_escape
from kernels.base.flops import PEAK_TFLOPS
from kernels.base.files import PROJECT_ROOT, in_project
from kernels.data import DATASETS
from kernels.workloads import registered

PILOT_LABEL = "pilot"  # the pilot job's label; paper/plan.yaml selects it
PILOT_EPOCHS = 2  # the first epoch compiles and warms up; the second is the one a request is priced from
PILOT_DIR = PROJECT_ROOT / "results" / "pilot"  # pilot records committed with the lab: PILOT_DIR/runs/<run_id>


@dataclass(frozen=True)
class Proposed:
    """One of the plan's workloads ("ResNet-18 on CIFAR-10") as the lab names it."""

    workload: str  # a registered workload, e.g. resnet18
    dataset: str  # a data set of the registry, e.g. cifar10
    title: str  # the plan's words


def _norm(text: str) -> str:
    return "".join(ch for ch in str(text).lower() if ch.isalnum())


def proposed(plan: dict) -> list[Proposed]:
    """The plan's workloads that name a registered workload and one of its data sets (the longest name that
    fits: 'Fashion-MNIST' is not 'MNIST'); a title naming neither is left out."""
    out = []
    for title in plan.get("workloads") or []:
        words = _norm(title)
        for wl in registered():
            sets = sorted((d for d in wl.datasets if _norm(d) in words), key=len, reverse=True)
            if _norm(wl.name) in words and sets:
                out.append(Proposed(wl.name, sets[0], title))
                break
    return out


def device_class(name: str) -> str | None:
    """The accelerator family of a device or system description ('h100', 'a100', ...), by the peak table's keys."""
    low = name.lower()
    for key, _ in PEAK_TFLOPS:
        if key in low:
            return key
    return None


def on_target(runs: pd.DataFrame, system: dict) -> pd.DataFrame:
    """The runs measured on the target system's GPU model (none when its model is not in the peak table)."""
    target = device_class(system["gpu"])
    return runs[[target is not None and device_class(d) == target for d in runs["device"]]] if not runs.empty else runs


def stand_ins(runs: pd.DataFrame, plan: dict) -> pd.DataFrame:
    """Records of a proposed workload on synthetic data, standing in for its proposed data set when that set has
    a published training size: the time per epoch becomes the record's time per sample times that size."""
    parts = []
    for p in proposed(plan):
        size = DATASETS[p.dataset].train_samples
        if not size or runs.empty:
            continue
        of = runs[(runs["workload"] == p.workload) & (runs["dataset"] == "synthetic")]
        if of.empty:
            continue
        seen = of["steps_per_epoch"] * of["batch"]
        per_sample = of["epoch_s"].fillna(seen / of["samples_per_s"]) / seen
        parts.append(
            of.assign(
                epoch_s=per_sample * size,
                steps_per_epoch=size // of["batch"],
                stand_in_for=DATASETS[p.dataset].title,
                stand_in_size=size,
            )
        )
    return pd.concat(parts) if parts else runs.iloc[0:0]


def proposed_runs(runs: pd.DataFrame, plan: dict, system: dict) -> tuple[pd.DataFrame, str]:
    """The runs a request may be priced from: the proposed workload and data set (paper/plan.yaml: workloads)
    on the target system's GPU model, else synthetic-data records of it standing in (stand_ins). CPU epochs of
    a small data set say nothing about GPU hours. Returns (those runs, why none qualifies; empty when some do)."""
    if runs.empty:
        return runs, "no complete run records"
    wanted = [_norm(w) for w in plan.get("workloads") or []]
    of_workload = runs[
        [any(_norm(w) in x and _norm(d) in x for x in wanted) for w, d in zip(runs["workload"], runs["dataset"])]
    ]
    synthetic = stand_ins(runs, plan)
    measured = on_target(of_workload, system)
    if measured.empty:
        measured = on_target(synthetic, system)
    if not measured.empty:
        return measured, ""
    ran = listing(sorted({f"{w} on {d}" for w, d in zip(runs["workload"], runs["dataset"])}))
    if of_workload.empty and synthetic.empty:
        return measured, (
            f"the selected records ran {tex_escape(ran)}, not the proposed "
            f"{tex_escape(listing(plan.get('workloads') or []))}"
        )
    hw = listing(sorted(set(of_workload["device"]) | set(synthetic["device"])))
    return measured, (
        f"the selected records of {tex_escape(listing(plan.get('workloads') or []))} ran on "
        f"{tex_escape(hw)}, not on the {tex_escape(system['gpu'])} of {tex_escape(system['name'])}"
    )


def stand_in_note(runs: pd.DataFrame) -> str:
    """A sentence saying which priced records ran synthetic data in place of the proposed set ("" when none)."""
    if "stand_in_for" not in runs or runs["stand_in_for"].isna().all():
        return ""
    first = runs[runs["stand_in_for"].notna()].iloc[0]
    return (
        f"{'These records' if len(runs) > 1 else 'This record'} ran synthetic data of the shape "
        f"{tex_escape(first['stand_in_for'])} has (the same model and step); "
        f"{'their' if len(runs) > 1 else 'its'} time per sample is scaled to the set's "
        f"{int(first['stand_in_size']):,} training samples. "
    )


def pilot_params(plan: dict) -> dict:
    """The pilot job's parameters: the first proposed workload on its data set, PILOT_EPOCHS epochs, labelled
    PILOT_LABEL ({} when the plan names no registered workload)."""
    wanted = proposed(plan)
    if not wanted:
        return {}
    return {"workload": wanted[0].workload, "dataset": wanted[0].dataset, "epochs": PILOT_EPOCHS, "label": PILOT_LABEL}


def pilot_command(plan: dict) -> str:
    """The one job whose record prices the request: pilot_params on one GPU of the target system ("" when the
    plan names no registered workload)."""
    params = pilot_params(plan)
    if not params:
        return ""
    key = plan["system"]
    cluster = key if (PROJECT_ROOT / "clusters" / f"{key}.yaml").is_file() else "PROFILE"
    return f"lab submit notebooks/01_train.ipynb --gpus 1 --cluster {cluster} " + " ".join(
        f"-p {k} {v}" for k, v in params.items()
    )


def committed_pilots(pilot_dir: Path | None) -> pd.DataFrame:
    """The complete pilot records under pilot_dir/runs (an empty frame where there are none)."""
    from kernels.analysis.runs import load_runs

    if pilot_dir is None or not (Path(pilot_dir) / "runs").is_dir():
        return pd.DataFrame()
    return load_runs(Path(pilot_dir) / "runs", {"labels": [PILOT_LABEL]})[0]


def committed_pilot_runs(pilot_dir: Path | None, plan: dict, system: dict) -> tuple[pd.DataFrame, str]:
    """(the committed pilot records that may price the request, by proposed_runs' rules; a clause saying what
    the committed ones ran where none may, "" where there are none at all)."""
    pilots = committed_pilots(pilot_dir)
    if pilots.empty:
        return pilots, ""
    runs, why = proposed_runs(pilots, plan, system)
    if not why:
        return runs, ""
    ran = listing(sorted({f"{w} on {d}" for w, d in zip(pilots["workload"], pilots["dataset"])}))
    hw = listing(sorted(set(pilots["device"])))
    return runs, f"nor did the pilot records committed with the lab, which ran {tex_escape(ran)} on {tex_escape(hw)}"


def pilot_basis(runs: pd.DataFrame, pilot_dir: Path) -> str:
    """Where the committed pilot records that price the request live, for the request's sentence."""
    where = in_project(pilot_dir)
    ids = tex_escape(listing(sorted(runs["run_id"].astype(str))))
    return (
        f"the pilot record{'s' if len(runs) > 1 else ''} committed with the lab ({tex_escape(f'{where}/runs')}: {ids})"
    )
