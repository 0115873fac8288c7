"""Everything that needs a GPU, checked and measured in one command: `make bench-gpu` (benchmarks/gpu_validation.sh).

On a GPU node it writes results/bench/<gpu-name>.md with the device, driver, CUDA, NCCL and torch
versions and these sections (--sections picks some, in this order), each row from a real run's record:
- resnet: ResNet-18 (CIFAR form) on synthetic CIFAR-shaped data, one GPU, batch 512, >= 100 timed steps:
  bf16 with the CUDA defaults (channels_last, torch.compile, CUDA graphs), bf16 without CUDA graphs, fp16,
  bf16 with compile off and with channels_last off: samples/s (median step) with p10-p90, MFU, data wait,
  host syncs per step (torch.cuda.set_sync_debug_mode over 20 timed steps), peak memory;
- paths: the GPU paths that throughput does not prove, judged (benchmarks/gpu_paths.py): DDP with compile
  and no_sync on 2 ranks sharing the GPU over gloo; fp16 with the GradScaler stopped and resumed;
- workloads: the same on all the node's GPUs (NCCL, batch 512 per GPU), and the other workloads (the MNIST
  CNN, DCRNN) on one GPU and on all (DCRNN needs PyTables);
- seed: the seed-style baseline, and its one-line channels_last change, against the lab's loop (bf16,
  batch 512, one GPU, alternating runs);
- profile: a profiled run (device-timeline breakdown by operator category, NCCL hidden vs exposed) and
  its bottleneck verdict;
- nsight: one short run under Nsight Systems and one under Nsight Compute where they are on PATH, their
  reports read back by the lab's readers (benchmarks/gpu_nsight.py);
- comm: an NCCL all_reduce sweep over all GPUs (nccl-tests' bus bandwidth), when there are two or more;
- pilot: the pilot job the proposal names (benchmarks/gpu_pilot.py), its record kept under results/pilot/
  (beside --out), from which the proposal prices its request on systems with this GPU model.

Targets for one GPU (the table says whether they are met; they are not pass/fail): ResNet-18/CIFAR bf16
at batch 512 >= 40,000 samples/s (the brief's) and >= 80,000 (issue 50's), no host sync per step outside
logging steps, and >= 3x the seed-style baseline.

`--device cpu --tiny` runs the same plan on a CPU with gloo and tiny sizes (CNN and DCRNN at the
all-GPU count only): the tests use it to check the harness itself (every command it builds runs,
every table is filled). It never stands in for the GPU figures: the file it writes says CPU.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import bench_seed  # noqa: E402  (benchmarks/, this script's directory)
from kernels.workloads.resnet18_cifar import CPU_CHANNELS_LAST_MIN_WIDTH  # noqa: E402
import benchtable  # noqa: E402

TARGET_SPS = (40_000, 80_000)  # ResNet-18/CIFAR bf16, batch 512, one H100/H200: the brief's, then issue 50's
TARGET_RATIO = 3.0  # against the seed-style baseline


def sh(cmd: list[str], timeout: float | None = None) -> subprocess.CompletedProcess:
    print("+ " + " ".join(map(str, cmd)), flush=True)
    return subprocess.run(list(map(str, cmd)), cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def versions(cuda: bool) -> dict:
    import torch

    from kernels.base import sysinfo

    out = {
        **sysinfo.software_versions(),
        "driver": None,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "gpus": torch.cuda.device_count() if cuda else 0,
        "cpus": sysinfo.usable_cores(),
        "host": sysinfo.host(),
        # a copied tree (a GPU machine reached by copying files) names its commit in LAB_GIT_COMMIT:
        # its .git may be stale
        "git": os.environ.get("LAB_GIT_COMMIT") or sysinfo.git_info().get("commit") or "n/a",
    }
    if cuda and shutil.which("nvidia-smi"):
        p = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
        )
        out["driver"] = p.stdout.strip().splitlines()[0] if p.returncode == 0 and p.stdout.strip() else None
    return out


class Plan:
    """The sizes: a GPU's, or --tiny (CPU, for the tests)."""

    def __init__(self, args, cuda: bool):
        from kernels.base import sysinfo

        self.cuda, self.tiny = cuda, args.tiny
        self.batch = 32 if args.tiny else args.batch
        self.steps = 3 if args.tiny else args.steps
        self.warmup = 1 if args.tiny else args.warmup
        self.width = 4 if args.tiny else 64
        self.gpus = (2 if args.tiny else 1) if not cuda else max(1, args.gpus or versions(True)["gpus"])
        self.precisions = ("bf16", "fp16") if cuda else ("fp32", "bf16")
        # fp32: results/bench/nvidia-h200.md at 137c954 (32,611)
        self.workers = 1 if args.tiny else min(8, sysinfo.usable_cores())


