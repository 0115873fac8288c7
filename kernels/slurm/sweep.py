r"""A generic sweep of any executable over an argument grid, as one Slurm job array.

    lab sweep submit  sweeps/allreduce_latency.yaml [--dry-run]
    lab sweep collect sweeps/allreduce_latency.yaml [--csv]

A sweep file (sweeps/allreduce_latency.yaml is a complete one):
    name: allreduce_sizes
    cluster: local                  # a profile in clusters/ (partition, account, modules, env)
    setup: "mpicc -O2 -o {sweep_dir}/prog {project}/sweeps/prog.c"   # once, before submitting (optional)
    command: "mpirun -np {ranks} {sweep_dir}/prog {bytes}"            # {name} takes each grid value
    grid: {ranks: [2, 4], bytes: [1024, 1048576]}
    parse: '^(?P<bytes>\d+) (?P<avg_us>\S+)'   # a regex over stdout: its named groups become columns (optional)
    env: {OMPI_ALLOW_RUN_AS_ROOT: 1}           # exported to every task, over the cluster's (optional)
    sbatch: {nodes: 2, ntasks_per_node: 2, time: "00:10:00"} # resources of every task
{sweep_dir} (results/sweeps/<name>) and {project} (this repository) are filled in
setup and command. Each index of the array runs one command line (the grid's
cartesian product, in order) in results/sweeps/<name>/<index>/ and keeps
command.txt, stdout.txt, stderr.txt and exit_code.txt there; `collect` tabulates
them, one row per index, or one per stdout line that `parse` matches, and
writes the table to results/sweeps/<name>/table.csv.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

from kernels.base.errors import ConfigError, exit_status
from kernels.base.files import PROJECT_ROOT
from kernels.base import files, yamlfile
from kernels.slurm.clusters import check_env, check_keys, cluster_options, count, load_cluster, slurm_time
from kernels.slurm.study import log_folder, one_line, results_root, run_sbatch

SWEEP_KEYS = {
    "name": "sweep id",
    "cluster": "cluster profile",
    "command": "command template with {name} fields",
    "grid": "name -> list of values",
    "sbatch": "resources: nodes, ntasks_per_node, cpus_per_task, time",
    "setup": "shell command run once before submitting (e.g. compile the program)",
    "parse": "regex with named groups applied to each line of a task's stdout (columns of the table)",
    "env": "environment variables exported to every task",
}
RESERVED = ("sweep_dir", "project")
SBATCH_KEYS = {"nodes": "", "ntasks_per_node": "", "cpus_per_task": "", "time": "", "gpus_per_node": ""}


def _resources(res: dict, where: str) -> dict:
    """The sweep's sbatch resources, each a count or a Slurm time limit."""
    check_keys(res, SBATCH_KEYS, f"{where}: key 'sbatch'")
    for k, v in res.items():
        if k == "time":
            res[k] = slurm_time(v, f"{where}: key 'sbatch.time'")
        else:
            count(v, f"{where}: key 'sbatch.{k}'", 0 if k == "gpus_per_node" else 1)
    return res


