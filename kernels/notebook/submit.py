"""Submit a notebook run with the right sbatch geometry for `gpus`.

    lab submit notebooks/01_train.ipynb --gpus 8 --gpus-per-node 4 [--dry-run] [-p NAME VALUE ...]
    lab submit notebooks/01_train.ipynb --gpus 8 --cluster leonardo-booster [--account ehpc123] ...

prints (and, without --dry-run, runs)

    sbatch --nodes=2 --ntasks-per-node=4 --gpus-per-node=4 \
        slurm/papermill_run.sbatch notebooks/01_train.ipynb -p gpus 8 ...

One task per GPU; a job that fits one node asks for one node. On CPU-only
nodes use --gpus-per-node 0 --ranks-per-node N (N ranks per node, no GPU request).
--cluster takes the GPUs per node, partition, account, QoS, cores per rank, time
limit and extra sbatch options from clusters/<name>.yaml; options given here win.
Its modules, container, network interface and variables reach the batch script
as a study's jobs get them. Remaining arguments go to papermill.

Everything a job would otherwise find out only once it leaves the queue is checked
first, and refused in one line: the notebook's parameters (as its resolve cell
checks them, with gpus from --gpus), the time limit's format, the profile's values.
A data set missing from its data_dir is a warning after the line (the job's nodes
may see a folder this one does not), since the job would stop there.

sbatch runs in the repository (the batch script's home), wherever lab submit is
called: the notebook and -f files are named as the job will find them there, and
with LAB_RESULTS set the job's log goes to $LAB_RESULTS/logs, as a study's do.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

from kernels.base.errors import ConfigError, exit_status
from kernels.base.files import PROJECT_ROOT, results_home
from kernels.base.params import RunConfig
from kernels.launch.config import missing_data
from kernels.launch.launchers import sbatch_geometry_args
from kernels.notebook.runner import precheck
from kernels.slurm.clusters import account_warning, cluster_env, export_option, load_cluster, slurm_time
from kernels.slurm.study import log_folder, require_sbatch

SBATCH_SCRIPT = "slurm/papermill_run.sbatch"


def sbatch_command(
    notebook: str,
    gpus: int,
    gpus_per_node: int,
    ranks_per_node: int = 0,
    partition: str = "",
    account: str = "",
    time: str = "",
    extra: list[str] | None = None,
    papermill_args: list[str] | None = None,
    qos: str = "",
) -> list[str]:
    papermill_args = list(papermill_args or [])
    for i, a in enumerate(papermill_args[:-1]):
        if a in ("-p", "--parameters") and papermill_args[i + 1] == "gpus":
            raise ConfigError("parameter 'gpus': give it as --gpus to the submit helper, not as -p gpus")
    if gpus_per_node > 0:
        geom = sbatch_geometry_args(gpus, gpus_per_node, with_gpus=True)
    else:
        if ranks_per_node < 1:
            raise ConfigError("--ranks-per-node: CPU-only nodes (--gpus-per-node 0) need the ranks per node")
        geom = sbatch_geometry_args(gpus, ranks_per_node, with_gpus=False) + ["--gpus-per-node=0"]
    cmd = ["sbatch", *geom]
    cmd += [f"--partition={partition}"] if partition else []
    cmd += [f"--account={account}"] if account else []
    cmd += [f"--qos={qos}"] if qos else []
    cmd += [f"--time={time}"] if time else []
    cmd += list(extra or [])
    return cmd + [SBATCH_SCRIPT, notebook, "-p", "gpus", str(gpus), *papermill_args]


def from_project_root(path: str) -> str:
    """The path as the job, which runs in the repository, will find it: relative to it when inside, else absolute."""
    p = Path(path).resolve()
    return str(p.relative_to(PROJECT_ROOT.resolve())) if p.is_relative_to(PROJECT_ROOT.resolve()) else str(p)


def files_from_project_root(papermill_args: list[str]) -> list[str]:
    """Papermill's -f/--parameters_file FILE as the job will find it (it runs in the repository, not here)."""
    out = list(papermill_args)
    for i, a in enumerate(out[:-1]):
        if a in ("-f", "--parameters_file"):
            out[i + 1] = from_project_root(out[i + 1])
    return out