def missing_prerequisites() -> list[str]:
    """What the plan's runs need beyond torch, missing here: each with what needs it and the fix. A machine's own
    Python (a GPU image, not `make setup`'s .venv) can lack them, and a row would fail only after the runs before it."""
    import importlib

    try:
        importlib.import_module("tables")
    except ImportError:
        return [
            "PyTables (`import tables`) is missing: the DCRNN rows read and write the synthetic traffic set's "
            "pandas HDF5 files. `make setup` installs it; or `pip install -c constraints.txt tables`"
        ]
    return []


def run_lab(plan: Plan, name: str, gpus: int = 1, workload: str = "resnet18", **params) -> dict:
    """One run of the lab's loop: {name, summary, params}, or {name, error}."""
    per = plan.batch
    p = {
        "workload": workload,
        "dataset": "synthetic",
        "gpus": gpus,
        "batch": per * gpus,
        "epochs": 1,
        "train_samples": per * gpus * (plan.steps + plan.warmup),
        "test_samples": per * gpus,
        "timing_warmup_steps": plan.warmup,
        "comm_probe_steps": 0 if gpus == 1 else 5,
        "log_every": 0,
        "checkpoint_every": 0,
        "num_workers": plan.workers,
        "oversubscribe": not plan.cuda,
        **params,
    }
    if workload == "resnet18":
        p["width"] = plan.width
    if workload == "dcrnn":
        p.update(rnn_units=8 if plan.tiny else 64, synthetic_shape="metr-la")
        if plan.tiny:  # 3 steps in, 3 out: the row's plumbing at a quarter of the 12 + 12 cell steps' cost
            p.update(seq_len=3, horizon=3)
    if plan.cuda:  # syncs counted over timed steps without the periodic stop check (a logging-like sync)
        p.update(sync_debug_steps=min(20, plan.steps), sync_check_steps=10_000)
    try:
        s = benchtable.lab_run(p, timeout=600)
    except RuntimeError as e:
        print(f"{name}: {e}", flush=True)
        return {"name": name, "error": [str(e)]}
    rate = s.get("samples_per_s")
    print(f"{name}: " + (f"{rate:,.0f} samples/s" if rate else "done"), flush=True)
    return {"name": name, "summary": s, "params": s["params"]}


def lab_row(r: dict) -> str:
    if "error" in r:
        return f"| {r['name']} | failed: {' '.join(r['error'])[:120]} | | | | | | |"
    s, p = r["summary"], r["params"]
    mfu = f"{100 * s['mfu']:.1f} %" if s.get("mfu") is not None else "n/a"
    syncs = f"{s['host_syncs_per_step']:.2f}" if s.get("host_syncs_per_step") is not None else "n/a"
    return (
        f"| {r['name']} | {p['gpus']} | {p['precision']}, cl {'on' if p['channels_last'] else 'off'}, compile "
        f"{'on' if p['compile'] else 'off'} | {s['samples_per_s']:,.0f} ({s['samples_per_s_p10']:,.0f}-"
        f"{s['samples_per_s_p90']:,.0f}) | {mfu} | {100 * (s['data_wait_frac'] or 0):.1f} % | {syncs} | "
        f"{s['peak_mem_gib']:.2f} |"
    )


