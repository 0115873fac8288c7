"""The lab's loop against the usual script, side by side: `make bench` or `python benchmarks/bench_seed.py`.

Both train the same ResNet-18 (CIFAR form) on the same synthetic CIFAR-shaped data at the same global
batch, precision and worker count, in one process sequence that alternates them (seed, lab, seed,
lab, ...) so the machine's drift falls on both. The lab side is `python -m kernels.train` with its
defaults for the device (device-resident pipeline; on CUDA also channels_last and torch.compile,
fused SGD, no per-step host sync); the seed side is benchmarks/seed_baseline.py. Each side's figure
is global batch / median step time over its timed steps; the table gives each repeat, the medians,
and the ratio as the median of the paired ratios with its range.

Defaults saturate a GPU (batch 512, 100 timed steps, bf16, width 64); on a CPU they are smaller
(batch 64, 30 timed steps, fp32, width 16) so the table takes minutes. On a CPU the ratio measures
the input pipeline and the loop's overheads (per-sample PIL transforms in worker processes that
compete with the training threads for the same cores, against batched tensor transforms), not the
GPU-side optimisations, which a CPU run does not exercise.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import benchtable  # noqa: E402  (benchmarks/, this script's directory)
from kernels import sysinfo  # noqa: E402


def run_seed(args) -> dict:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "seed_baseline.py"), "--batch", str(args.batch), "--steps",
           str(args.steps), "--warmup", str(args.warmup), "--workers", str(args.workers), "--width", str(args.width),
           "--precision", args.precision]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"the seed-style baseline failed: {(p.stderr or p.stdout).strip().splitlines()[-1:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def run_lab(args, **extra) -> dict:
    """The lab's side: its CLI with the device's defaults (pipeline, channels_last, compile), the same sizes."""
    s = benchtable.lab_run({"dataset": "synthetic", "gpus": 1, "batch": args.batch,
                            "train_samples": args.batch * (args.steps + args.warmup), "test_samples": args.batch,
                            "epochs": 1, "width": args.width, "precision": args.precision,
                            "num_workers": args.workers, "timing_warmup_steps": args.warmup, "comm_probe_steps": 0,
                            "log_every": 0, "checkpoint_every": 0, **extra})
    return {**s, **{k: s["params"][k] for k in ("compile", "channels_last", "pipeline")}}


def compare(args, **lab_extra) -> list[tuple[dict, dict]]:
    """args.repeats (seed-style, lab) pairs, run alternately."""
    pairs = []
    for i in range(args.repeats):
        seed = run_seed(args)
        lab = run_lab(args, **lab_extra)
        pairs.append((seed, lab))
        print(f"repeat {i + 1}: seed-style {seed['samples_per_s']:,.1f} samples/s, lab {lab['samples_per_s']:,.1f} "
              f"samples/s: {lab['samples_per_s'] / seed['samples_per_s']:.2f}x", flush=True)
    return pairs


def ratio_table(pairs: list[tuple[dict, dict]]) -> tuple[list[str], float]:
    """The Markdown rows (each repeat with its p10-p90, then the medians) and the median of the paired ratios."""
    ratios = [lab["samples_per_s"] / seed["samples_per_s"] for seed, lab in pairs]
    lines = ["| repeat | seed-style samples/s (p10-p90) | lab samples/s (p10-p90) | lab / seed |", "|---:|---:|---:|---:|"]
    for i, ((seed, lab), r) in enumerate(zip(pairs, ratios)):
        lines.append(f"| {i + 1} | {seed['samples_per_s']:,.1f} ({seed['samples_per_s_p10']:,.0f}-"
                     f"{seed['samples_per_s_p90']:,.0f}) | {lab['samples_per_s']:,.1f} ({lab['samples_per_s_p10']:,.0f}-"
                     f"{lab['samples_per_s_p90']:,.0f}) | {r:.2f}x |")
    ratio = statistics.median(ratios)
    lines.append(f"| median | {statistics.median(s['samples_per_s'] for s, _ in pairs):,.1f} | "
                 f"{statistics.median(lab['samples_per_s'] for _, lab in pairs):,.1f} | **{ratio:.2f}x** "
                 f"({min(ratios):.2f}-{max(ratios):.2f}) |")
    return lines, ratio


def main(argv=None) -> int:
    cuda = torch.cuda.is_available()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=512 if cuda else 64)
    ap.add_argument("--steps", type=int, default=100 if cuda else 30, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=10 if cuda else 5)
    ap.add_argument("--workers", type=int, default=4, help="DataLoader workers (the lab's num_workers default)")
    ap.add_argument("--width", type=int, default=64 if cuda else 16)
    ap.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="bf16" if cuda else "fp32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench")
    args = ap.parse_args(argv)
    name = sysinfo.device_name(torch.device("cuda", 0) if cuda else torch.device("cpu"))
    print(f"lab vs seed-style: ResNet-18 width {args.width}, batch {args.batch}, {args.precision}, {args.steps} timed "
          f"steps after {args.warmup}, {args.workers} workers, {args.repeats} repeats, on {name}", flush=True)
    try:
        pairs = compare(args)
    except RuntimeError as e:
        raise SystemExit(str(e)) from None
    rows, ratio = ratio_table(pairs)
    lab0 = pairs[0][1]
    lines = benchtable.header(f"the lab's loop against the seed-style script on {name}")
    lines += [f"ResNet-18 (CIFAR form, width {args.width}), synthetic CIFAR-shaped data, one process, global batch "
              f"{args.batch}, {args.precision}, {args.steps} timed steps after {args.warmup}, {args.workers} workers. "
              f"Lab: pipeline {lab0['pipeline']}, channels_last {str(lab0['channels_last']).lower()}, compile "
              f"{str(lab0['compile']).lower()}. Seed-style: per-sample PIL transforms in a DataLoader, DDP defaults, "
              f"loss.item() every step. samples/s = batch / median step time; runs alternate.", "", *rows, ""]
    if not cuda:
        lines.append("On a CPU this ratio measures the input pipeline and the loop's overheads (per-sample PIL "
                     "transforms in worker processes competing with training for the same cores, against batched "
                     "tensor transforms), not the GPU path (channels_last, compile, fused optimizer, no host syncs).")
    lines.append(f"Lab / seed-style: **{ratio:.2f}x** (median of {len(pairs)} paired ratios).")
    benchtable.write(lines, args.out, name, prefix="seed-vs-lab-")
    return 0


if __name__ == "__main__":
    sys.exit(main())
