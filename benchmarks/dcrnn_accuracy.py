"""DCRNN accuracy: the lab's workload against the public PyTorch pipeline, same data, same weights, same seeds.

`python benchmarks/dcrnn_accuracy.py` (part of `make bench`). The DCRNN plan asks for accuracy within 2 % of the
baseline implementation (../shared/briefs/000_8b904c4137fd19ed.txt, line 9). For each seed, on the synthetic
METR-LA-shaped set (its first --time_steps steps, the lab's 70/10/20 split):

- the lab's model is built with that seed (kernels/workloads/dcrnn, original diffusion form) and its weights are
  loaded into the public pipeline's model (benchmarks/dcrnn_public.py), so both start from the same function;
- each trains --epochs epochs in its own pipeline with that seed: the public one on its float64 windows
  shuffled once, its loss on unscaled labels and its scheduled-sampling draws; the lab's on its index-batched
  series, a permutation per epoch and its masked loss. The same recipe for both: Adam (lr 0.01, eps 1e-3),
  gradient clipping at 5, batch --batch, and the published schedules scaled to the run's length
  (liyaguang/DCRNN, data/model/dcrnn_la.yaml: 100 epochs, the learning rate x0.1 at epochs 20, 30, 40 and 50,
  never below 2e-6, scheduled sampling with a decay of 2000 steps): here the learning rate drops at 20, 30, 40
  and 50 % of the run's steps, and the probability of feeding the true value crosses one half at 40 % of them,
  where the published decay crosses it on METR-LA's 375 steps an epoch. Unscaled, 2000 steps would feed the
  truth at almost every step of a short run, and a model that never saw its own forecasts compounds their
  errors over the horizon: one such run forecast 60 minutes ahead at twice the other seeds' MAE;
- both forecast the test windows and are scored by the same code (kernels/workloads/dcrnn.metric_sums): masked
  MAE in mph at 15, 30 and 60 minutes.

The gap is lab / public - 1 per horizon; the verdict reads the median over seeds at the worst horizon, beside the
spread between seeds of each implementation: while one seed moves either's MAE by more than 2 %, the gap is
"not resolved" (train longer), and the criterion says "not measured". The table
goes to results/bench/dcrnn_accuracy-<device>.md, its numbers to the .json beside it, which the criteria table
reads. At this size (a few days of series, narrow cells) the check is of the implementations, not of the
published accuracy, which the DCRNN study's records are judged against.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import benchtable  # noqa: E402
import dcrnn_public as public  # noqa: E402
from kernels.base import sysinfo  # noqa: E402
from kernels.data import traffic  # noqa: E402
from kernels.data.series import SeriesStore, WindowEvalSource, WindowSource  # noqa: E402
from kernels.workloads import dcrnn  # noqa: E402
from kernels.workloads.dcrnn.graph import Graph, dual_supports  # noqa: E402
from kernels.workloads.dcrnn.model import DCRNN  # noqa: E402
from kernels.workloads.dcrnn.reporting import resolves  # noqa: E402

TARGET_GAP = 0.02  # the plan's "within 2 %"
CLIP = 5.0
BASE_LR, MIN_LR, LR_DECAY = 0.01, 2e-6, 0.1  # the published recipe's
LR_STEPS = (0.2, 0.3, 0.4, 0.5)  # its epochs 20, 30, 40, 50 of 100, as shares of the run
SAMPLING_CROSS = 0.4  # 2000 ln 2000 = 15,202 steps: epoch 40.5 of 100 at METR-LA's 375 steps an epoch


def decay_steps(total_steps: int) -> int:
    """The scheduled-sampling decay k that a run of total_steps steps needs for its probability of feeding the true
    value, k / (k + exp(step / k)), to cross one half where the published run's does (k ln k = 0.4 total_steps):
    at the published 2000 a short run feeds the truth at almost every step and never learns from its own
    forecasts."""
    k = 2.0
    while k * math.log(k) < SAMPLING_CROSS * total_steps:
        k += 1
    return int(k)


def lr_milestones(total_steps: int) -> list[int]:
    """The steps at which the learning rate drops tenfold: the published epochs 20, 30, 40, 50 of 100, scaled."""
    return [round(f * total_steps) for f in LR_STEPS]


def lab_model(series, mean, std, args, device, seed: int) -> DCRNN:
    torch.manual_seed(seed)
    g = Graph(dual_supports(series.adj), None, "dense", device.type)
    return DCRNN(
        g,
        mean,
        std,
        units=args.units,
        layers=args.layers,
        k_max=args.k,
        form="original",
        cl_decay_steps=args.cl_decay_steps,
        seed=seed,
    ).to(device)


def public_model(series, args, device) -> public.PublicDCRNN:
    supports = public.sparse_supports(dual_supports(series.adj), device)
    return public.PublicDCRNN(
        supports, series.num_nodes, args.units, args.layers, args.k, cl_decay_steps=args.cl_decay_steps
    ).to(device)


def optimizer(model, milestones: list[int]) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """Adam as published (lr 0.01, eps 1e-3) and its step schedule: x0.1 at each milestone, never below 2e-6."""
    opt = torch.optim.Adam(model.parameters(), lr=BASE_LR, eps=1e-3)
    decay = lambda s: max(LR_DECAY ** sum(s >= m for m in milestones), MIN_LR / BASE_LR)  # noqa: E731
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, decay)


def step(model, opt, sched, loss) -> float:
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    opt.step()
    sched.step()
    return float(loss.detach())


def train_lab(model, store, train: range, args, seed: int) -> list[float]:
    """Epochs of the lab's pipeline: a permutation per epoch from the seed; the mean loss of each epoch."""
    src = WindowSource(store, train, args.batch, 0, 1, seed)
    (opt, sched), seen, losses = optimizer(model, args.lr_milestones), 0, []
    model.train()
    for epoch in range(args.epochs):
        total = []
        for x, y in src.batches(epoch):
            total.append(step(model, opt, sched, dcrnn.loss(dcrnn.forward(model, x, y, seen, True), y)))
            seen += 1
        losses.append(statistics.fmean(total))
        print(f"  seed {seed}, lab epoch {epoch + 1}/{args.epochs}: training loss {losses[-1]:.3f}", flush=True)
    return losses


