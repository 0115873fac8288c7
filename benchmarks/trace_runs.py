"""Fixed-seed traces of the lab's training runs, to prove that a restructuring changes no arithmetic.

    python benchmarks/trace_runs.py record OUT.json [--tree DIR] [--only NAME,...]
    python benchmarks/trace_runs.py compare OLD.json NEW.json

`record` runs a fixed list of small CPU runs through the public command line
(`python -m kernels.train`) of the tree DIR (default: this checkout), so the same
script traces an old commit's worktree and the current code. Per run it keeps:
- every backward's loss on every rank, as float.hex() (bit-exact), caught by a
  sitecustomize that wraps torch.Tensor.backward in the rank processes only;
- sha256 of the final checkpoint's model, every rank's buffers and the optimizer state;
- the record's fields that do not depend on timing (metrics.csv losses and metrics,
  summary.json counts and final metrics, config.json parameters and derived facts).
`compare` prints one line per run: identical, or what differs.

The fp16 run traces autocast fp16 with the GradScaler enabled on CPU ranks: the lab refuses fp16
without a GPU, so in that run's rank processes (only) the trace lifts that one refusal; torch
itself runs fp16 autocast and the scaler on a CPU.

CPU numerics differ between CPU models: compare traces recorded on one machine, one
after the other. The traces are evidence for a change, not a test fixture.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TIMING = (
    "epoch_s",
    "eval_s",
    "samples_per_s",
    "step_ms",
    "data_wait",
    "compute_ms",
    "tflops",
    "mfu",
    "peak_mem",
    "read_",
    "monitor",
    "bottleneck",
    "comm_probe",
    "exposed_comm",
    "checkpoints",
    "io",
    "ranks",
    "started",
    "finished",
    "attempts",
    "epoch_s_median",
    "host_syncs",
    "throughput_stat",
    "timed_steps",
    "profile",
    "checksum",
)  # the JSON checksum covers the timing fields too

SITE = """
import os
if os.environ.get("LAB_TRACE_DIR") and (os.environ.get("RANK") or os.environ.get("HOROVOD_RANK")
                                        or os.environ.get("LAB_TRACE_SINGLE")):
    import torch
    _orig = torch.Tensor.backward
    _rank = os.environ.get("HOROVOD_RANK") or os.environ.get("RANK") or "0"
    _path = os.path.join(os.environ["LAB_TRACE_DIR"], f"rank{_rank}.txt")

    def backward(self, *a, **k):
        with open(_path, "a") as f:
            f.write(float(self.detach().double()).hex() + "\\n")
        return _orig(self, *a, **k)

    torch.Tensor.backward = backward