LAB_HEAD = [
    "| run | GPUs | precision, channels_last, compile "
    "| samples/s (p10-p90) | MFU | data wait | host syncs/step "
    "| peak GiB |",
    "|---|---:|---|---:|---:|---:|---:|---:|",
]


def seed_vs_lab(plan: Plan, repeats: int) -> tuple[list[str], float | None]:
    """benchmarks/bench_seed.py's comparison at this plan's sizes, one GPU, with the seed-style script's one-line
    channels_last change beside it: (seed NCHW, seed channels_last, lab) per repeat, alternating."""
    args = argparse.Namespace(
        batch=plan.batch,
        steps=plan.steps,
        warmup=plan.warmup,
        workers=plan.workers,
        width=plan.width,
        precision="bf16" if plan.cuda else "fp32",
        repeats=repeats,
    )
    # on a CPU below width 16 channels_last meets oneDNN's fault (seed_baseline.py refuses it): that column is empty
    with_cl = plan.cuda or plan.width >= CPU_CHANNELS_LAST_MIN_WIDTH
    rows = []
    try:
        for _ in range(repeats):
            rows.append(
                [
                    bench_seed.run_seed(args)["samples_per_s"],
                    bench_seed.run_seed(args, channels_last=True)["samples_per_s"] if with_cl else None,
                    bench_seed.run_lab(args)["samples_per_s"],
                ]
            )
    except RuntimeError as e:
        return [str(e)], None
    ratios = [lab / seed for seed, _, lab in rows]
    ratio = statistics.median(ratios)
    num = lambda v: "-" if v is None else f"{v:,.0f}"  # noqa: E731
    x = lambda v: "-" if v is None else f"{v:.2f}x"  # noqa: E731
    lines = [
        "| repeat | seed-style samples/s | seed-style + channels_last | lab samples/s | lab / seed | "
        "lab / seed + channels_last |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {i + 1} | {s:,.0f} | {num(c)} | {lab:,.0f} | {lab / s:.2f}x | {x(c and lab / c)} |"
        for i, (s, c, lab) in enumerate(rows)
    ]
    med_cl = statistics.median(c for _, c, _ in rows) if with_cl else None
    cl = statistics.median(lab / c for _, c, lab in rows) if with_cl else None
    lines.append(
        f"| median | {statistics.median(s for s, _, _ in rows):,.0f} | {num(med_cl)} | "
        f"{statistics.median(lab for _, _, lab in rows):,.0f} | **{ratio:.2f}x** ({min(ratios):.2f}-"
        f"{max(ratios):.2f}) | {x(cl)} |"
    )
    if not with_cl:
        lines.append(
            f"\nNo channels_last column: on a CPU below width {CPU_CHANNELS_LAST_MIN_WIDTH} it meets "
            f"oneDNN's channels_last fault (uxlfoundation/oneDNN#6035)."
        )
    return lines, ratio


def profile_section(plan: Plan) -> tuple[list[str], str | None]:
    r = run_lab(
        plan,
        "profiled",
        gpus=plan.gpus,
        profile_steps=max(1, min(5, plan.steps - 1)),
        profile_wait=plan.warmup,
        profile_warmup=1,
        **({"precision": "bf16"} if plan.cuda else {}),
    )
    if "error" in r or not (r["summary"].get("profile") or {}).get("share"):
        return [f"profiled run failed: {r.get('error') or (r['summary'].get('profile') or {}).get('status')}"], None
    pr, bn = r["summary"]["profile"], r["summary"]["bottleneck"]
    lines = [
        f"{pr['ranks']} rank(s), {pr['steps']} profiled steps, {pr['timeline']} timeline, "
        f"{pr['profiled_ms_per_step']:.2f} ms per step; {pr['comm_crosscheck']}; HTA: {pr['hta']['status']}; "
        f"verdict: {r['summary']['bottleneck']['verdict']}.",
        "",
        "| category | ms/step | share |",
        "|---|---:|---:|",
    ]
    for c, v in sorted(pr["share"].items(), key=lambda kv: -kv[1]):
        lines.append(f"| {c} | {pr['ms_per_step'][c]:.3f} | {100 * v:.1f} % |")
    if pr.get("hidden_comm_ms_per_step") is not None:
        lines.append(f"\nNCCL hidden behind compute: {pr['hidden_comm_ms_per_step']:.3f} ms per step.")
    lines.append(f"\nVerdict: {bn['verdict']}: {bn['reason']}.")
    return lines, f"{bn['verdict']} ({bn['reason']})"


