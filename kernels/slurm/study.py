"""Scaling studies on Slurm: one YAML file -> job arrays of notebook runs -> status -> resubmission.

    lab study submit   studies/strong_resnet18.yaml [--dry-run]
    lab study status   studies/strong_resnet18.yaml
    lab study resubmit studies/strong_resnet18.yaml [--points 3,7] [--dry-run]
    lab study points   studies/strong_resnet18.yaml [--write | --point N]

A study file names the notebook, a cluster profile (clusters/<name>.yaml: the
only file that changes between clusters), the mode (strong: fixed global batch;
weak: fixed per-GPU batch; sweep: a grid at each GPU count), the GPU counts,
fixed and swept parameters of 01_train and the repeats. Every (GPU count,
grid combination, repeat) is a point with a stable run id `<study>-p<NNN>`.
Points of one job geometry (nodes x tasks per node) go into one job array; each
array task runs slurm/papermill_run.sbatch on the notebook with its point's
parameters, and the study id and point are recorded in the run record.

Repeat r of a point runs with seed + r, so repeats are independent samples.
Everything is validated (unknown keys, impossible geometry, empty grids,
duplicate points, unknown parameters) before anything is submitted.
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import yaml

from kernels.records.schema import RecordError, read_json
from kernels.base.errors import ConfigError, exit_status
from kernels.base.files import PROJECT_ROOT, results_home
from kernels.launch.config import missing_data, resolve, table
from kernels.launch.launchers import geometry
from kernels.base import files, yamlfile
from kernels.slurm.clusters import (
    account_warning,
    check_env,
    check_keys,
    cluster_env,
    cluster_options,
    export_option,
    load_cluster,
)

STUDY_KEYS = {
    "name": "study id (default: the file name)",
    "description": "free text",
    "notebook": "notebook to run: notebooks/01_train.ipynb (default) or notebooks/03_commbench.ipynb",
    "cluster": "cluster profile: a name in clusters/ or a path",
    "mode": "strong | weak | sweep",
    "gpus": "list of GPU counts",
    "repeats": "runs per point (>= 1)",
    "ranks_per_node": "list of ranks per node to sweep at each GPU count (default: the cluster's)",
    "serial": "true: run the points one at a time (every array throttled to one task, arrays after each "
    "other, repeats interleaved across scales), for timings on nodes that share a machine",
    "env": "environment variables for this study's jobs, over the cluster profile's (e.g. OMP_NUM_THREADS)",
    "fixed": "01_train parameters held fixed (weak mode: batch_per_gpu instead of batch)",
    "batch_rounding": "strong mode, down: a GPU count that does not divide fixed.batch runs the largest multiple "
    "of it below (512 at 12 GPUs: 504, 42 per GPU), and its record keeps the study's batch (lab_study_batch) so "
    "the point stays in its series; default: such a count is refused",
    "sweep": "01_train parameters -> lists of values (their grid is run at each GPU count)",
}
STUDY_NOTEBOOKS = ("01_train", "02_profile", "03_commbench")  # the notebooks whose parameters a point sets
SUBMISSIONS = "submissions.json"  # in the study's state folder: every job array submitted, in order
MODES = ("strong", "weak", "sweep")


def results_root() -> Path:
    return results_home()


@dataclass(frozen=True)
class Point:
    index: int
    gpus: int
    repeat: int
    params: dict  # the notebook's parameters for this run (without gpus)
    nodes: int
    tasks_per_node: int

    @property
    def run_id(self) -> str:
        return self.params["run_id"]


@dataclass
class Study:
    name: str
    path: Path
    notebook: str
    cluster: dict
    mode: str
    points: list[Point]
    env: dict = None
    serial: bool = False

    @property
    def state_dir(self) -> Path:
        return results_root() / "studies" / self.name

    @property
    def runs_dir(self) -> Path:
        rd = self.points[0].params.get("results_dir") if self.points else ""
        return Path(rd) if rd else results_home() / ("comm" if is_commbench(self.notebook) else "runs")


def is_commbench(notebook: str) -> bool:
    return Path(notebook).stem == "03_commbench"


def _notebook_params(notebook: str, fixed: dict):
    """(parameter names, resolve function, what to call them) of the study's notebook."""
    if is_commbench(notebook):
        from kernels.comm import bench

        return [p.name for p in bench.PARAMS], bench.resolve, "03_commbench"
    return [p.name for p in table(str(fixed.get("workload") or ""))], resolve, "01_train"


