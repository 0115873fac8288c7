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
compete with the training threads for the same cores, against batched tensor transforms) and the
memory format (channels_last, the lab's CPU default for ResNet-18 from width 16), not the GPU-side
optimisations, which a CPU run does not exercise.

`--ranks 1 2` (the CPU default) also runs both sides as 2 ranks on this node: the seed-style
script under torchrun, the lab through its own launcher, each rank with cores / ranks OMP threads
as Slurm's --cpus-per-task would give them, the global batch split between the ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import benchtable  # noqa: E402  (benchmarks/, this script's directory)
from kernels.base import ports, sysinfo  # noqa: E402


def run_seed(args, ranks: int = 1, channels_last: bool = False) -> dict:
    """The seed-style script as one process, or as `ranks` processes under torchrun on this node."""
    script = [
        str(ROOT / "benchmarks" / "seed_baseline.py"),
        "--batch",
        str(args.batch),
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--workers",
        str(args.workers),
        "--width",
        str(args.width),
        "--precision",
        args.precision,
        *(["--channels_last"] if channels_last else []),
    ]
    env = os.environ.copy()
    if ranks == 1:
        cmd = [sys.executable, *script]
    else:  # the cores a rank gets from Slurm's --cpus-per-task, as the lab's launcher sets them
        env["OMP_NUM_THREADS"] = sysinfo.threads_per_rank(ranks)
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(ranks),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(ports.free_port()),
            *script,
        ]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"the seed-style baseline failed: {(p.stderr or p.stdout).strip().splitlines()[-1:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def run_lab(args, ranks: int = 1, **extra) -> dict:
    """The lab's side: its CLI with the device's defaults (pipeline, channels_last, compile), the same sizes."""
    s = benchtable.lab_run(
        {
            "dataset": "synthetic",
            "gpus": ranks,
            "batch": args.batch,
            "train_samples": args.batch * (args.steps + args.warmup),
            "test_samples": args.batch,
            "epochs": 1,
            "width": args.width,
            "precision": args.precision,
            "num_workers": args.workers,
            "timing_warmup_steps": args.warmup,
            "comm_probe_steps": 0,
            "log_every": 0,
            "checkpoint_every": 0,
            **extra,
        }
    )
    return {**s, **{k: s["params"][k] for k in ("compile", "channels_last", "pipeline")}}


def compare(args, ranks: int = 1, **lab_extra) -> list[tuple[dict, dict]]:
    """args.repeats (seed-style, lab) pairs at `ranks` ranks, run alternately."""
    pairs = []
    for i in range(args.repeats):
        seed = run_seed(args, ranks)
        lab = run_lab(args, ranks, **lab_extra)
        pairs.append((seed, lab))
        print(
            f"{ranks} rank(s), repeat {i + 1}: seed-style {seed['samples_per_s']:,.1f} samples/s, lab "
            f"{lab['samples_per_s']:,.1f} samples/s: {lab['samples_per_s'] / seed['samples_per_s']:.2f}x",
            flush=True,
        )
    return pairs


def paired_ratios(pairs: list[tuple[dict, dict]]) -> list[float]:
    """lab / seed-style samples/s of each (seed-style, lab) pair."""
    return [lab["samples_per_s"] / seed["samples_per_s"] for seed, lab in pairs]