def commbench_section(plan: Plan, tmp: Path) -> list[str]:
    n = plan.gpus
    if n < 2:
        return ["one GPU: no all_reduce sweep"]
    backend = "nccl" if plan.cuda else "gloo"
    r = sh(
        [
            sys.executable,
            "-m",
            "kernels.comm",
            "bench",
            "--backend",
            backend,
            "--gpus",
            n,
            "--ops",
            "all_reduce",
            "--max_bytes",
            "64K" if plan.tiny else "1G",
            "--results_dir",
            tmp / "comm",
            "--run_id",
            "ar",
        ],
        timeout=600,
    )
    rows_path = tmp / "comm" / "ar" / "results.csv"
    if r.returncode != 0 or not rows_path.exists():
        return [f"all_reduce sweep failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}"]
    import csv

    rows = [x for x in csv.DictReader(open(rows_path)) if x["dtype"] == "fp32"]
    rows.sort(key=lambda x: int(x["size_bytes"]))
    lines = [
        f"{backend}, {n} ranks, fp32, out of place (nccl-tests' bus bandwidth)",
        "",
        "| size (B) | time (us) | busbw (GB/s) |",
        "|---:|---:|---:|",
    ]
    picked = rows[:: max(1, len(rows) // 8)]
    for x in picked + ([rows[-1]] if rows and rows[-1] is not picked[-1] else []):
        form = "out" if x.get("time_us_out") else "in"  # gloo has some collectives in place only
        lines.append(
            f"| {int(x['size_bytes']):,} | {float(x[f'time_us_{form}']):,.1f} | {float(x[f'busbw_{form}']):.2f} |"
        )
    return lines


def table_name(name: str, cuda: bool) -> str:
    return name if cuda else "gpu validation cpu check"


def partial(lines: list[str], out: Path, name: str, cuda: bool, next_section: str) -> None:
    """Store the sections done so far, marked incomplete, so that a job stopped by its time limit still leaves
    what it measured; the finished validation overwrites the file."""
    note = f"**Incomplete:** the validation stopped before {next_section} (time limit or failure); rerun it."
    path = benchtable.write([*lines, note], out, table_name(name, cuda), echo=False)
    print(f"sections so far written to {path}", flush=True)


SECTIONS = ("resnet", "paths", "workloads", "seed", "profile", "nsight", "comm", "pilot")


def resnet_rows(plan: Plan, cuda: bool) -> list[dict]:
    """One GPU: CUDA graphs on (the default) and off, fp16, compile off, channels_last off."""
    runs = [run_lab(plan, f"resnet18-{plan.precisions[0]}", precision=plan.precisions[0])]
    if cuda:
        runs.append(run_lab(plan, "resnet18-bf16-nographs", precision="bf16", cuda_graphs=False))
        runs += [run_lab(plan, f"resnet18-{p}", precision=p) for p in plan.precisions[1:]]
        runs.append(run_lab(plan, "resnet18-bf16-nocompile", precision="bf16", compile=False))
        runs.append(run_lab(plan, "resnet18-bf16-nchw", precision="bf16", compile=False, channels_last=False))
    else:  # compile and channels_last are off on a CPU already: both rows would run resnet18-fp32 again
        runs += [run_lab(plan, f"resnet18-{p}", precision=p) for p in plan.precisions[1:]]
        runs += [{**runs[0], "name": f"resnet18-fp32-{v} (= resnet18-fp32 on a CPU)"} for v in ("nocompile", "nchw")]
    return runs


def workload_rows(plan: Plan, cuda: bool) -> list[dict]:
    multi = []
    if plan.gpus > 1:
        multi.append(
            run_lab(plan, f"resnet18-{plan.precisions[0]}-x{plan.gpus}", gpus=plan.gpus, precision=plan.precisions[0])
        )
    # --tiny (the CPU check of the plan): the other workloads at the all-GPU count only; their one-process runs
    # are the other tests' (tests/test_mnist.py, tests/test_dcrnn.py) and resnet18-fp32 runs this launcher's x1 path
    for wl in ("cnn", "dcrnn"):
        for g in [plan.gpus] if plan.tiny else sorted({1, plan.gpus}):
            multi.append(run_lab(plan, f"{wl}-x{g}", gpus=g, workload=wl, **({"precision": "bf16"} if cuda else {})))
    return multi


def targets(runs: list[dict], ratio: float | None, verdict_line: str | None) -> list[str]:
    """The issue's and the brief's targets for one GPU, met or not (they are not pass/fail)."""
    ok = lambda c: "met" if c else "NOT met"  # noqa: E731
    head = next((r for r in runs if r["name"] == "resnet18-bf16" and "error" not in r), None)
    best = head["summary"]["samples_per_s"] if head else None
    syncs = head["summary"].get("host_syncs_per_step") if head else None
    lines = ["## Targets (one GPU, ResNet-18/CIFAR bf16, batch 512)", ""]
    if not runs:
        lines.append("- samples/s and host syncs: the resnet section did not run")
    for goal in TARGET_SPS if runs else ():
        lines.append(
            f"- >= {goal:,} samples/s: {best:,.0f} ({ok(best >= goal)})" if best else "- samples/s: the bf16 run failed"
        )
    if runs:
        lines.append(
            f"- host syncs per step outside logging steps = 0: {syncs} ({ok(syncs == 0)})"
            if syncs is not None
            else "- host syncs per step: not counted"
        )
    lines.append(
        f"- >= {TARGET_RATIO:.0f}x the seed-style baseline: {ratio:.2f}x ({ok(ratio >= TARGET_RATIO)})"
        if ratio
        else "- ratio: the seed section did not run, or failed"
    )
    if verdict_line:
        lines.append(f"- the profiled run's verdict: {verdict_line}")
    return [*lines, ""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny sizes (CPU tests of the harness)")
    ap.add_argument("--batch", type=int, default=512, help="per-GPU batch")
    ap.add_argument("--steps", type=int, default=100, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=15, help="steps before timing (compilation, graph capture)")
    ap.add_argument("--gpus", type=int, default=0, help="GPUs for the all-GPU runs (0: every visible one)")
    ap.add_argument("--repeats", type=int, default=3, help="seed-style vs lab pairs")
    ap.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated, in this order: {', '.join(SECTIONS)} (default: all)",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench")
    args = ap.parse_args(argv)
    import torch

    cuda = args.device == "cuda"
    sections = [x for x in args.sections.split(",") if x]
    unknown = [x for x in sections if x not in SECTIONS]
    if unknown:
        print(f"error: --sections: unknown {', '.join(unknown)}; choose from {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    if cuda and not torch.cuda.is_available():
        print(
            "error: no GPU visible (torch.cuda.is_available() is False); run on a GPU node, or --device cpu --tiny "
            "to check the harness",
            file=sys.stderr,
        )
        return 2
    missing = missing_prerequisites() if "workloads" in sections else []
    if missing:
        print("\n".join(f"error: {m}" for m in missing), file=sys.stderr)
        return 2
    v = versions(cuda)
    plan = Plan(args, cuda)
    t0 = time.time()
    name = v["gpu"] or "cpu"
    lines = [
        f"# GPU validation on {name}" if cuda else "# GPU validation harness, CPU check (no GPU figures)",
        "",
        f"host {v['host']}, {v['gpus']} GPU(s), {v['cpus']} CPUs; driver {v['driver']}, CUDA {v['cuda']}, cuDNN "
        f"{v['cudnn']}, NCCL {v['nccl']}, torch {v['torch']}; git {v['git']}; sections: {', '.join(sections)}",
        "",
        f"ResNet-18 CIFAR form (width {plan.width}), synthetic CIFAR-shaped data, batch {plan.batch} per "
        f"GPU, {plan.steps} timed steps after {plan.warmup}; samples/s = global batch / median step time. Host "
        f"syncs per step are counted over {min(20, plan.steps)} timed steps with the periodic stop check (every "
        f"sync_check_steps, a sync like a logging step's) moved outside them.",
        "",
    ]
    runs, failed, ratio, verdict_line = [], [], None, None
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        took = {}  # seconds per section: what a time-limited call can fit
        for section in sections:
            partial(lines, args.out, name, cuda, f"the section {section}")
            took[section] = time.time()
            if section == "resnet":
                runs = resnet_rows(plan, cuda)
                lines += [
                    "## One GPU: CUDA graphs, precision, channels_last, compile",
                    "",
                    *LAB_HEAD,
                    *map(lab_row, runs),
                    "",
                ]
                failed += [r["name"] for r in runs if "error" in r]
            elif section == "paths":
                import gpu_paths

                got = [gpu_paths.ddp_pair(cuda), gpu_paths.fp16_resume(cuda)]
                lines += ["## GPU paths, each run once", "", *[x for part, _ in got for x in part], ""]
                failed += [f"GPU path {i + 1}" for i, (_, ok) in enumerate(got) if not ok]
            elif section == "workloads":
                multi = workload_rows(plan, cuda)
                lines += [f"## All GPUs ({plan.gpus}) and the other workloads", "", *LAB_HEAD, *map(lab_row, multi), ""]
                failed += [r["name"] for r in multi if "error" in r]
            elif section == "seed":
                sl, ratio = seed_vs_lab(plan, args.repeats)
                lines += ["## The seed-style script against the lab's loop (one GPU, alternating runs)", "", *sl, ""]
            elif section == "profile":
                pl, verdict_line = profile_section(plan)
                lines += ["## A profiled run", "", *pl, ""]
            elif section == "nsight":
                import gpu_nsight

                ns, ok = gpu_nsight.run(plan.batch, plan.width, plan.warmup, plan.workers, name, args.out)
                lines += ["## Nsight Systems and Nsight Compute, read back", "", *ns]
                failed += [] if ok else ["the Nsight read-back"]
            elif section == "pilot":
                import gpu_pilot

                pilot, ok = gpu_pilot.run(plan.tiny, plan.batch, plan.workers, cuda, name, args.out.parent / "pilot")
                lines += ["## The proposal's pilot job (one GPU)", "", *pilot]
                failed += [] if ok else ["the pilot"]
            elif section == "comm":
                lines += [
                    "## NCCL all_reduce over all GPUs" if cuda else "## all_reduce sweep",
                    "",
                    *commbench_section(plan, tmp),
                    "",
                ]
    if cuda:
        lines += targets(runs, ratio, verdict_line)
    ends = [*list(took.values())[1:], time.time()]
    each = ", ".join(f"{k} {end - start:.0f} s" for (k, start), end in zip(took.items(), ends))
    lines.append(f"Wall time of the validation: {time.time() - t0:.0f} s" + (f" ({each})." if each else "."))
    benchtable.write(lines, args.out, table_name(name, cuda))
    if failed:
        print(f"error: these failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