def load(path: Path) -> Study:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"study file {path} not found")
    spec = yamlfile.read(path, "study file")
    where = f"study file {path}"
    check_keys(spec, STUDY_KEYS, where)
    name = str(spec.get("name") or path.stem)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ConfigError(f"{where}: key 'name': {name!r} may hold letters, digits, '-', '_' and '.' only")
    mode = spec.get("mode", "strong")
    if mode not in MODES:
        raise ConfigError(f"{where}: key 'mode': {mode!r} is not one of {', '.join(MODES)}")
    gpus = spec.get("gpus")
    if not isinstance(gpus, list) or not gpus:
        raise ConfigError(f"{where}: key 'gpus' must be a non-empty list of GPU counts")
    if len(set(gpus)) != len(gpus):
        raise ConfigError(f"{where}: key 'gpus' lists a GPU count twice (duplicate points): {gpus}")
    repeats = spec.get("repeats", 1)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"{where}: key 'repeats' must be an integer >= 1, got {repeats!r}")
    for key, shape in (("fixed", "values, e.g. {batch: 512}"), ("sweep", "lists of values, e.g. {lr: [0.1, 0.2]}")):
        if not isinstance(spec.get(key) or {}, dict):
            raise ConfigError(f"{where}: key '{key}' must map parameter names to {shape}, got {spec[key]!r}")
    fixed = dict(spec.get("fixed") or {})
    sweep = dict(spec.get("sweep") or {})
    if mode == "sweep" and not sweep:
        raise ConfigError(f"{where}: key 'sweep': mode sweep needs a grid (parameter: [values, ...])")
    for k, values in sweep.items():
        if not isinstance(values, list) or not values:
            what = (
                "an empty grid; give a list of values"
                if values == []
                else f"{values!r} is not a grid; give a list of values"
            )
            raise ConfigError(f"{where}: key 'sweep.{k}': {what}")
        if len(set(map(str, values))) != len(values):
            raise ConfigError(f"{where}: key 'sweep.{k}' lists a value twice (duplicate points): {values}")
        if k in fixed:
            raise ConfigError(f"{where}: key 'sweep.{k}' is also in 'fixed' (duplicate points)")
    per_gpu = fixed.pop("batch_per_gpu", None)
    if mode == "weak" and (per_gpu is None or "batch" in fixed or "batch" in sweep):
        raise ConfigError(
            f"{where}: key 'fixed.batch_per_gpu': weak scaling fixes the per-GPU batch "
            f"(and not 'batch', which becomes batch_per_gpu x gpus)"
        )
    if mode != "weak" and per_gpu is not None:
        raise ConfigError(f"{where}: key 'fixed.batch_per_gpu' belongs to mode weak; use 'batch' (global)")
    notebook = spec.get("notebook", "notebooks/01_train.ipynb")
    if not (PROJECT_ROOT / str(notebook)).is_file():
        raise ConfigError(f"{where}: key 'notebook': {notebook} not found")
    if Path(notebook).stem not in STUDY_NOTEBOOKS:
        raise ConfigError(
            f"{where}: key 'notebook': {notebook} runs no training or benchmark point; a study runs "
            f"{', '.join(f'notebooks/{n}.ipynb' for n in STUDY_NOTEBOOKS)}"
        )
    known, check, nb_name = _notebook_params(notebook, fixed)
    if is_commbench(notebook) and mode == "weak":
        raise ConfigError(
            f"{where}: key 'mode': a commbench study has no batch to hold fixed; use strong (a list "
            f"of rank counts) or sweep (a grid of 03_commbench parameters at each count)"
        )
    for k in (*fixed, *sweep):
        if k not in known:
            close = difflib.get_close_matches(str(k), known, n=1)
            raise ConfigError(
                f"{where}: key 'fixed/sweep.{k}': not a parameter of {nb_name}"
                + (f"; did you mean '{close[0]}'?" if close else "")
            )
        if k in ("gpus", "run_id", "label", "launcher"):
            raise ConfigError(f"{where}: key '{k}' is set by the study itself; remove it")
    cluster = load_cluster(str(spec.get("cluster", "local")))
    per_node = cluster["gpus_per_node"] or cluster["ranks_per_node"]
    rpn_list = spec.get("ranks_per_node", [per_node])
    if not isinstance(rpn_list, list) or not rpn_list or not all(isinstance(x, int) and x >= 1 for x in rpn_list):
        raise ConfigError(f"{where}: key 'ranks_per_node' must be a non-empty list of integers >= 1, got {rpn_list!r}")
    if per_node and max(rpn_list) > per_node:
        raise ConfigError(
            f"{where}: key 'ranks_per_node': {max(rpn_list)} exceeds the {per_node} per node of cluster "
            f"'{cluster['name']}'"
        )

    combos = [dict(zip(sweep, vals)) for vals in itertools.product(*sweep.values())] if sweep else [{}]
    shapes = _shapes(where, gpus, rpn_list, cluster, per_node)
    rounding = _batch_rounding(where, spec, mode, fixed, sweep)
    points = _points(where, name, notebook, mode, shapes, combos, repeats, fixed, per_gpu, check, rounding)
    env = check_env(spec.get("env") or {}, where)
    if rounding:  # the records of a rounded point name the study's batch, which keeps them in its series
        env = {**env, "LAB_STUDY_BATCH": fixed["batch"]}
    serial = spec.get("serial", False)
    if not isinstance(serial, bool):
        raise ConfigError(f"{where}: key 'serial' must be true or false, got {serial!r}")
    return Study(name, path, notebook, cluster, mode, points, {str(k): str(v) for k, v in env.items()}, serial)


