"""The pilot job the proposal names, on the GPU at hand: part of `make bench-gpu` (its section `pilot`).

The proposal prices its GPU-hour request from a record of its workload on the target system's GPU model; where
no selected record is one, it names one pilot job (kernels/report/evidence.pilot_params, from paper/plan.yaml:
the first proposed workload, 2 epochs, label pilot). This runs that job on one GPU of this machine with the data
set's synthetic stand-in at the data set's training size (the same model and step; the evidence rules scale a
synthetic record's time per sample to the set's size), and keeps its record's JSON and CSV files (not its
checkpoints) under <pilot dir>/runs/pilot-<gpu>: results/pilot/ beside results/bench/, committed with the lab.
The documents price the request from it wherever the target system has this GPU model and the selection holds
no record that may (kernels/report/request.py).

--tiny (the harness's CPU check): a few batches of a narrow model; the record says CPU and prices nothing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import benchtable  # benchmarks/, this script's directory

ROOT = Path(__file__).resolve().parent.parent
KEPT = ("*.json", "*.csv", "monitor/*.csv")  # the record the analysis reads; checkpoints stay behind


def proposed_pilot() -> dict:
    """The pilot job's parameters as the proposal names them (paper/plan.yaml; {} when it names no workload)."""
    from kernels.base import yamlfile
    from kernels.report.evidence import pilot_params

    return pilot_params(yamlfile.read(ROOT / "paper" / "plan.yaml", "plan"))


def params(pilot: dict, tiny: bool, batch: int, workers: int, cuda: bool) -> dict:
    """The pilot's parameters with its data set swapped for the synthetic stand-in of the set's size."""
    from kernels.data import DATASETS

    size = DATASETS[pilot["dataset"]].train_samples
    sized = (
        {"train_samples": batch * 3, "test_samples": batch, "batch": batch, "width": 4}
        if tiny
        else {"train_samples": size, "test_samples": max(1, size // 5)}
    )
    cpu = {} if cuda else {"precision": "fp32"}  # bf16 is emulated, and slow, on most CPUs
    machine = {"gpus": 1, "num_workers": workers, "oversubscribe": not cuda}
    return {**pilot, "dataset": "synthetic", **machine, **sized, **cpu}


def keep(record: Path, dest: Path) -> list[str]:
    """Copy the record's JSON and CSV files to dest (replacing an older pilot there); the names copied."""
    from kernels.base.files import atomic_write_bytes, foreign

    bad = foreign(dest.parent) or foreign(dest)
    if bad:
        raise RuntimeError(f"not writing the pilot record: {bad}")
    if dest.is_dir():
        shutil.rmtree(dest)
    names = sorted({str(p.relative_to(record)) for pattern in KEPT for p in record.glob(pattern) if p.is_file()})
    for name in names:
        atomic_write_bytes(dest / name, (record / name).read_bytes())
    return names


def run(tiny: bool, batch: int, workers: int, cuda: bool, device_name: str, pilot_dir: Path) -> tuple[list[str], bool]:
    """Markdown lines for the validation's table and whether the pilot completed."""
    from kernels.base.files import in_project

    pilot = proposed_pilot()
    if not pilot:
        return ["paper/plan.yaml names no registered workload to pilot (its `workloads`).", ""], True
    p = params(pilot, tiny, batch, workers, cuda)
    run_id = f"pilot-{benchtable.slug(device_name)}"
    dest = pilot_dir / "runs" / run_id
    try:
        with benchtable.trained(p, timeout=900, run_id=run_id) as record:
            names = keep(record, dest)
    except RuntimeError as e:
        return [f"The pilot: {e}", ""], False
    s = json.loads((dest / "summary.json").read_text())
    ran = json.loads((dest / "config.json").read_text())["params"]
    epoch, rate = s.get("epoch_s_median"), s.get("samples_per_s")
    size = "tiny: the harness check" if tiny else "the data set's training size"
    prices = priced_systems(str(s.get("device_name") or device_name))
    return [
        f"{p['workload']} on synthetic data of {pilot['dataset']}'s shape, {p['train_samples']:,} samples an epoch "
        f"({size}), {p['epochs']} epochs, one device, label {p['label']}: the job the proposal names to price its "
        f"request (kernels/report/evidence.pilot_params).",
        "",
        "| record | device | batch | precision | epoch (s, median) | samples/s | files kept |",
        "|---|---|---:|---|---:|---:|---|",
        f"| `{in_project(dest)}` | {s.get('device_name')} | {ran['batch']} | {ran['precision']} | "
        f"{f'{epoch:.2f}' if epoch else '-'} | {f'{rate:,.0f}' if rate else '-'} | {', '.join(names)} |",
        "",
        f"Target systems of paper/systems.yaml whose request it prices (the same GPU model): {prices}.",
        "",
    ], True


def priced_systems(device_name: str) -> str:
    """The target systems whose GPU model is this device's (kernels/report/evidence.device_class), in words."""
    from kernels.base import yamlfile
    from kernels.report.evidence import device_class

    mine = device_class(device_name)
    systems = yamlfile.read(ROOT / "paper" / "systems.yaml", "systems file")
    names = [v["name"] for v in systems.values() if mine is not None and device_class(v["gpu"]) == mine]
    return ", ".join(names) if names else "none, no system there has this GPU model"
