"""A generic sweep of any executable over an argument grid, as one Slurm job array.

    lab sweep submit  sweeps/osu_allreduce.yaml [--dry-run]
    lab sweep collect sweeps/osu_allreduce.yaml

A sweep file:
    name: allreduce_sizes
    cluster: local                  # a profile in clusters/ (partition, account, modules, env)
    command: "srun -n {ranks} ./allreduce --bytes {bytes}"   # {name} takes each grid value
    grid: {ranks: [2, 4], bytes: [1024, 1048576]}
    sbatch: {nodes: 2, ntasks_per_node: 2, time: "00:10:00"} # resources of every task
Each index of the array runs one command line (the grid's cartesian product, in
order) in results/sweeps/<name>/<index>/ and keeps command.txt, stdout.txt,
stderr.txt and exit_code.txt there; `collect` tabulates them.
"""
from __future__ import annotations

import argparse
import itertools
import json
import re
import shlex
import sys
from pathlib import Path

import yaml

from kernels.params import ConfigError, exit_status
from kernels.study import _check_keys, cluster_options, load_cluster, results_root, run_sbatch

SWEEP_KEYS = {"name": "sweep id", "cluster": "cluster profile", "command": "command template with {name} fields",
              "grid": "name -> list of values", "sbatch": "resources: nodes, ntasks_per_node, cpus_per_task, time"}
SBATCH_KEYS = {"nodes": "", "ntasks_per_node": "", "cpus_per_task": "", "time": "", "gpus_per_node": ""}


def load(path: Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"sweep file {path} not found")
    spec = yaml.safe_load(path.read_text()) or {}
    where = f"sweep file {path}"
    _check_keys(spec, SWEEP_KEYS, where)
    _check_keys(spec.get("sbatch") or {}, SBATCH_KEYS, f"{where}: key 'sbatch'")
    name = str(spec.get("name") or path.stem)
    if "command" not in spec:
        raise ConfigError(f"{where}: key 'command' is required")
    grid = spec.get("grid") or {}
    if not grid:
        raise ConfigError(f"{where}: key 'grid': an empty grid")
    for k, v in grid.items():
        if not isinstance(v, list) or not v:
            raise ConfigError(f"{where}: key 'grid.{k}': an empty grid; give a list of values")
        if len(set(map(str, v))) != len(v):
            raise ConfigError(f"{where}: key 'grid.{k}' lists a value twice (duplicate points)")
    fields = set(re.findall(r"{(\w+)}", spec["command"]))
    if fields - set(grid):
        raise ConfigError(f"{where}: key 'command' uses {', '.join(sorted(fields - set(grid)))} not in 'grid'")
    if set(grid) - fields:
        raise ConfigError(f"{where}: key 'grid.{sorted(set(grid) - fields)[0]}' is not used by 'command'")
    combos = [dict(zip(grid, vals)) for vals in itertools.product(*grid.values())]
    commands = [spec["command"].format(**{k: shlex.quote(str(v)) for k, v in c.items()}) for c in combos]
    return {"name": name, "cluster": load_cluster(str(spec.get("cluster", "local"))), "combos": combos,
            "commands": commands, "sbatch": spec.get("sbatch") or {}, "path": path}


def outdir(sweep: dict) -> Path:
    return results_root() / "sweeps" / sweep["name"]


def sbatch_command(sweep: dict) -> list[str]:
    c, r, out = sweep["cluster"], sweep["sbatch"], outdir(sweep)
    cmd = ["sbatch", "--parsable", f"--array=0-{len(sweep['commands']) - 1}", f"--job-name={sweep['name']}",
           f"--nodes={r.get('nodes', 1)}", f"--ntasks-per-node={r.get('ntasks_per_node', 1)}",
           f"--cpus-per-task={r.get('cpus_per_task', c['cpus_per_task'])}", f"--time={r.get('time', c['time'])}",
           f"--output={out}/slurm-%A_%a.out"]
    if r.get("gpus_per_node") is not None:
        cmd.append(f"--gpus-per-node={r['gpus_per_node']}")
    cmd += cluster_options(c)
    if c["env"]:
        cmd.append("--export=ALL," + ",".join(f"{k}={v}" for k, v in c["env"].items()))
    return cmd + ["slurm/sweep_task.sbatch", str(out / "commands.txt"), str(out)]


def submit(sweep: dict, dry_run: bool = False) -> str | None:
    cmd = sbatch_command(sweep)
    print(shlex.join(cmd))
    for i, line in enumerate(sweep["commands"]):
        print(f"  {i}: {line}")
    if dry_run:
        return None
    out = outdir(sweep)
    out.mkdir(parents=True, exist_ok=True)
    (out / "commands.txt").write_text("\n".join(sweep["commands"]) + "\n")
    (out / "grid.json").write_text(json.dumps(sweep["combos"], indent=2) + "\n")
    job = run_sbatch(cmd, "the sweep")
    print(f"submitted job array {job}")
    return job


def collect(sweep: dict) -> list[dict]:
    out, rows = outdir(sweep), []
    for i, combo in enumerate(sweep["combos"]):
        d = out / str(i)
        code = (d / "exit_code.txt").read_text().strip() if (d / "exit_code.txt").exists() else None
        rows.append({"index": i, **combo, "exit_code": None if code is None else int(code),
                     "stdout": str(d / "stdout.txt") if (d / "stdout.txt").exists() else None})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="lab sweep", description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["submit", "collect"])
    ap.add_argument("sweep", type=Path)
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)

    def body() -> None:
        sweep = load(a.sweep)
        if a.command == "submit":
            submit(sweep, a.dry_run)
            return
        for r in collect(sweep):
            state = "not run" if r["exit_code"] is None else f"exit {r['exit_code']}"
            args = " ".join(f"{k}={r[k]}" for k in sweep["combos"][0])
            print(f"{r['index']:>4} {args:<40} {state:<8} {r['stdout'] or ''}")

    return exit_status(body)


if __name__ == "__main__":
    sys.exit(main())