def one_line(where: str, key: str, value) -> None:
    """A value that reaches a command line holds no control character: commands.txt is one command per line, so
    a newline would make the rest of the value a command of its own."""
    bad = [c for c in str(value) if ord(c) < 32 or ord(c) == 127]
    if bad:
        raise ConfigError(
            f"{where}: key '{key}': {str(value)!r} holds a control character ({bad[0]!r}); values that "
            f"reach a command line must be one line of printable text"
        )


def _shapes(where: str, gpus: list, rpn_list: list, cluster: dict, per_node: int) -> list[tuple[int, int, int]]:
    """(ranks, nodes, ranks per node) of every point shape the cluster can hold."""
    shapes = []
    for n in gpus:
        if not isinstance(n, int) or n < 1:
            raise ConfigError(f"{where}: key 'gpus': {n!r} is not a GPU count >= 1")
        for rpn in rpn_list:
            try:
                nodes, tasks = geometry(n, rpn)
            except ConfigError as e:
                raise ConfigError(
                    f"{where}: key 'gpus': {e} (cluster '{cluster['name']}' has {per_node} per node"
                    f"{'' if len(rpn_list) == 1 else f'; ranks_per_node {rpn}'})"
                ) from None
            if cluster["max_nodes"] and nodes > cluster["max_nodes"]:
                if len(rpn_list) > 1:  # a nodes x ranks-per-node grid: the shapes that fit are run
                    continue
                raise ConfigError(
                    f"{where}: key 'gpus': {n} needs {nodes} nodes but cluster '{cluster['name']}' "
                    f"has {cluster['max_nodes']} (max_nodes)"
                )
            if (n, nodes, tasks) not in shapes:  # n <= rpn: one node whatever rpn is; run that shape once
                shapes.append((n, nodes, tasks))
        if not any(sh[0] == n for sh in shapes):
            raise ConfigError(
                f"{where}: key 'gpus': {n} fits no ranks_per_node of {rpn_list} on cluster "
                f"'{cluster['name']}' ({cluster['max_nodes']} nodes, max_nodes)"
            )
    return shapes