def ratio_table(pairs: list[tuple[dict, dict]]) -> tuple[list[str], float]:
    """The Markdown rows (each repeat with its p10-p90, then the medians) and the median of the paired ratios."""
    ratios = paired_ratios(pairs)
    lines = [
        "| repeat | seed-style samples/s (p10-p90) | lab samples/s (p10-p90) | lab / seed |",
        "|---:|---:|---:|---:|",
    ]
    for i, ((seed, lab), r) in enumerate(zip(pairs, ratios)):
        lines.append(
            f"| {i + 1} | {seed['samples_per_s']:,.1f} ({seed['samples_per_s_p10']:,.0f}-"
            f"{seed['samples_per_s_p90']:,.0f}) | {lab['samples_per_s']:,.1f} "
            f"({lab['samples_per_s_p10']:,.0f}-"
            f"{lab['samples_per_s_p90']:,.0f}) | {r:.2f}x |"
        )
    ratio = statistics.median(ratios)
    lines.append(
        f"| median | {statistics.median(s['samples_per_s'] for s, _ in pairs):,.1f} | "
        f"{statistics.median(lab['samples_per_s'] for _, lab in pairs):,.1f} | **{ratio:.2f}x** "
        f"({min(ratios):.2f}-{max(ratios):.2f}) |"
    )
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
    ap.add_argument(
        "--ranks",
        type=int,
        nargs="+",
        default=[1] if cuda else [1, 2],
        help="rank counts on this node, each compared in turn (more than 1 on a GPU node needs as many GPUs)",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench")
    args = ap.parse_args(argv)
    if any(r < 1 or args.batch % r for r in args.ranks):
        raise SystemExit(
            f"error: --ranks {' '.join(map(str, args.ranks))}: each must be >= 1 and divide --batch {args.batch}"
        )
    name = sysinfo.device_name(torch.device("cuda", 0) if cuda else torch.device("cpu"))
    print(
        f"lab vs seed-style: ResNet-18 width {args.width}, batch {args.batch}, {args.precision}, {args.steps} timed "
        f"steps after {args.warmup}, {args.workers} workers, {args.repeats} repeats at {args.ranks} rank(s), on "
        f"{name}",
        flush=True,
    )
    try:
        results = {r: compare(args, r) for r in args.ranks}
    except RuntimeError as e:
        raise SystemExit(str(e)) from None
    path = benchtable.write(table(args, name, cuda, results), args.out, name, prefix="seed-vs-lab-")
    figures = {}
    for ranks, pairs in results.items():
        ratios = paired_ratios(pairs)
        figures[f"ranks_{ranks}"] = {
            "ratio": statistics.median(ratios),
            "min": min(ratios),
            "max": max(ratios),
            "repeats": len(ratios),
        }
    benchtable.headline(args.out, "seed", name, path, figures)
    return 0


def table(args, name: str, cuda: bool, results: dict[int, list[tuple[dict, dict]]]) -> list[str]:
    """The Markdown page: one table of paired repeats per rank count, then the ratios."""
    lab0 = next(iter(results.values()))[0][1]
    lines = benchtable.header(f"the lab's loop against the seed-style script on {name}")
    lines += [
        f"ResNet-18 (CIFAR form, width {args.width}), synthetic CIFAR-shaped data, global batch {args.batch} "
        f"(split between the ranks), {args.precision}, {args.steps} timed steps after {args.warmup}, "
        f"{args.workers} workers per rank. Lab: pipeline {lab0['pipeline']}, channels_last "
        f"{str(lab0['channels_last']).lower()}, compile {str(lab0['compile']).lower()}, DDP only with more than "
        f"one rank. Seed-style: per-sample PIL transforms in a DataLoader, DDP defaults, loss.item() every "
        f"step. samples/s = global batch / median step time; runs alternate. The ranks share this node's "
        f"{sysinfo.usable_cores()} cores, each with "
        + ", ".join(f"{sysinfo.threads_per_rank(r)} OMP threads at {r} rank{'s' if r > 1 else ''}" for r in results)
        + ".",
        "",
    ]
    ratios = {}
    for ranks, pairs in results.items():
        rows, ratios[ranks] = ratio_table(pairs)
        lines += [f"{ranks} rank{'s' if ranks > 1 else ''}:", "", *rows, ""]
    if not cuda:
        lines.append(
            "On a CPU this ratio measures the input pipeline and the loop's overheads (per-sample PIL "
            "transforms in worker processes competing with training for the same cores, against batched "
            "tensor transforms; DDP's hooks and self-all-reduce at one rank, which the lab skips) and the "
            "memory format (the lab's CPU default is channels_last for ResNet-18 from width 16, where "
            "oneDNN's convolutions run faster), not the GPU path (compile, fused optimizer, no host syncs)."
        )
    first, *more = results
    lines.append(
        f"Lab / seed-style: **{ratios[first]:.2f}x** (median of {len(results[first])} paired ratios)"
        + "".join(f"; at {r} ranks **{ratios[r]:.2f}x** (median of {len(results[r])})" for r in more)
        + "."
    )
    return lines


if __name__ == "__main__":
    sys.exit(main())
