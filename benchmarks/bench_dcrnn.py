"""DCRNN epoch time: the public PyTorch pipeline's mechanics vs the lab's workload, same model, same machine.

`python benchmarks/bench_dcrnn.py` (part of `make bench`). On the synthetic METR-LA-shaped
set (34,272 steps x 207 sensors; generated into data/ if absent), with the product's model
(2 x 64 units, K = 2) and batch 64, one process:

- public: benchmarks/dcrnn_public.py, float64 windows materialised on the host, a per-batch
  float32 conversion and host-to-device copy, 384 torch.sparse.mm per forward inside the
  Python loop, sparse supports;
- lab: kernels/workloads/dcrnn with the index-batched series on the device, node-major tensors,
  its default supports (auto: sparse for a road graph on a CPU, dense on a GPU) and diffusion_form
  (original), so that both compute the same function;
- lab, dense (or sparse) supports: the same with the form that auto did not choose, so that the
  table shows whether auto chose the faster one on this device.

Each variant runs in a process of its own, one after the other: the same lab code took 7.7 s per step
after the public pipeline had run in its process (holding 3.8 GB) and 6.3 s before it, on the AMD EPYC VM.

Before timing, the lab's weights are loaded into the public model and both forecast one batch:
they must agree (max difference printed). Each variant then trains --steps steps after
--warmup (Adam, masked MAE, clipping 5, scheduled sampling), timing each step from batch
preparation to optimizer step, device-synchronised. The epoch time is the training split's
steps per epoch x the median step (projected: the median is measured, the epoch is not run
whole); setup (reading, windows, copies to the device) is timed apart. Ratios are taken in
this one run, side by side. The table goes to results/bench/dcrnn-<device>.md and its numbers
to the .json beside it, which the paper's DCRNN section reads.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
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
from kernels.data.series import SeriesStore, WindowSource  # noqa: E402
from kernels.workloads import dcrnn  # noqa: E402
from kernels.workloads.dcrnn.graph import Graph, dual_supports  # noqa: E402
from kernels.workloads.dcrnn.model import DCRNN  # noqa: E402


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def lab_model(series, mean, std, mode, args, device):
    torch.manual_seed(0)
    g = Graph(dual_supports(series.adj), None, mode, device.type)
    return DCRNN(g, mean, std, units=args.units, layers=args.layers, k_max=args.k, form="original").to(device)


def time_lab(series, mean, std, train, mode, args, device):
    t0 = time.perf_counter()
    store = SeriesStore(series.inputs(mean, std), series.speeds, (series.speeds != 0).sum(1), device, 12, 12)
    src = WindowSource(store, train, args.batch, 0, 1, 0)
    sync(device)
    setup = time.perf_counter() - t0
    model = lab_model(series, mean, std, mode, args, device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, eps=1e-3)
    batches = src.batches(0)

    def loss_of(step):
        x, y = next(batches)
        return dcrnn.loss(dcrnn.forward(model, x, y, step, True), y)

    times = timed_steps(f"lab ({mode})", model, opt, loss_of, args, device)
    return setup, store.resident_bytes(), times, src.steps_per_epoch


def timed_steps(name: str, model, opt, loss_of, args, device) -> list[float]:
    """Seconds of each training step after the warm-up: batch, forward, loss, backward, clipping 5, Adam."""
    times = []
    for step in range(args.warmup + args.steps):
        sync(device)
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_of(step).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        sync(device)
        if step >= args.warmup:
            times.append(time.perf_counter() - t)
        print(
            f"  {name} step {step + 1}/{args.warmup + args.steps}: {1e3 * (time.perf_counter() - t):.0f} ms", flush=True
        )
    return times


def time_public(series, mean, std, train, args, device):
    t0 = time.perf_counter()
    xs, ys = public.normalised_windows(series, mean, std, train)
    loader = public.HostLoader(xs, ys, args.batch)
    supports = public.sparse_supports(dual_supports(series.adj), device)
    setup = time.perf_counter() - t0
    held = xs.nbytes + ys.nbytes + loader.xs.nbytes + loader.ys.nbytes
    torch.manual_seed(0)
    model = public.PublicDCRNN(supports, series.num_nodes, args.units, args.layers, args.k).to(device)
    public.load_lab_weights(model, lab_model(series, mean, std, "dense", args, device))
    opt = torch.optim.Adam(model.parameters(), lr=0.01, eps=1e-3)
    rng = np.random.default_rng(0)
    it = iter(loader)

    def loss_of(step):
        x, y = public.to_device(*next(it), device)
        return public.masked_loss(model(x, y, step, rng), y, mean, std)

    times = timed_steps("public", model, opt, loss_of, args, device)
    return setup, held, times, len(loader.xs) // args.batch


def same_function(series, mean, std, args, device) -> float:
    """Max |difference| in mph between the two models' forecasts of one batch with the same weights."""
    lab = lab_model(series, mean, std, "dense", args, device).eval()
    pub = (
        public.PublicDCRNN(
            public.sparse_supports(dual_supports(series.adj), device), series.num_nodes, args.units, args.layers, args.k
        )
        .to(device)
        .eval()
    )
    public.load_lab_weights(pub, lab)
    xs, ys = public.materialise_windows(series.speeds[:200], series.time_of_day[:200])
    xs[..., 0] = (xs[..., 0] - mean) / std
    with torch.no_grad():
        x, _ = public.to_device(xs[:4], ys[:4], device)
        theirs = pub(x) * std + mean  # (12, b, n)
        ours = lab(torch.from_numpy(xs[:4]).float().to(device))  # (b, 12, n)
    return float((theirs.permute(1, 0, 2) - ours).abs().max())