def load(path: Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"sweep file {path} not found")
    spec = yamlfile.read(path, "sweep file")
    where = f"sweep file {path}"
    check_keys(spec, SWEEP_KEYS, where)
    resources = _resources(spec.get("sbatch") or {}, where)
    name = str(spec.get("name") or path.stem)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or name in (".", ".."):
        raise ConfigError(
            f"{where}: key 'name': {name!r} may hold letters, digits, '-', '_' and '.' only (it names "
            f"the sweep's folder under results/sweeps)"
        )
    if "command" not in spec:
        raise ConfigError(f"{where}: key 'command' is required")
    if not isinstance(spec["command"], str):
        raise ConfigError(f"{where}: key 'command' must be one command line (text), got {spec['command']!r}")
    spec["command"] = spec["command"].strip()  # a YAML block scalar ends in a newline
    one_line(where, "command", spec["command"])
    grid = spec.get("grid") or {}
    if not isinstance(grid, dict):
        raise ConfigError(f"{where}: key 'grid' must map names to lists of values, e.g. {{bytes: [8, 1024]}}")
    if not grid:
        raise ConfigError(f"{where}: key 'grid': an empty grid")
    for k, v in grid.items():
        if not isinstance(v, list) or not v:
            what = "an empty grid; give a list of values" if v == [] else f"{v!r} is not a grid; give a list of values"
            raise ConfigError(f"{where}: key 'grid.{k}': {what}")
        if len(set(map(str, v))) != len(v):
            raise ConfigError(f"{where}: key 'grid.{k}' lists a value twice (duplicate points)")
        for value in v:
            one_line(where, f"grid.{k}", value)
    fields = set(re.findall(r"{(\w+)}", spec["command"])) - set(RESERVED)
    if fields - set(grid):
        raise ConfigError(f"{where}: key 'command' uses {', '.join(sorted(fields - set(grid)))} not in 'grid'")
    if set(grid) - fields:
        raise ConfigError(f"{where}: key 'grid.{sorted(set(grid) - fields)[0]}' is not used by 'command'")
    bad = [k for k in grid if k in RESERVED]
    if bad:
        raise ConfigError(f"{where}: key 'grid.{bad[0]}' is reserved ({', '.join(RESERVED)} are filled by the sweep)")
    setup = spec.get("setup") or ""
    extra = set(re.findall(r"{(\w+)}", setup)) - set(RESERVED)
    if extra:
        raise ConfigError(f"{where}: key 'setup' may use {{sweep_dir}} and {{project}} only, not {sorted(extra)[0]}")
    parse = spec.get("parse")
    if parse is not None:
        try:
            rx = re.compile(str(parse))
        except re.error as e:
            raise ConfigError(f"{where}: key 'parse': not a regular expression ({e})") from None
        if not rx.groupindex:
            raise ConfigError(f"{where}: key 'parse' needs named groups, e.g. (?P<avg_us>\\S+): they name the columns")
    env = check_env(spec.get("env") or {}, where)
    combos = [dict(zip(grid, vals)) for vals in itertools.product(*grid.values())]
    sweep = {
        "name": name,
        "cluster": load_cluster(str(spec.get("cluster", "local"))),
        "combos": combos,
        "sbatch": resources,
        "path": path,
        "parse": parse,
        "env": {str(k): str(v) for k, v in env.items()},
    }
    fixed = {"sweep_dir": shlex.quote(str(outdir(sweep).resolve())), "project": shlex.quote(str(PROJECT_ROOT))}
    sweep["commands"] = [
        spec["command"].format(**fixed, **{k: shlex.quote(str(v)) for k, v in c.items()}) for c in combos
    ]
    sweep["setup"] = setup.format(**fixed) if setup else ""
    return sweep


def outdir(sweep: dict) -> Path:
    return results_root() / "sweeps" / sweep["name"]


def sbatch_command(sweep: dict) -> list[str]:
    c, r, out = sweep["cluster"], sweep["sbatch"], outdir(sweep)
    cmd = [
        "sbatch",
        "--parsable",
        f"--array=0-{len(sweep['commands']) - 1}",
        f"--job-name={sweep['name']}",
        f"--nodes={r.get('nodes', 1)}",
        f"--ntasks-per-node={r.get('ntasks_per_node', 1)}",
        f"--cpus-per-task={r.get('cpus_per_task', c['cpus_per_task'])}",
        f"--time={r.get('time', c['time'])}",
        f"--output={out}/slurm-%A_%a.out",
    ]
    if r.get("gpus_per_node") is not None:
        cmd.append(f"--gpus-per-node={r['gpus_per_node']}")
    cmd += cluster_options(c)
    env = {**{k: str(v) for k, v in c["env"].items()}, **sweep.get("env", {})}
    if env:
        cmd.append("--export=ALL," + ",".join(f"{k}={v}" for k, v in env.items()))
    return cmd + ["slurm/sweep_task.sbatch", str(out / "commands.txt"), str(out)]


def _write_commands(sweep: dict, out: Path) -> None:
    files.atomic_write_text(out / "commands.txt", "\n".join(sweep["commands"]) + "\n", "LAB_RESULTS")
    files.atomic_write_text(out / "grid.json", json.dumps(sweep["combos"], indent=2) + "\n", "LAB_RESULTS")