def train_public(model, series, mean, std, train: range, args, device, seed: int) -> list[float]:
    """Epochs of the public pipeline: float64 windows shuffled once (the same order every epoch), its loss on
    unscaled labels, its own scheduled-sampling draws."""
    loader = public.HostLoader(*public.normalised_windows(series, mean, std, train), args.batch, seed)
    rng = np.random.default_rng(seed)
    (opt, sched), seen, losses = optimizer(model, args.lr_milestones), 0, []
    model.train()
    for _ in range(args.epochs):
        total = []
        for xb, yb in loader:
            x, y = public.to_device(xb, yb, device)
            total.append(step(model, opt, sched, public.masked_loss(model(x, y, seen, rng), y, mean, std)))
            seen += 1
        losses.append(statistics.fmean(total))
        print(f"  seed {seed}, public epoch {len(losses)}/{args.epochs}: training loss {losses[-1]:.3f}", flush=True)
    return losses


def test_mae(forecast, store, test: range, batch: int) -> dict:
    """Masked MAE (mph) per horizon label of `forecast` (x (b, 12, nodes, 2) normalised -> (b, 12, nodes) mph) over
    the test windows, scored by the workload's own metric code."""
    sums = {}
    with torch.no_grad():
        for x, y in WindowEvalSource(store, test, batch, 0, 1).batches():
            ae, count = dcrnn.metric_sums(forecast(x), y)["mae"]
            sums = {"ae": ae + sums.get("ae", 0), "count": count + sums.get("count", 0)}
    mae = (sums["ae"] / sums["count"].clamp(min=1)).tolist()
    return dict(zip(dcrnn.LABELS, mae))


def one_seed(series, store, mean, std, splits, args, device, seed: int) -> dict:
    lab = lab_model(series, mean, std, args, device, seed)
    pub = public_model(series, args, device)
    public.load_lab_weights(pub, lab)
    t0 = time.perf_counter()
    lab_losses = train_lab(lab, store, splits["train"], args, seed)
    t1 = time.perf_counter()
    pub_losses = train_public(pub, series, mean, std, splits["train"], args, device, seed)
    t2 = time.perf_counter()
    lab.eval()
    pub.eval()

    def pub_forecast(x):  # the lab's (b, 12, nodes, 2) as the public model's (12, b, nodes * 2)
        b, n = x.shape[0], x.shape[2]
        return (pub(x.permute(1, 0, 2, 3).reshape(12, b, n * 2)) * std + mean).permute(1, 0, 2)

    out = {
        "seed": seed,
        "lab": test_mae(lab, store, splits["test"], args.batch),
        "public": test_mae(pub_forecast, store, splits["test"], args.batch),
        "lab_train_s": t1 - t0,
        "public_train_s": t2 - t1,
        "lab_losses": lab_losses,
        "public_losses": pub_losses,
    }
    out["gap"] = {h: out["lab"][h] / out["public"][h] - 1 for h in dcrnn.LABELS}
    print(
        f"seed {seed}: MAE lab {fmt(out['lab'])}, public {fmt(out['public'])} mph; gap "
        + ", ".join(f"{h} {100 * g:+.2f} %" for h, g in out["gap"].items()),
        flush=True,
    )
    return out


def fmt(maes: dict) -> str:
    return "/".join(f"{maes[h]:.3f}" for h in dcrnn.LABELS)


def summary(seeds: list[dict]) -> dict:
    """Median gap per horizon over seeds, the worst of those, and each implementation's spread between seeds."""
    med = {h: statistics.median(s["gap"][h] for s in seeds) for h in dcrnn.LABELS}
    worst = max(med, key=lambda h: abs(med[h]))
    spread = {
        impl: {h: max(s[impl][h] for s in seeds) / min(s[impl][h] for s in seeds) - 1 for h in dcrnn.LABELS}
        for impl in ("lab", "public")
    }
    return {"median_gap": med, "worst_horizon": worst, "worst_gap": med[worst], "seed_spread": spread}