if os.environ.get("LAB_TRACE_CPU_FP16"):
    # The lab refuses fp16 without a GPU (check_environment); torch runs fp16 autocast and an enabled GradScaler on
    # a CPU, which is the code path to trace. Whichever module defines check_environment (kernels.params, then
    # kernels.config in older trees, kernels.launch.config now) gets it wrapped to let that one refusal pass, before
    # anything imports the name.
    import importlib.abc
    import sys

    class _Lift(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name not in ("kernels.params", "kernels.config", "kernels.launch.config"):
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                check = getattr(module, "check_environment", None)
                if check is not None:
                    def lifted(cfg, **kw):
                        try:
                            return check(cfg, **kw)
                        except ValueError as e:
                            if "fp16 needs a GPU" not in str(e):
                                raise
                    module.check_environment = lifted
            spec.loader.exec_module = exec_module
            return spec

    import importlib.util
    sys.meta_path.insert(0, _Lift())
"""

R18 = [
    "--workload",
    "resnet18",
    "--dataset",
    "digits",
    "--width",
    "8",
    "--precision",
    "fp32",
    "--log_every",
    "0",
    "--timing_warmup_steps",
    "1",
    "--comm_probe_steps",
    "2",
    "--train_samples",
    "256",
    "--test_samples",
    "64",
    "--batch",
    "32",
    "--epochs",
    "2",
    "--seed",
    "3",
    "--monitor_hz",
    "0",
]
CNN = [
    "--workload",
    "cnn",
    "--dataset",
    "digits",
    "--precision",
    "fp32",
    "--log_every",
    "0",
    "--timing_warmup_steps",
    "1",
    "--comm_probe_steps",
    "2",
    "--train_samples",
    "256",
    "--test_samples",
    "64",
    "--batch",
    "32",
    "--epochs",
    "2",
    "--seed",
    "5",
    "--monitor_hz",
    "0",
]
DCRNN = [
    "--workload",
    "dcrnn",
    "--dataset",
    "synthetic",
    "--rnn_units",
    "8",
    "--batch",
    "8",
    "--epochs",
    "2",
    "--train_samples",
    "48",
    "--test_samples",
    "24",
    "--log_every",
    "0",
    "--timing_warmup_steps",
    "1",
    "--comm_probe_steps",
    "2",
    "--oversubscribe",
    "true",
    "--seed",
    "7",
    "--monitor_hz",
    "0",
    "--diffusion_form",
    "original",
]  # named, not the default: the default changed (to this one) after 6343a0c


def with_args(base: list[str], *more: str) -> list[str]:
    """base with `--name value` pairs of `more` replacing base's (the CLI refuses a repeated flag)."""
    out = dict(zip(base[0::2], base[1::2]))
    out.update(zip(more[0::2], more[1::2]))
    return [x for kv in out.items() for x in kv]


# name -> list of invocations (a resume is two); the data dir is added to DCRNN's
RUNS = {
    "resnet18-1rank": [with_args(R18, "--gpus", "1")],
    "resnet18-2ranks": [with_args(R18, "--gpus", "2")],
    "resnet18-2ranks-bf16-microbatches": [with_args(R18, "--gpus", "2", "--precision", "bf16", "--micro_batches", "2")],
    "resnet18-resume-mid-epoch": [
        with_args(R18, "--gpus", "2", "--stop_after_steps", "3"),
        with_args(R18, "--gpus", "2"),
    ],
    "cnn-2ranks": [with_args(CNN, "--gpus", "2")],
    "dcrnn-2ranks-ddp": [with_args(DCRNN, "--gpus", "2")],
    "dcrnn-2ranks-gp2": [with_args(DCRNN, "--gpus", "2", "--gp", "2")],
    "horovod-2proc": [with_args(R18, "--gpus", "2", "--engine", "horovod", "--comm_probe_steps", "0")],
    # fp16 autocast with the GradScaler enabled, on CPU ranks (see SITE: the lab itself refuses fp16 without a GPU)
    "resnet18-2ranks-fp16-scaler": [
        with_args(R18, "--gpus", "2", "--precision", "fp16", "--train_samples", "128", "--epochs", "1")
    ],
}
ENV = {"resnet18-2ranks-fp16-scaler": {"LAB_TRACE_CPU_FP16": "1"}}


def _sha(tensors) -> str:
    import torch

    h = hashlib.sha256()
    for k, v in tensors:
        h.update(k.encode())
        v = v.detach().cpu()
        v = v.to_dense() if v.layout != torch.strided else v  # DCRNN's sparse supports
        h.update(v.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _flat(prefix: str, obj, out: list) -> None:
    import torch

    if isinstance(obj, torch.Tensor):
        out.append((prefix, obj))
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            _flat(f"{prefix}.{k}", obj[k], out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _flat(f"{prefix}.{i}", v, out)


def checksums(run_dir: Path) -> dict:
    from kernels.records import checkpoint_file as checkpoint

    state, problem = checkpoint.read_state(run_dir / "checkpoint.pt")
    if state is None:
        raise RuntimeError(f"{run_dir / 'checkpoint.pt'}: {problem}")
    out = {}
    for key in ("model", "rank_buffers", "optimizer"):
        flat: list = []
        _flat(key, state.get(key), flat)
        out[key] = _sha(flat)
    out["global_step"] = state.get("global_step")
    out["lr"] = state["optimizer"]["param_groups"][0]["lr"]
    return out


def _keep(key: str) -> bool:
    return not any(key.startswith(t) or t in key for t in TIMING)


def record_fields(run_dir: Path) -> dict:
    with open(run_dir / "metrics.csv") as f:
        rows = [{k: v for k, v in r.items() if _keep(k)} for r in csv.DictReader(f)]
    summary = json.loads((run_dir / "summary.json").read_text())
    config = json.loads((run_dir / "config.json").read_text())
    return {
        "metrics": rows,
        "summary": {k: v for k, v in summary.items() if _keep(k)},
        "summary_keys": sorted(summary),
        "config_params": config["params"],
        "config_derived": config["derived"],
        "config_keys": sorted(config),
    }


def run_one(name: str, invocations: list, tree: Path, work: Path, data_dir: Path) -> dict:
    trace = work / name / "trace"
    trace.mkdir(parents=True)
    results = work / name / "runs"
    env = {
        **os.environ,
        "PYTHONPATH": f"{work / 'site'}{os.pathsep}{tree}",
        "LAB_TRACE_DIR": str(trace),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
    }
    t0 = time.perf_counter()
    for args in invocations:
        args = [*args, "--results_dir", str(results), "--run_id", name]
        if "dcrnn" in args:
            args += ["--data_dir", str(data_dir)]
        single = "--gpus" in args and args[args.index("--gpus") + 1] == "1"
        p = subprocess.run(
            [sys.executable, "-m", "kernels.train", *args],
            cwd=tree,
            capture_output=True,
            text=True,
            env={**env, **({"LAB_TRACE_SINGLE": "1"} if single else {}), **ENV.get(name, {})},
            timeout=900,
        )
        if p.returncode != 0:
            raise SystemExit(f"{name}: exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    losses = {f.stem: f.read_text().split() for f in sorted(trace.glob("rank*.txt"))}
    # the temporary folder differs between recordings: paths in the record are kept relative to it
    fields = json.loads(json.dumps(record_fields(results / name)).replace(str(work), "<work>"))
    return {
        "losses": losses,
        "weights": checksums(results / name),
        "record": fields,
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def record(out: Path, tree: Path, only: list[str] | None) -> None:
    from kernels.base.files import atomic_write_text

    work = Path(tempfile.mkdtemp(prefix="lab-trace-"))
    (work / "site").mkdir()
    (work / "site" / "sitecustomize.py").write_text(SITE)
    data_dir = work / "data"
    # the same synthetic traffic set for every tree: written once by this tree's generator
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from kernels.data import traffic; "
            "traffic.write_synthetic(traffic.directory('synthetic', sys.argv[1]), 300, 40, "
            "progress=lambda m: None)",
            str(data_dir),
        ],
        cwd=ROOT,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    traces = {}
    for name, invocations in RUNS.items():
        if only and name not in only:
            continue
        print(f"{name} ...", flush=True)
        traces[name] = run_one(name, invocations, tree, work, data_dir)
        n = sum(len(v) for v in traces[name]["losses"].values())
        print(
            f"  {n} backward losses, weights {traces[name]['weights']['model']}, {traces[name]['wall_s']} s", flush=True
        )
    git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True).stdout.strip()
    atomic_write_text(out, json.dumps({"tree": str(tree), "commit": git, "runs": traces}, indent=1))
    print(f"wrote {out}")


def compare(a: Path, b: Path) -> int:
    old, new = json.loads(a.read_text()), json.loads(b.read_text())
    print(f"# old {old['commit'][:10]}  new {new['commit'][:10]}")
    bad = 0
    for name in old["runs"]:
        if name not in new["runs"]:
            print(f"{name}: missing in {b}")
            bad += 1
            continue
        o, n = old["runs"][name], new["runs"][name]
        diffs = [k for k in ("losses", "weights") if o[k] != n[k]]
        for k in o["record"]:
            if o["record"][k] != n["record"][k]:
                diffs.append(f"record.{k}")
        steps = sum(len(v) for v in o["losses"].values())
        if diffs:
            bad += 1
            print(f"{name}: DIFFERS in {', '.join(diffs)}")
        else:
            print(
                f"{name}: identical ({steps} backward losses over {len(o['losses'])} rank(s), "
                f"weights {o['weights']['model']}, optimizer {o['weights']['optimizer']})"
            )
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("out", type=Path)
    r.add_argument("--tree", type=Path, default=ROOT)
    r.add_argument("--only", default="")
    c = sub.add_parser("compare")
    c.add_argument("old", type=Path)
    c.add_argument("new", type=Path)
    a = ap.parse_args()
    if a.cmd == "record":
        record(a.out, a.tree.resolve(), [s for s in a.only.split(",") if s])
        return 0
    return compare(a.old, a.new)


if __name__ == "__main__":
    sys.exit(main())