def submit(sweep: dict, dry_run: bool = False) -> str | None:
    cmd = sbatch_command(sweep)
    print(shlex.join(cmd))
    for i, line in enumerate(sweep["commands"]):
        print(f"  {i}: {line}")
    out = log_folder(outdir(sweep))  # the array's logs go there too
    if dry_run:  # the files the line names exist, so it runs when copied (after the setup, if any)
        _write_commands(sweep, out)
        setup = (
            f"; its setup has not run: run `{sweep['setup']}` in {out} first, or submit without --dry-run"
            if sweep.get("setup")
            else ""
        )
        print(f"wrote {out / 'commands.txt'}: the line runs as printed from {PROJECT_ROOT}{setup}")
        return None
    if sweep.get("setup"):  # (sweeps built in code, such as bigMNIST's build array, have none)
        print(f"setup: {sweep['setup']}", flush=True)
        p = subprocess.run(sweep["setup"], shell=True, cwd=out, capture_output=True, text=True)
        files.atomic_write_text(out / "setup.log", p.stdout + p.stderr)
        if p.returncode != 0:
            raise ConfigError(
                f"the sweep's setup failed (exit {p.returncode}), nothing submitted: "
                f"{(p.stderr or p.stdout).strip()[-600:]}"
            )
    _write_commands(sweep, out)
    job = run_sbatch(cmd, "the sweep")
    print(f"submitted job array {job}")
    return job


def collect(sweep: dict) -> list[dict]:
    """One row per index (grid values, exit code, stdout path), or with `parse` one per matching stdout line
    (plus the named groups, numbers typed); written to <sweep_dir>/table.csv."""
    out, rows = outdir(sweep), []
    rx = re.compile(sweep["parse"]) if sweep.get("parse") else None
    for i, combo in enumerate(sweep["combos"]):
        d = out / str(i)
        code = (d / "exit_code.txt").read_text(errors="replace").strip() if (d / "exit_code.txt").exists() else None
        if code is not None and not re.fullmatch(r"-?\d+", code):
            raise ConfigError(
                f"{d / 'exit_code.txt'}: {code[:40]!r} is not an exit status; the task writes it when its command "
                f"ends: remove the file (the task then shows as not run) or run the task again"
            )
        base = {
            "index": i,
            **combo,
            "exit_code": None if code is None else int(code),
            "stdout": str(d / "stdout.txt") if (d / "stdout.txt").exists() else None,
        }
        matched = []
        if rx is not None and base["stdout"]:
            for line in Path(base["stdout"]).read_text(errors="replace").splitlines():
                m = rx.search(line)
                if m:
                    matched.append({**base, **{k: _typed(v) for k, v in m.groupdict().items()}})
        rows += matched or [base]
    if rows:
        import csv
        import io

        buf = io.StringIO(newline="")
        w = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        w.writeheader()
        w.writerows(rows)
        files.atomic_write_text(out / "table.csv", buf.getvalue(), "LAB_RESULTS")  # whole, or a one-line error
    return rows


def _typed(v):
    for t in (int, float):
        try:
            return t(v)
        except (TypeError, ValueError):
            pass
    return v


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="lab sweep", description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["submit", "collect"])
    ap.add_argument("sweep", type=Path)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--csv", action="store_true", help="collect: print the table as CSV")
    a = ap.parse_args(argv)

    def body() -> None:
        sweep = load(a.sweep)
        if a.command == "submit":
            submit(sweep, a.dry_run)
            return
        rows = collect(sweep)
        if a.csv:
            print((outdir(sweep) / "table.csv").read_text(), end="")
            return
        keys = list(sweep["combos"][0])
        parsed = [
            k for k in dict.fromkeys(k for r in rows for k in r) if k not in (*keys, "index", "exit_code", "stdout")
        ]
        print(" ".join(f"{c:>12}" for c in ["index", *keys, "exit", *parsed]))
        for r in rows:
            state = "not run" if r["exit_code"] is None else str(r["exit_code"])
            print(
                " ".join(f"{str(r.get(c, '')):>12}" for c in ["index", *keys])
                + f" {state:>12} "
                + " ".join(f"{str(r.get(c, '')):>12}" for c in parsed)
            )
        print(f"table: {outdir(sweep) / 'table.csv'}")

    return exit_status(body)


if __name__ == "__main__":
    sys.exit(main())
