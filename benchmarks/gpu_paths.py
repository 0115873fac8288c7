"""The GPU paths that throughput rows do not prove, each run once and judged: part of `make bench-gpu`.

1. DDP with torch.compile (and CUDA graphs where they are on) and no_sync micro-batches: 2 ranks sharing one
   GPU over gloo (backend=gloo), 2 micro-batches each (the first under no_sync), against 1 rank with 4
   micro-batches on the same global batch (the same BatchNorm groups of 8), one step. The
   weight updates must agree as on a CPU (relative difference < 1e-4 after one step, no weight more than 1e-5
   apart), and a real error (BatchNorm over the whole batch: 1 rank, 1 micro-batch) must be far outside (> 0.5).
   On a CPU this is the test suite's one-step DDP check (the harness test runs it).
2. fp16 with the GradScaler, stopped at a step and resumed from its checkpoint, against the uninterrupted
   run: the same steps, the same loss scale, and weights as close as a second uninterrupted run is to the
   first (cuDNN's autotuner may choose other kernels in another process, so the floor is measured, not 0).
   On a CPU (no fp16) the harness check runs bf16, at width 4 (a CPU without bf16 units emulates it: 0.8 s a
   step at width 8 on the 2-core test VM, 0.24 s at width 4).

Each check returns Markdown lines and whether it passed; the sizes are tiny (ResNet-18 at width 8, digits),
so the checks cost seconds of compute beyond each process's start and compile.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import torch

import benchtable  # benchmarks/, this script's directory

ROOT = Path(__file__).resolve().parent.parent

TINY = {
    "dataset": "digits",
    "width": 8,
    "train_samples": 128,
    "test_samples": 64,
    "batch": 32,
    "seed": 3,
    "epochs": 1,
    "num_workers": 0,
    "timing_warmup_steps": 0,
    "comm_probe_steps": 0,
    "log_every": 0,
    "monitor_hz": 0,
    "eval_every": 0,
}


def train(results: Path, run_id: str, **params) -> tuple[subprocess.CompletedProcess, Path]:
    cmd = benchtable.train_command({**TINY, **params, "results_dir": results, "run_id": run_id})
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600), results / run_id


def weights(run_dir: Path) -> tuple[torch.Tensor, dict]:
    """The trained parameters, flat (BatchNorm statistics left out: per rank under DDP), and the whole state."""
    from kernels.records import checkpoint_file as checkpoint

    state, problem = checkpoint.read_state(run_dir / "checkpoint.pt")
    if state is None:
        raise RuntimeError(f"{run_dir.name}: no readable checkpoint ({problem})")
    params = [v.float().flatten() for k, v in state["model"].items() if "running" not in k and "num_batches" not in k]
    return torch.cat(params), state


def _failed(p: subprocess.CompletedProcess, what: str) -> str | None:
    if p.returncode == 0:
        return None
    return f"{what} failed: {((p.stderr or p.stdout).strip().splitlines() or ['exit ' + str(p.returncode)])[-1][:200]}"


def ddp_pair(cuda: bool, compile: bool = True) -> tuple[list[str], bool]:
    """Check 1 (module doc)."""
    dev = {"device": "cuda", "backend": "gloo", "compile": compile} if cuda else {"device": "cpu"}
    one = {"stop_after_steps": 1, "lr": 0.2, "lr_warmup_epochs": 0, "precision": "fp32"}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        runs = {
            "init": train(tmp, "init", gpus=1, **{**dev, "compile": False}, **{**one, "lr": 1e-30}),
            "ddp": train(tmp, "ddp", gpus=2, micro_batches=2, **dev, **one),
            "single": train(tmp, "single", gpus=1, micro_batches=4, **dev, **one),
            "wrong": train(tmp, "wrong", gpus=1, **{**dev, "compile": False}, **one),
        }
        errors = [e for name, (p, _) in runs.items() if (e := _failed(p, name))]
        if errors:
            return [f"- DDP pair: {'; '.join(errors)}"], False
        (i, _), (a, _), (b, _), (c, _) = (weights(d) for _, d in runs.values())
    rel = float(((a - i) - (b - i)).norm() / (a - i).norm())
    wrong = float(((a - i) - (c - i)).norm() / (a - i).norm())
    largest = float((a - b).abs().max())
    ok = rel < 1e-4 and largest < 1e-5 and wrong > 0.5
    how = (
        f"2 ranks sharing one GPU over gloo, torch.compile {'on' if compile else 'off'}"
        if cuda
        else "2 gloo ranks on the CPU"
    )
    return [
        f"- DDP pair ({how}, 2 micro-batches each, the first under no_sync): relative difference of the "
        f"one-step update against 1 rank x 4 micro-batches {rel:.2e} (asked < 1e-4), largest weight difference "
        f"{largest:.1e} (asked < 1e-5); the negative control (BatchNorm over "
        f"the whole batch) {wrong:.2f} (asked > 0.5): **{'pass' if ok else 'FAIL'}**"
    ], ok


def fp16_resume(cuda: bool) -> tuple[list[str], bool]:
    """Check 2 (module doc)."""
    prec = "fp16" if cuda else "bf16"
    dev = {"device": "cuda", "compile": False} if cuda else {"device": "cpu", "width": 4}
    # a small learning rate: at the default 0.1 this tiny model is chaotic, and two uninterrupted fp16 runs (cuDNN's
    # autotuner choosing per process) ended 17 % apart on an H200, a floor no resume error could stand out from
    common = {"gpus": 1, "epochs": 2, "precision": prec, "lr": 0.005, "lr_warmup_epochs": 0, **dev}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        full, d_full = train(tmp / "a", "r", **common)
        again, d_again = train(tmp / "b", "r", **common)
        stop, d_part = train(tmp / "c", "r", **common, stop_after_steps=3)
        resumed, _ = train(tmp / "c", "r", **common)
        errors = [
            e
            for p, what in (
                (full, "full run"),
                (again, "second full run"),
                (stop, "stopped run"),
                (resumed, "resumed run"),
            )
            if (e := _failed(p, what))
        ]
        if errors:
            return [f"- {prec} stop and resume: {'; '.join(errors)}"], False
        (a, sa), (b, _), (c, sc) = weights(d_full), weights(d_again), weights(d_part)
    resumed_ok = "resuming r from epoch 1 step 3" in resumed.stdout
    floor, diff = float((a - b).norm() / a.norm()), float((a - c).norm() / a.norm())
    scale = [s.get("scaler", {}).get("scale") if isinstance(s.get("scaler"), dict) else None for s in (sa, sc)]
    ok = (
        resumed_ok and sa["global_step"] == sc["global_step"] and scale[0] == scale[1] and diff <= max(10 * floor, 1e-6)
    )
    return [
        f"- {prec}{' + GradScaler' if cuda else ''} stopped at step 3 and resumed: steps {sc['global_step']} "
        f"of {sa['global_step']}, loss scale {scale[1]} against {scale[0]}, weights' relative difference "
        f"{diff:.2e} against {floor:.2e} between two uninterrupted runs (asked <= 10x that, or 1e-6): "
        f"**{'pass' if ok else 'FAIL'}**"
    ], ok