def _batch_rounding(where: str, spec: dict, mode: str, fixed: dict, sweep: dict) -> bool:
    """Whether the study rounds a global batch down to a multiple of the GPU count (key batch_rounding)."""
    rounding = spec.get("batch_rounding")
    if rounding is None:
        return False
    if rounding != "down":
        raise ConfigError(f"{where}: key 'batch_rounding': {rounding!r}; the only value is down")
    if mode != "strong" or not isinstance(fixed.get("batch"), int) or "batch" in sweep:
        raise ConfigError(f"{where}: key 'batch_rounding' belongs to mode strong with an integer fixed.batch")
    return True


def _points(where, name, notebook, mode, shapes, combos, repeats, fixed, per_gpu, check, rounding=False) -> list:
    """Every point of the study: shapes x grid x repeats, each checked as its notebook would."""
    points, seen = [], set()
    base_seed = int(fixed.get("seed", 0))
    for n, nodes, tasks in shapes:
        for combo in combos:
            for r in range(repeats):
                params = {**fixed, **combo, "label": name}
                if not is_commbench(notebook):
                    params["seed"] = base_seed + r
                if mode == "weak":
                    params["batch"] = per_gpu * n
                if rounding and params["batch"] % n:
                    params["batch"] = n * (params["batch"] // n)  # the record's lab_study_batch keeps the series
                key = json.dumps({"gpus": n, "nodes": nodes, "repeat": r, **params}, sort_keys=True, default=str)
                if key in seen:
                    raise ConfigError(f"{where}: duplicate point gpus={n} {combo}")
                seen.add(key)
                params["run_id"] = f"{name}-p{len(points):03d}"
                try:
                    check({**params, "gpus": n})
                except ConfigError as e:
                    raise ConfigError(f"{where}: point gpus={n} {combo}: {e}") from None
                points.append(Point(len(points), n, r, params, nodes, tasks))
    return points


# -------------------------------------------------------------- submission
def point_file(study: Study, p: Point) -> Path:
    return study.state_dir / "points" / f"p{p.index:03d}.yaml"


def point_yaml(p: Point) -> str:
    """The point's 01_train parameters as a Papermill parameter file (-f FILE)."""
    return yaml.safe_dump({**p.params, "gpus": p.gpus}, sort_keys=True)


def write_point(study: Study, p: Point) -> Path:
    path = point_file(study, p)
    path.parent.mkdir(parents=True, exist_ok=True)
    files.atomic_write_text(path, point_yaml(p), "LAB_RESULTS")
    return path


def require_sbatch(what: str) -> None:
    """A one-line refusal where Slurm's sbatch is not on PATH (a laptop, a container without Slurm), after the
    line was printed: the submitters print it first, so it can be run where Slurm is."""
    if shutil.which("sbatch") is None:
        raise ConfigError(
            f"Slurm's sbatch is not on PATH here, so {what} was not submitted: run the line above on "
            f"a login node of the cluster (--dry-run only prints it)"
        )


def log_folder(path: Path) -> Path:
    """Make the folder Slurm writes a job's log into (it does not make one) and check it is the user's alone: Slurm
    opens the log by its name and follows a link there, and job ids are easy to guess, so a folder others may
    write to would let them redirect (or read) the job's output. A one-line refusal with the fix, else the path."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    why = files.not_private(path)
    if why:
        raise ConfigError(
            f"job logs: {why}; Slurm writes the job's log there by name and would follow a link another user "
            f"planted: make it yours alone (chmod go-w {path}) or set LAB_RESULTS to a folder of yours"
        )
    return path


def run_sbatch(cmd: list[str], what: str) -> str:
    """Submit; return the (array) job id, or raise with sbatch's own reason."""
    require_sbatch(what)
    p = subprocess.run(cmd, cwd=PROJECT_ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        raise ConfigError(f"sbatch refused {what}: {p.stderr.strip()}")
    return p.stdout.strip().split(";")[0]


def sbatch_command(study: Study, nodes: int, tasks: int, count: int, list_file: Path) -> list[str]:
    c = study.cluster
    logs = results_root() / "logs"
    cmd = [
        "sbatch",
        "--parsable",
        f"--array=0-{count - 1}" + ("%1" if study.serial else ""),
        f"--job-name={study.name}",
        f"--nodes={nodes}",
        f"--ntasks-per-node={tasks}",
        f"--gpus-per-node={tasks if c['gpus_per_node'] else 0}",
        f"--cpus-per-task={c['cpus_per_task']}",
        f"--time={c['time']}",
        f"--output={logs}/{study.name}-%A_%a.out",
    ]
    cmd += cluster_options(c) + (["--dependency=singleton"] if study.serial else [])
    env = {
        "LAB_STUDY_ID": study.name,
        "LAB_ARRAY_PARAMS": str(list_file),
        "LAB_STUDY_REPEATS": str(1 + max((p.repeat for p in study.points), default=0)),
        **cluster_env(c),
        **(study.env or {}),
    }
    if os.environ.get("LAB_RESULTS"):
        env["LAB_RESULTS"] = os.environ["LAB_RESULTS"]
    return cmd + export_option(env) + ["slurm/papermill_run.sbatch", study.notebook]


def arrays(points: list[Point], serial: bool) -> list[tuple[tuple[int, int], list[Point]]]:
    """The job arrays, in submission order: ((nodes, tasks per node), points). One per geometry; for a serial
    study one per (repeat, geometry), repeats first."""
    groups: dict[tuple, list[Point]] = {}
    for p in points:
        groups.setdefault((p.repeat if serial else 0, p.nodes, p.tasks_per_node), []).append(p)
    return [((nodes, tasks), pts) for (_, nodes, tasks), pts in sorted(groups.items())]


def data_warnings(study: Study, points: list[Point]) -> list[str]:
    """Each data set the points would find missing or damaged, said once, before their jobs wait in the queue only
    to stop at their start (a warning: the jobs' nodes may see a data_dir this node does not)."""
    if is_commbench(study.notebook):
        return []
    names = ("workload", "dataset", "data_dir")
    out = []
    for key in dict.fromkeys(tuple(p.params.get(k) for k in names) for p in points):
        why = missing_data(resolve({k: v for k, v in zip(names, key) if v is not None}))
        if why:
            out.append(f"warning: the study's jobs would stop at their start: {why}")
    return out


def submit(study: Study, only: list[int] | None = None, dry_run: bool = False, out=None) -> list[dict]:
    """One job array per geometry; a serial study's arrays run one after another, one per repeat and geometry in
    repeat order, so its repeats interleave across scales (1, 2, 4, 1, 2, 4, ...) and a passing load touches
    every scale, not all repeats of one. Returns the submissions (job id, points). out: default sys.stdout as it
    is when called (a default bound at import kept a stream that had since been replaced)."""
    out = out or sys.stdout
    points = [p for p in study.points if only is None or p.index in only]
    if not points:
        print(f"study {study.name}: nothing to submit", file=out)
        return []
    subs = []
    state = study.state_dir
    for warn in [account_warning(study.cluster), *data_warnings(study, points)]:
        if warn:
            print(warn, file=sys.stderr)
    for (nodes, tasks), pts in arrays(points, study.serial):
        # unique per submission: an array still running keeps reading its own list
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-%f")
        list_file = state / "arrays" / f"n{nodes}x{tasks}-{stamp}.txt"
        cmd = sbatch_command(study, nodes, tasks, len(pts), list_file)
        print(shlex.join(cmd), file=out)
        print(f"  array tasks 0..{len(pts) - 1} = points {', '.join(str(p.index) for p in pts)}", file=out)
        # the files the line names exist even on a dry run, so a printed line runs when copied
        log_folder(results_root() / "logs")
        list_file.parent.mkdir(parents=True, exist_ok=True)
        lines = [str(write_point(study, p)) for p in pts]
        files.atomic_write_text(list_file, "\n".join(lines) + "\n", "LAB_RESULTS")
        if dry_run:
            print(
                f"  wrote its parameter list {list_file} ({len(lines)} point files): the line runs as printed "
                f"from {PROJECT_ROOT}",
                file=out,
            )
            continue
        job = run_sbatch(cmd, f"the array for {nodes}x{tasks}")
        print(f"  submitted job array {job}", file=out, flush=True)
        subs.append(
            {
                "array_job_id": job,
                "nodes": nodes,
                "tasks_per_node": tasks,
                "points": [p.index for p in pts],
                "list_file": str(list_file),
            }
        )
    if subs:
        history = submissions(study)
        files.atomic_write_text(state / SUBMISSIONS, json.dumps(history + subs, indent=2) + "\n", "LAB_RESULTS")
    return subs


# ------------------------------------------------------------------ status
def _queue_state(job: str) -> str | None:
    p = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True)
    states = p.stdout.split()
    return states[0] if p.returncode == 0 and states else None


GENERIC = ("PapermillExecutionError", "training failed", "the notebook failed")
# what a Jupyter kernel may print while it shuts down; never the reason a run failed
NOISE = ("zmq.error", "tornado", "ZMQStream")


def _log_reason(log: Path) -> str:
    """The most specific reason in a job's output: the last exception that is not a generic wrapper."""
    if not log.exists():
        return f"no job output ({log})"
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines()]
    # the lab's own one-line errors come first
    ours = [ln for ln in lines if ln.startswith("error: ") and not any(g in ln for g in GENERIC)]
    if ours:
        return ours[-1][len("error: ") :][:300]
    exc = [
        ln
        for ln in lines
        if re.search(r"\b\w+(Error|Exception|Terminated): ", ln) and not any(g in ln for g in GENERIC + NOISE)
    ]
    if exc:
        return re.sub(r"^\[rank\d+\]:\s*", "", exc[-1])[:300]
    for ln in reversed(lines):
        if re.search(r"(error:|CANCELLED|DUE TO TIME LIMIT|Killed)", ln):
            return ln[:300]
    return f"see {log}"


