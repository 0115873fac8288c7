"""What a resource request may be priced from, and the pilot job that produces it where nothing may.

The nearest evidence for a GPU-hour request is a record of the proposed workload on the target system's GPU
model: on the proposed data set, or on synthetic data standing in for it (the workload shapes its synthetic set
as its own data, so a step costs the same; its time per sample is scaled to the data set's published size).
Records of another workload, or of another GPU model, price nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from kernels.analysis.tex import listing, tex_escape
from kernels.base.flops import PEAK_TFLOPS
from kernels.base.files import PROJECT_ROOT
from kernels.data import DATASETS
from kernels.workloads import registered

PILOT_LABEL = "pilot"  # the pilot job's label; paper/plan.yaml selects it
PILOT_EPOCHS = 2  # the first epoch compiles and warms up; the second is the one a request is priced from


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
        f"These records ran synthetic data of the shape {tex_escape(first['stand_in_for'])} has (the same model "
        f"and step); their time per sample is scaled to its {int(first['stand_in_size']):,} training samples. "
    )


def pilot_command(plan: dict) -> str:
    """The one job whose record prices the request: one GPU of the target system, the first proposed workload
    on its data set, PILOT_EPOCHS epochs, labelled PILOT_LABEL ("" when the plan names no registered workload)."""
    wanted = proposed(plan)
    if not wanted:
        return ""
    key = plan["system"]
    cluster = key if (PROJECT_ROOT / "clusters" / f"{key}.yaml").is_file() else "PROFILE"
    return (
        f"lab submit notebooks/01_train.ipynb --gpus 1 --cluster {cluster} -p workload {wanted[0].workload} "
        f"-p dataset {wanted[0].dataset} -p epochs {PILOT_EPOCHS} -p label {PILOT_LABEL}"
    )
