"""Throughput tables for the core: `make bench` or `python benchmarks/bench_core.py`.

1. Input pipeline alone (no model): samples/s of the device-resident pipeline
   vs the DataLoader baseline, producing augmented, normalised CIFAR-shaped
   batches on the device. Median of --repeats timed passes after one warm-up.
2. Training: ResNet-18 (CIFAR form) samples/s from real runs of the CLI on
   synthetic data, for each requested process count at the same global batch,
   read back from the run records (timed steps only, warm-up excluded).

The table is printed and written to results/bench/<device>.md with the device
name and software versions. On a GPU machine add e.g.
`--precision bf16 --channels_last --compile both`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernels.base import sysinfo  # noqa: E402

import benchtable  # noqa: E402  (benchmarks/, this script's directory)
from kernels.data.embedded import make_synthetic  # noqa: E402
from kernels.data.pipeline import ImageTransform, LoaderSource, Split, TensorSource  # noqa: E402
from kernels.workloads.resnet18_cifar import CIFAR_MEAN, CIFAR_STD  # noqa: E402


def bench_pipeline(kind: str, device: torch.device, batch: int, steps: int, repeats: int, workers: int) -> float:
    arrays = make_synthetic(n_train=batch * steps, n_test=1)
    train = Split(torch.from_numpy(arrays["train"][0]), torch.from_numpy(arrays["train"][1]))
    aug = ImageTransform(mean=CIFAR_MEAN, std=CIFAR_STD, pad=4, flip=True)
    if kind == "device":
        pipe = TensorSource(train, aug, batch, 0, 1, 0, device, False)
    else:
        pipe = LoaderSource(train, aug, batch, 0, 1, 0, device, False, workers, 2)
    rates = []
    for epoch in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        n = 0
        for x, _ in pipe.batches(epoch):
            n += x.shape[0]
        if device.type == "cuda":
            torch.cuda.synchronize()
        if epoch:  # the first pass starts the workers / warms the allocator
            rates.append(n / (time.perf_counter() - t0))
    return statistics.median(rates)


def bench_training(procs: int, args, compile_: bool | None) -> dict:
    params = {
        "dataset": "synthetic",
        "gpus": procs,
        "batch": args.train_batch,
        "train_samples": args.train_batch * args.train_steps,
        "test_samples": args.train_batch,
        "epochs": 1,
        "width": args.width,
        "precision": args.precision,
        "timing_warmup_steps": args.warmup,
        "num_workers": args.workers,
        "comm_probe_steps": 0,
        "log_every": 0,
        "checkpoint_every": 0,
    }
    if args.channels_last is not None:
        params["channels_last"] = args.channels_last
    if compile_ is not None:
        params["compile"] = compile_
    try:
        s = benchtable.lab_run(params)
    except RuntimeError as e:
        raise SystemExit(str(e)) from None
    return {**s, "compile": s["params"]["compile"], "channels_last": s["params"]["channels_last"]}


def main(argv=None) -> int:
    cuda = torch.cuda.is_available()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if cuda else "cpu")
    ap.add_argument("--batch", type=int, default=512, help="pipeline benchmark batch")
    ap.add_argument("--steps", type=int, default=20, help="pipeline batches per timed pass")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=4, help="DataLoader workers (the lab's num_workers default)")
    ap.add_argument("--procs", default="1,2", help="process counts for the training table")
    # GPU defaults saturate the device (batch 512, >= 100 timed steps, bf16; channels_last and compile follow the
    # lab's CUDA defaults); CPU defaults keep the table to minutes
    ap.add_argument("--train_batch", type=int, default=512 if cuda else 64)
    ap.add_argument("--train_steps", type=int, default=115 if cuda else 8, help="steps per run, warm-up included")
    ap.add_argument("--warmup", type=int, default=15 if cuda else 2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--precision", default="bf16" if cuda else "fp32")
    ap.add_argument(
        "--channels_last",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="default: the lab's per-device default (on with CUDA)",
    )
    ap.add_argument(
        "--compile",
        choices=["auto", "off", "on", "both"],
        default="auto",
        help="auto: the lab's per-device default (on with CUDA)",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    name = sysinfo.device_name(device if device.type == "cpu" else torch.device("cuda", 0))
    lines = benchtable.header(f"core benchmark on {name}")

    print(f"pipeline benchmark: batch {args.batch}, {args.steps} batches per pass, {args.repeats} passes", flush=True)
    lines += [
        "## input pipeline alone (augmented, normalised batches on the device)",
        "",
        "| pipeline | samples/s |",
        "|---|---:|",
    ]
    for kind, label in (("device", "device-resident"), ("dataloader", f"DataLoader ({args.workers} workers)")):
        rate = bench_pipeline(kind, device, args.batch, args.steps, args.repeats, args.workers)
        lines.append(f"| {label} | {rate:,.0f} |")
        print(lines[-1], flush=True)

    compiles = {"auto": [None], "off": [False], "on": [True], "both": [False, True]}[args.compile]
    lines += [
        "",
        f"## training, ResNet-18 CIFAR form (width {args.width}), synthetic data, global batch "
        f"{args.train_batch}, {args.precision}, {args.train_steps - args.warmup} timed steps",
        "",
        "| processes | compile | samples/s (median step) | p10-p90 | samples/s per process | step ms (median) "
        "| data wait | MFU |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for compile_ in compiles:
        for procs in [int(p) for p in args.procs.split(",")]:
            print(f"training: {procs} process(es), compile={compile_} ...", flush=True)
            s = bench_training(procs, args, compile_)
            mfu = f"{100 * s['mfu']:.1f}%" if s["mfu"] is not None else "n/a (no peak for this device)"
            lines.append(
                f"| {procs} | {'on' if s['compile'] else 'off'}{', cl' if s['channels_last'] else ''} | "
                f"{s['samples_per_s']:,.1f} | "
                f"{s['samples_per_s_p10']:,.1f}-{s['samples_per_s_p90']:,.1f} | "
                f"{s['samples_per_s_per_device']:,.1f} | {s['step_ms_p50']:.1f} | "
                f"{100 * (s['data_wait_frac'] or 0):.1f}% | {mfu} |"
            )
            print(lines[-1], flush=True)

    benchtable.write(lines, args.out, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