def submissions(study: Study) -> list[dict]:
    """The study's job arrays so far (submissions.json: array job id and points of each); a damaged file is one
    line naming it and what removing it costs, not a traceback from deep in the status."""
    path = study.state_dir / SUBMISSIONS
    if not path.exists():
        return []
    try:
        subs = json.loads(path.read_text())
        ok = isinstance(subs, list) and all(
            isinstance(s, dict)
            and isinstance(s.get("array_job_id"), str)
            and isinstance(s.get("points"), list)
            and all(isinstance(i, int) and not isinstance(i, bool) for i in s["points"])
            for s in subs
        )
        why = "" if ok else "not a list of job arrays, each with its array_job_id and points"
    except (ValueError, UnicodeDecodeError) as e:
        why = f"not JSON ({e})"
    if why:
        raise ConfigError(
            f"{path}: {why}; it lists the study's job arrays. Restore it, or remove it: the records still say "
            f"which points are done, and points of arrays still queued or running then show as missing"
        )
    return subs


def status(study: Study) -> list[dict]:
    subs = submissions(study)
    last: dict[int, tuple[dict, int]] = {}
    for s in subs:
        for task, idx in enumerate(s["points"]):
            last[idx] = (s, task)
    rows = []
    for p in study.points:
        summary_path = study.runs_dir / p.run_id / "summary.json"
        try:
            summary = read_json(summary_path) if summary_path.exists() else None
        except RecordError as e:
            summary = {"status": "failed", "error": str(e)}
        job = None
        if p.index in last:
            s, task = last[p.index]
            job = f"{s['array_job_id']}_{task}"
        queued = _queue_state(job) if job else None
        if summary and summary.get("status") == "complete":
            state, reason = "done", ""
        elif queued:
            state, reason = "running", queued.lower()
        elif summary and summary.get("status") in ("failed", "stopped"):
            state, reason = "failed", summary.get("error") or summary["status"]
        elif job:
            state = "failed"
            reason = _log_reason(results_root() / "logs" / f"{study.name}-{job}.out")
        else:
            state, reason = "missing", "never submitted"
        rows.append(
            {
                "point": p.index,
                "gpus": p.gpus,
                "repeat": p.repeat,
                "run_id": p.run_id,
                "job": job or "",
                "state": state,
                "reason": reason,
                "params": {k: v for k, v in p.params.items() if k not in ("run_id", "label", "results_dir")},
            }
        )
    return rows