VARIANTS = {"public": None, "lab": "auto", "lab, dense supports": "dense", "lab, sparse supports": "sparse"}


def auto_form(series, device) -> str:
    """The form, dense or sparse, that supports=auto takes for this graph on this device."""
    return "sparse" if Graph(dual_supports(series.adj), None, "auto", device.type).sparse else "dense"


def variants(auto: str) -> list[str]:
    """The rows of the table: the public pipeline, the lab with supports=auto (which takes the form `auto`), and
    the lab with the other form."""
    return ["public", "lab", f"lab, {'dense' if auto == 'sparse' else 'sparse'} supports"]


def time_variant(name: str, series, mean, std, train, args, device) -> tuple:
    if name == "public":
        return time_public(series, mean, std, train, args, device)
    return time_lab(series, mean, std, train, VARIANTS[name], args, device)


def in_child(name: str, argv: list[str]) -> tuple:
    """(setup s, bytes held, step times, steps per epoch) of one variant, timed in a fresh process."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        subprocess.run([sys.executable, __file__, *argv, "--variant", name, "--result", str(result)], check=True)
        return tuple(json.loads(result.read_text()))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="metr-la", choices=list(traffic.SYNTHETIC_SHAPES))
    p.add_argument("--data_dir", type=Path, default=ROOT / "data")
    p.add_argument("--units", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--k", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=15, help="timed steps per variant")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument(
        "--time_steps",
        type=int,
        default=0,
        help="use the first N time steps only (0: all; for a quick check of the benchmark itself)",
    )
    p.add_argument("--out", type=Path, default=ROOT / "results" / "bench")
    p.add_argument("--variant", choices=list(VARIANTS), help=argparse.SUPPRESS)  # a child: time one, write --result
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else "cpu"
        if args.device == "auto"
        else args.device
    )

    traffic.generate(args.shape, args.data_dir)
    series = traffic.load("synthetic", args.data_dir, args.shape)
    if args.time_steps:
        n = args.time_steps
        series = dataclasses.replace(
            series, speeds=series.speeds[:n], time_of_day=series.time_of_day[:n], slot_of_week=series.slot_of_week[:n]
        )
    mean, std = series.scaler()
    train = series.splits()["train"]
    if args.variant:
        args.result.write_text(json.dumps(time_variant(args.variant, series, mean, std, train, args, device)))
        return 0
    diff = same_function(series, mean, std, args, device)
    print(f"same weights, same batch: forecasts differ by at most {diff:.2e} mph", flush=True)
    if not diff < 1e-2:
        print("error: the two implementations do not compute the same function", file=sys.stderr)
        return 1
    auto = auto_form(series, device)
    rows = {name: in_child(name, argv) for name in variants(auto)}
    base = statistics.median(rows["public"][2])
    dev = sysinfo.device_name(device)
    lines = benchtable.header(f"DCRNN epoch time: public pipeline mechanics vs the lab's workload ({dev})")
    lines += [
        f"synthetic {args.shape} set ({series.num_steps:,} steps x {series.num_nodes} sensors, "
        f"{len(train):,} training windows), DCRNN {args.layers} x {args.units} units, K={args.k}, batch "
        f"{args.batch}, one process; median of {args.steps} timed steps after {args.warmup} warm-up; epoch = "
        f"steps per epoch x median step (projected). Same weights give forecasts within {diff:.1e} mph.",
        "",
        "| pipeline | setup s | data held (MB) | step ms, median (p10-p90) | epoch s (projected) | "
        "speed-up vs public |",
        "|---|---|---|---|---|---|",
    ]
    record = {
        **benchtable.provenance(dev),
        "shape": args.shape,
        "sensors": series.num_nodes,
        "units": args.units,
        "layers": args.layers,
        "k": args.k,
        "batch": args.batch,
        "steps": args.steps,
        "warmup": args.warmup,
        "max_forecast_diff_mph": diff,
        "rows": {},
    }
    for name, (setup, held, times, steps) in rows.items():
        q = statistics.quantiles(times, n=10) if len(times) > 1 else [times[0]] * 9
        med = statistics.median(times)
        form = auto if VARIANTS[name] == "auto" else VARIANTS[name]  # None: the public pipeline
        label = f"lab (auto: {auto} supports)" if name == "lab" else name
        lines.append(
            f"| {label} | {setup:.1f} | {held / 1e6:,.0f} | {1e3 * med:,.0f} ({1e3 * q[0]:,.0f}-"
            f"{1e3 * q[-1]:,.0f}) | {steps * med:,.0f} | {base / med:.2f}x |"
        )
        record["rows"][name] = {
            "setup_s": setup,
            "data_bytes": held,
            "step_ms": 1e3 * med,
            "step_ms_p10": 1e3 * q[0],
            "step_ms_p90": 1e3 * q[-1],
            "steps_per_epoch": steps,
            "epoch_s": steps * med,
            "speedup": base / med,
            "supports": form,
        }
    path = benchtable.write(lines, args.out, dev, prefix="dcrnn-", record=record)  # read by the paper's DCRNN section
    benchtable.headline(
        args.out, "dcrnn", dev, path, {"speedup": record["rows"]["lab"]["speedup"], "steps": args.steps}
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