def table(seeds: list[dict], s: dict, baseline: dict, args, series, splits) -> list[str]:
    dev_line = (
        f"synthetic {args.shape} set, first {series.num_steps:,} steps x {series.num_nodes} sensors "
        f"({len(splits['train']):,} training and {len(splits['test']):,} test windows), DCRNN {args.layers} x "
        f"{args.units} units, K={args.k}, batch {args.batch}, {args.epochs} epochs, learning rate 0.01 x0.1 at "
        f"steps {', '.join(f'{m:,}' for m in args.lr_milestones)}, scheduled sampling decay {args.cl_decay_steps} "
        "steps, seeds "
        f"{', '.join(str(x['seed']) for x in seeds)}; both models start from the same weights. MAE in mph at "
        f"{', '.join(dcrnn.LABELS)}; gap = lab / public - 1."
    )
    lines = [dev_line, "", "| seed | public MAE | lab MAE | gap |", "|---|---|---|---|"]
    for x in seeds:  # training times stay in the .json: this table is not a timing (bench_dcrnn.py is)
        gaps = " / ".join(f"{100 * x['gap'][h]:+.2f} %" for h in dcrnn.LABELS)
        lines.append(f"| {x['seed']} | {fmt(x['public'])} | {fmt(x['lab'])} | {gaps} |")
    spread = "; ".join(
        f"{impl} " + " / ".join(f"{100 * s['seed_spread'][impl][h]:.1f} %" for h in dcrnn.LABELS)
        for impl in ("public", "lab")
    )
    ok = abs(s["worst_gap"]) <= TARGET_GAP
    verdict = (
        f"{'within' if ok else 'outside'} {100 * TARGET_GAP:.0f} %"
        if resolves({**s, "seeds": seeds, "target_gap": TARGET_GAP})
        else f"not resolved: a seed moves the MAE by more than {100 * TARGET_GAP:.0f} % (train longer)"
    )
    median = " / ".join(f"{100 * s['median_gap'][h]:+.2f} %" for h in dcrnn.LABELS)
    return [
        *lines,
        "",
        f"Median gap over seeds: {median}; worst "
        f"{100 * s['worst_gap']:+.2f} % at {s['worst_horizon']}: **{verdict}**. Spread between seeds "
        f"(max / min - 1): {spread}. Historical average on the same "
        f"test windows: {fmt(baseline)} mph.",
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="metr-la", choices=list(traffic.SYNTHETIC_SHAPES))
    p.add_argument("--data_dir", type=Path, default=ROOT / "data")
    p.add_argument("--time_steps", type=int, default=2880, help="the first N time steps of the set (2880: 10 days)")
    p.add_argument("--units", type=int, default=16)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--k", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument(
        "--cl_decay_steps",
        type=int,
        default=0,
        help="scheduled-sampling decay (0: crossing one half at 40 %% of the run, as published)",
    )
    p.add_argument("--out", type=Path, default=ROOT / "results" / "bench")
    args = p.parse_args(argv)
    if args.time_steps < 200:
        p.error("--time_steps: at least 200, so that every split holds windows")
    device = torch.device("cpu")  # the public pipeline's sparse products run on the CPU as on a GPU; compare here
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or sysinfo.usable_cores()))
    traffic.generate(args.shape, args.data_dir)
    series = traffic.load("synthetic", args.data_dir, args.shape)
    n = min(args.time_steps, series.num_steps)
    series = dataclasses.replace(
        series, speeds=series.speeds[:n], time_of_day=series.time_of_day[:n], slot_of_week=series.slot_of_week[:n]
    )
    mean, std = series.scaler()
    splits = series.splits()
    total_steps = args.epochs * (len(splits["train"]) // args.batch)  # the lab drops the last part-batch
    args.cl_decay_steps = args.cl_decay_steps or decay_steps(total_steps)
    args.lr_milestones = lr_milestones(total_steps)
    store = SeriesStore(series.inputs(mean, std), series.speeds, (series.speeds != 0).sum(1), device, 12, 12)
    seeds = [one_seed(series, store, mean, std, splits, args, device, seed) for seed in args.seeds]
    s = summary(seeds)
    ha = dcrnn.historical_average_metrics(series, splits["test"], 12)
    baseline = {h: ha[f"mae_{h}"] for h in dcrnn.LABELS}
    dev = sysinfo.device_name(device)
    lines = benchtable.header(f"DCRNN accuracy: the lab's workload against the public pipeline ({dev})")
    lines += table(seeds, s, baseline, args, series, splits)
    record = {
        **benchtable.provenance(dev),
        **{k: getattr(args, k) for k in ("shape", "units", "layers", "k", "batch", "epochs", "cl_decay_steps")},
        "lr_milestones": args.lr_milestones,
        "time_steps": series.num_steps,
        "sensors": series.num_nodes,
        "target_gap": TARGET_GAP,
        "seeds": seeds,
        "historical_average_mae": baseline,
        **s,
    }
    benchtable.write(lines, args.out, dev, prefix="dcrnn_accuracy-", record=record)  # read by the criteria table
    return 0


if __name__ == "__main__":
    sys.exit(main())