def data_warning(cfg: RunConfig | None) -> str | None:
    """The run's data set checked from here, as the job's first step will check it. A warning, not a refusal: the
    job's nodes may see a data_dir this node does not."""
    why = missing_data(cfg) if cfg is not None else None
    return f"warning: the job would stop at its start: {why}" if why else None


def _options(args) -> dict:
    """The geometry and account options: those given, else the --cluster profile's, else none."""
    prof = {}
    if args.cluster:
        prof = load_cluster(args.cluster, "--cluster")
        warn = account_warning(prof) if args.account is None else None
        if warn:
            print(warn, file=sys.stderr)
    given = {k: getattr(args, k) for k in ("gpus_per_node", "ranks_per_node", "partition", "account", "qos", "time")}
    o = {k: v if v is not None else prof.get(k, 0 if k.endswith("per_node") else "") for k, v in given.items()}
    if args.gpus_per_node is None and not args.cluster:
        raise ConfigError(
            "--gpus-per-node: give the GPUs per node of the target partition (0 for CPU nodes), "
            "or --cluster NAME to take it from clusters/NAME.yaml"
        )
    if o["time"]:
        o["time"] = slurm_time(o["time"], "--time")
    o["extra"] = list(prof.get("sbatch_extra", []))
    if prof.get("cpus_per_task"):
        o["extra"].insert(0, f"--cpus-per-task={prof['cpus_per_task']}")
    o["extra"] += export_option(cluster_env(prof)) if prof else []
    return o


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="lab submit",
        description=__doc__.split("\n")[0],
        epilog="Every other argument passes through to the notebook (papermill): -p NAME VALUE sets one of its "
        "parameters (e.g. -p epochs 5 -p precision bf16), -f FILE a YAML file of them. 'gpus' comes from "
        "--gpus. Example: lab submit notebooks/01_train.ipynb "
        "--gpus 8 --gpus-per-node 4 --dry-run -p epochs 5",
    )
    ap.add_argument("notebook")
    ap.add_argument("--gpus", type=int, required=True, help="world size (ranks)")
    ap.add_argument(
        "--gpus-per-node",
        type=int,
        default=None,
        help="GPUs per node of the target partition (0: CPU nodes; default: the --cluster profile's)",
    )
    ap.add_argument("--ranks-per-node", type=int, default=None, help="CPU nodes only: ranks per node")
    ap.add_argument("--cluster", default="", help="a profile in clusters/ (or a YAML path) for everything not given")
    ap.add_argument("--partition", default=None)
    ap.add_argument("--account", default=None)
    ap.add_argument("--qos", default=None)
    ap.add_argument("--time", default=None, help="time limit, e.g. 01:00:00")
    ap.add_argument("--sbatch-arg", action="append", default=[], help="any further sbatch option (repeatable)")
    ap.add_argument("--dry-run", action="store_true", help="print the command, do not submit")
    args, papermill_args = ap.parse_known_args(argv)
    if not Path(args.notebook).is_file():
        print(f"error: notebook {args.notebook} not found", file=sys.stderr)
        return 2

    def body() -> int:
        o = _options(args)
        if os.environ.get("LAB_RESULTS"):  # the job's log beside the rest of its results, as a study's
            o["extra"].append(f"--output={results_home() / 'logs'}/%x-%j.out")
        cmd = sbatch_command(
            from_project_root(args.notebook),
            args.gpus,
            o["gpus_per_node"],
            o["ranks_per_node"],
            o["partition"],
            o["account"],
            o["time"],
            o["extra"] + args.sbatch_arg,
            files_from_project_root(papermill_args),
            qos=o["qos"],
        )
        warning = data_warning(precheck(Path(args.notebook), ["-p", "gpus", str(args.gpus), *papermill_args]))
        print(shlex.join(cmd), flush=True)
        if Path.cwd().resolve() != PROJECT_ROOT.resolve():
            print(f"  (the line runs from {PROJECT_ROOT}, where lab submit runs it)", flush=True)
        if warning:
            print(warning, file=sys.stderr, flush=True)
        log_folder(results_home() / "logs")  # where the job's log goes (the batch script's --output, or LAB_RESULTS)
        if args.dry_run:
            return 0
        require_sbatch("the job")
        return subprocess.run(cmd, cwd=PROJECT_ROOT).returncode

    return exit_status(body)


if __name__ == "__main__":
    sys.exit(main())