def print_status(rows: list[dict], out=sys.stdout) -> None:
    counts = {s: sum(r["state"] == s for r in rows) for s in ("done", "running", "failed", "missing")}
    print(" ".join(f"{k} {v}" for k, v in counts.items()), file=out)
    for r in rows:
        extra = " ".join(
            f"{k}={v}"
            for k, v in r["params"].items()
            if k in ("batch", "precision", "bucket_cap_mb", "pipeline", "seed")
        )
        print(
            f"p{r['point']:03d} gpus={r['gpus']:<3} {extra:<40} {r['state']:<8} {r['job']:<10} {r['reason']}", file=out
        )


def set_aside(study: Study, indices: list[int], out=sys.stdout) -> None:
    """Move the records of points about to run again to <results>/set_aside/ (kept, out of the analysis): a
    point's run id is fixed, and a complete record is never overwritten."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    for p in study.points:
        old = study.runs_dir / p.run_id
        if p.index in indices and old.is_dir():
            new = study.runs_dir.parent / "set_aside" / f"{p.run_id}-{stamp}"
            new.parent.mkdir(parents=True, exist_ok=True)
            old.rename(new)
            print(f"p{p.index:03d}: earlier record moved to {new}", file=out)


def chosen_points(study: Study, text: str) -> list[int]:
    """--points 3,7 -> [3, 7], each a point of the study."""
    try:
        picked = sorted({int(t) for t in text.split(",") if t.strip()})
    except ValueError:
        raise ConfigError(f"--points: {text!r} must be point indices separated by commas, e.g. 3,7") from None
    bad = [i for i in picked if not 0 <= i < len(study.points)]
    if bad or not picked:
        raise ConfigError(
            f"--points: study {study.name} has points 0..{len(study.points) - 1}, not "
            f"{', '.join(map(str, bad)) or text!r}"
        )
    return picked


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="lab study", description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["submit", "status", "resubmit", "points"])
    ap.add_argument("study", type=Path)
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="print the sbatch commands and write the parameter files they name; submit nothing",
    )
    ap.add_argument("--json", action="store_true", help="status as JSON")
    ap.add_argument("--point", type=int, help="points: print this point's parameter file (YAML for papermill -f)")
    ap.add_argument(
        "--points",
        default="",
        help="resubmit: these points (comma-separated indices, e.g. 3,7) whatever their state, such as "
        "points the analysis set aside; default: the failed and missing ones",
    )
    ap.add_argument(
        "--write",
        action="store_true",
        help="points: write every point's parameter file to results/studies/<study>/points/",
    )
    a = ap.parse_args(argv)

    def body() -> int:
        study = load(a.study)
        if a.command == "points":
            if a.point is not None:
                match = [p for p in study.points if p.index == a.point]
                if not match:
                    raise ConfigError(
                        f"--point: study {study.name} has points 0..{len(study.points) - 1}, not {a.point}"
                    )
                print(point_yaml(match[0]), end="")
                return 0
            for p in study.points:
                where = f"  -> {write_point(study, p)}" if a.write else ""
                print(f"p{p.index:03d} gpus={p.gpus} nodes={p.nodes}x{p.tasks_per_node} {p.params}{where}")
        elif a.command == "submit":
            submit(study, dry_run=a.dry_run)
        elif a.command == "status":
            rows = status(study)
            print(json.dumps(rows, indent=2)) if a.json else print_status(rows)
        else:
            todo = (
                chosen_points(study, a.points)
                if a.points
                else [r["point"] for r in status(study) if r["state"] in ("failed", "missing")]
            )
            print(f"resubmitting {len(todo)} point(s): {', '.join(map(str, todo)) or 'none'}")
            if a.points and not a.dry_run:
                set_aside(study, todo)
            submit(study, only=todo, dry_run=a.dry_run)
        return 0

    return exit_status(body)


if __name__ == "__main__":
    sys.exit(main())
