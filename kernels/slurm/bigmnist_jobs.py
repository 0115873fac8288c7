"""lab bigmnist: build bigMNIST here or as a Slurm job array, verify it, describe it.

    lab bigmnist build  --out DIR [--versions 6 --replicas 200 --shard-samples 320000 ...]
    lab bigmnist submit --out DIR --tasks 8 [--cluster local ...]   # the same build as a Slurm job array
    lab bigmnist verify DIR                                           # sha256 of every shard vs the manifest
    lab bigmnist info   DIR

The set itself (format, builder, checks) is kernels/data/bigmnist.py; this module adds the
command line and the job array, which goes through the sweep machinery (kernels/slurm/sweep.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from kernels.data.bigmnist import Spec, build, human_bytes, load_manifest, resolve, verify
from kernels.base.errors import ConfigError, exit_status
from kernels.base.files import PROJECT_ROOT


def _args(argv):
    ap = argparse.ArgumentParser(prog="lab bigmnist", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    for name in ("build", "submit"):
        p = sub.add_parser(name, help="build the set here" if name == "build" else "build it as a Slurm job array")
        p.add_argument("--out", type=Path, default=PROJECT_ROOT / "data" / "bigmnist", help="where the set goes")
        p.add_argument(
            "--data-dir",
            type=Path,
            default=PROJECT_ROOT / "data",
            help="data root holding the source (mnist/ or fashion-mnist/)",
        )
        for f in Spec.__dataclass_fields__.values():
            flag = "--" + f.name.replace("_", "-")
            if f.type in ("bool", bool):
                p.add_argument(flag, type=_bool, default=f.default, help=f"default {str(f.default).lower()}")
            else:
                typ = {"int": int, "float": float, "str": str}[f.type if isinstance(f.type, str) else f.type.__name__]
                p.add_argument(flag, type=typ, default=f.default, help=f"default {f.default}")
        p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
        if name == "build":
            p.add_argument(
                "--task", type=int, default=None, help="array task index (default: $SLURM_ARRAY_TASK_ID, else 0)"
            )
            p.add_argument(
                "--tasks", type=int, default=None, help="array task count (default: $SLURM_ARRAY_TASK_COUNT, else 1)"
            )
        else:
            p.add_argument("--tasks", type=int, required=True, help="array tasks (each builds a range of shards)")
            p.add_argument("--cluster", default="local", help="cluster profile in clusters/ (partition, account)")
            p.add_argument("--time", default="02:00:00", help="time limit per task")
            p.add_argument("--cpus-per-task", type=int, default=None)
            p.add_argument("--gpus-per-node", type=int, default=None, help="augment on a GPU (e.g. 1)")
            p.add_argument("--dry-run", action="store_true")
    for name in ("verify", "info"):
        p = sub.add_parser(name)
        p.add_argument("dir", type=Path)
    return ap.parse_args(argv)


def _bool(s: str) -> bool:
    if s.lower() in ("1", "true", "yes", "on"):
        return True
    if s.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {s!r}")


def _spec_of(a) -> Spec:
    return Spec(**{k: getattr(a, k) for k in Spec.__dataclass_fields__})


def submit(a) -> str | None:
    """The build as one job array through the sweep machinery: task i builds shard range i."""
    from kernels.slurm import sweep
    from kernels.slurm.clusters import load_cluster, slurm_time

    spec = _spec_of(a)
    spec.check()
    if a.tasks < 1:
        raise ConfigError(f"--tasks: must be at least 1, got {a.tasks}")
    if a.time is not None:
        slurm_time(a.time, "--time")
    out, data = a.out.resolve(), a.data_dir.resolve()
    flags = " ".join(
        f"--{k.replace('_', '-')} {str(v).lower() if isinstance(v, bool) else v}" for k, v in asdict(spec).items()
    )
    python = Path(sys.executable)
    cmd = (
        f"cd {PROJECT_ROOT} && {python} -m kernels.slurm.bigmnist_jobs build --out {out} --data-dir {data} {flags} "
        f"--device {a.device} --tasks {a.tasks} --task {{task}}"
    )
    sw = {
        "name": f"bigmnist-{out.name}",
        "cluster": load_cluster(a.cluster),
        "combos": [{"task": i} for i in range(a.tasks)],
        "commands": [cmd.format(task=i) for i in range(a.tasks)],
        "sbatch": {
            k: v
            for k, v in (("time", a.time), ("cpus_per_task", a.cpus_per_task), ("gpus_per_node", a.gpus_per_node))
            if v is not None
        },
        "path": out,
    }
    return sweep.submit(sw, a.dry_run)


def main(argv=None) -> int:
    a = _args(argv)

    def body() -> int:
        if a.command == "build":
            task = a.task if a.task is not None else int(os.environ.get("SLURM_ARRAY_TASK_ID", 0))
            tasks = a.tasks if a.tasks is not None else int(os.environ.get("SLURM_ARRAY_TASK_COUNT", 1))
            dev = torch.device(a.device if a.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
            build(a.out, _spec_of(a), a.data_dir, task, tasks, dev, log=lambda s: print(s, flush=True))
        elif a.command == "submit":
            submit(a)
        elif a.command == "verify":
            bad = verify(a.dir, log=lambda s: print(s, flush=True))
            if bad:
                print(
                    f"error: {len(bad)} file(s) of {resolve(a.dir)} do not match the manifest: {', '.join(bad)}. "
                    f"Re-run the build with the manifest's parameters (`lab bigmnist info {a.dir}` prints them): "
                    f"it rebuilds exactly those shards",
                    file=sys.stderr,
                )
                return 1
            print(f"{resolve(a.dir)}: every shard matches the manifest")
        else:
            d, m = load_manifest(a.dir)
            print(json.dumps({k: v for k, v in m.items() if k not in ("shards",)}, indent=1))
            print(f"{len(m['shards'])} shards, {m['samples']:,} samples, {human_bytes(m['bytes'])} in {d}")
        return 0

    return exit_status(body)


if __name__ == "__main__":
    sys.exit(main())
