"""Cluster profiles (clusters/<name>.yaml): read, every value typed, and what a profile adds to a job's sbatch line.

A profile is the one file that changes between clusters. Every submitter (`lab submit`, `lab study`, `lab sweep`,
`lab bigmnist submit`) and SYSTEM.md read it through `load_cluster`, which refuses a misspelt key or a value of the
wrong kind with one line naming the file, the key and the fix, before anything is printed or written: a string
where a list belongs used to reach sbatch one character per option, a word where a count belongs ended in a
traceback. `cluster_env` is what the batch script needs from the profile (its modules, container, network
interface and variables), the same for a single run and a study's arrays.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from kernels.base import yamlfile
from kernels.base.errors import ConfigError
from kernels.base.files import PROJECT_ROOT

CLUSTER_KEYS = {
    "name": "profile name",
    "partition": "Slurm partition",
    "account": "Slurm account",
    "qos": "Slurm quality of service (empty: the partition's default)",
    "gpus_per_node": "GPUs per node (0: CPU-only nodes)",
    "ranks_per_node": "CPU-only nodes: ranks per node",
    "max_nodes": "nodes in the partition",
    "time": "time limit per run, e.g. 01:00:00",
    "cpus_per_task": "CPU cores per rank",
    "container": "Apptainer image (empty: the venv)",
    "modules": "environment modules to load",
    "nccl_ifname": "network interface for NCCL/gloo",
    "sbatch_extra": "further sbatch options",
    "env": "environment variables exported to the jobs",
}
DEFAULTS = {
    "partition": "",
    "account": "",
    "qos": "",
    "gpus_per_node": 0,
    "ranks_per_node": 0,
    "max_nodes": 0,
    "time": "01:00:00",
    "cpus_per_task": 1,
    "container": "",
    "modules": [],
    "nccl_ifname": "",
    "sbatch_extra": [],
    "env": {},
}
# The least each count may be (max_nodes 0: the partition's size is not known, nothing is checked against it)
COUNTS = {"gpus_per_node": 0, "ranks_per_node": 0, "max_nodes": 0, "cpus_per_task": 1}
WORDS = ("partition", "account", "qos", "container", "nccl_ifname")  # one word each: no space, no control character
# sbatch's time formats: minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes,
# days-hours:minutes:seconds; and no limit
TIME = re.compile(r"\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}|unlimited|infinite", re.IGNORECASE)
VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_keys(d: dict, allowed: dict, where: str) -> None:
    """A mapping whose keys are all in `allowed`; else one line with the nearest allowed key."""
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: expected a mapping of keys ({', '.join(allowed)}), got {type(d).__name__}")
    for k in d:
        if k not in allowed:
            close = difflib.get_close_matches(str(k), list(allowed), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"{where}: unknown key '{k}'{hint} Allowed: {', '.join(allowed)}")


def count(value, where: str, least: int = 0, what: str = "") -> int:
    """An integer >= least (YAML's true/false are not counts); else one line naming `where`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{where}: {value!r} must be a whole number >= {least}{f': {what}' if what else ''}")
    return value


def slurm_time(value, where: str) -> str:
    """A time limit in one of sbatch's formats (a bare number is minutes); else one line with examples."""
    text = str(value).strip()
    if isinstance(value, bool) or not TIME.fullmatch(text):
        raise ConfigError(
            f'{where}: {value!r} is not a Slurm time limit; write hours:minutes:seconds ("02:00:00"), minutes '
            f'(90) or days-hours:minutes:seconds ("1-12:00:00")'
        )
    return text


def _word(value, where: str) -> str:
    if isinstance(value, (dict, list, bool)) or value is None or re.search(r"[\s\x00-\x1f\x7f]", str(value)):
        raise ConfigError(f"{where}: {value!r} must be one word (no spaces or line breaks); '' for none")
    return str(value)


def _strings(value, where: str, example: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() == v and v for v in value):
        raise ConfigError(f"{where}: {value!r} must be a list of strings, e.g. {example}; [] for none")
    return value


# names that hold secrets by convention: a value under `env` reaches the sbatch command line, which every user of
# the login node can read in `ps` while sbatch runs, and the line the submitters print
SECRET = re.compile(r"TOKEN|SECRET|PASSW(OR)?D|API_?KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL", re.IGNORECASE)


def check_env(value, where: str) -> dict:
    """`env` of a profile, a study or a sweep: variable names mapped to one-line values without ',' (sbatch
    --export would split them), and no secret (it would be on a command line others can read)."""
    if not isinstance(value, dict):
        raise ConfigError(
            f"{where}: key 'env': {value!r} must map variable names to values, e.g. {{OMP_NUM_THREADS: 8}}"
        )
    for k, v in value.items():
        if not VARIABLE.fullmatch(str(k)):
            raise ConfigError(f"{where}: key 'env': {str(k)!r} is not a variable name (letters, digits and '_')")
        if SECRET.search(str(k)):
            raise ConfigError(
                f"{where}: key 'env.{k}': looks like a secret, and values here reach the sbatch command line "
                f"(on most login nodes, readable by every user in ps while sbatch runs) and the printed line; "
                f"export it in your shell before submitting instead: jobs get the submitting shell's environment"
            )
        if isinstance(v, (dict, list)) or v is None or re.search(r"[,\x00-\x1f\x7f]", str(v)):
            raise ConfigError(
                f"{where}: key 'env.{k}': {v!r} must be one line of text without ',' (sbatch --export would "
                f"split it into another variable there)"
            )
    return value


def typed(prof: dict, where: str) -> dict:
    """The profile with its defaults, every value checked for its kind; ConfigError naming the key otherwise."""
    prof = {**DEFAULTS, **prof}
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", str(prof["name"])):
        raise ConfigError(
            f"{where}: key 'name' (by default the file's name): {prof['name']!r} may hold letters, digits, '-', '_' "
            f"and '.' only"
        )
    for key, least in COUNTS.items():
        count(prof[key], f"{where}: key '{key}'", least, CLUSTER_KEYS[key])
    for key in WORDS:
        prof[key] = _word(prof[key], f"{where}: key '{key}'")
    prof["time"] = slurm_time(prof["time"], f"{where}: key 'time'")
    _strings(prof["modules"], f"{where}: key 'modules'", "[cuda/12.8, nccl]")
    _strings(prof["sbatch_extra"], f"{where}: key 'sbatch_extra'", '["--exclusive", "--constraint=h100"]')
    bad = [o for o in prof["sbatch_extra"] if not o.startswith("-")]
    if bad:
        raise ConfigError(f"{where}: key 'sbatch_extra': {bad[0]!r} is not an sbatch option (they start with '-')")
    check_env(prof["env"], where)
    if prof["gpus_per_node"] == 0 and prof["ranks_per_node"] < 1:
        raise ConfigError(f"{where}: key 'ranks_per_node' must be >= 1 on CPU-only nodes (gpus_per_node: 0)")
    return prof


def load_cluster(ref: str, what: str = "study key 'cluster'") -> dict:
    """clusters/<ref>.yaml, or the YAML file `ref` names, typed; `what` names where the reference came from."""
    path = Path(ref) if ref.endswith((".yaml", ".yml")) else PROJECT_ROOT / "clusters" / f"{ref}.yaml"
    if not path.is_file():
        raise ConfigError(
            f"{what}: no cluster profile {path}; "
            f"profiles: {', '.join(p.stem for p in (PROJECT_ROOT / 'clusters').glob('*.yaml'))}"
        )
    prof = yamlfile.read(path, "cluster profile")
    check_keys(prof, CLUSTER_KEYS, f"cluster profile {path}")
    return typed({"name": path.stem, **prof}, f"cluster profile {path}")


def cluster_options(cluster: dict) -> list[str]:
    """The sbatch options every job on this cluster gets from its profile."""
    opts = [f"--partition={cluster['partition']}"] if cluster["partition"] else []
    opts += [f"--account={cluster['account']}"] if cluster["account"] else []
    opts += [f"--qos={cluster['qos']}"] if cluster["qos"] else []
    return opts + list(cluster["sbatch_extra"])


def cluster_env(cluster: dict) -> dict[str, str]:
    """The variables slurm/papermill_run.sbatch takes from the profile: its env, and the container, the network
    interface and the modules it sets up before Python starts."""
    env = {k: str(v) for k, v in cluster["env"].items()}
    if cluster["container"]:
        env["LAB_CONTAINER"] = cluster["container"]
    if cluster["nccl_ifname"]:
        env["LAB_NCCL_IFNAME"] = cluster["nccl_ifname"]
    if cluster["modules"]:
        env["LAB_MODULES"] = " ".join(cluster["modules"])
    return env


def export_option(env: dict[str, str]) -> list[str]:
    """sbatch --export=ALL,NAME=VALUE,...; a ',' inside a value would start another variable, so it is refused."""
    if not env:
        return []
    bad = [k for k, v in env.items() if "," in v]
    if bad:
        raise ConfigError(f"cluster profile: values of {', '.join(bad)} must not contain ',' (sbatch --export)")
    return ["--export=ALL," + ",".join(f"{k}={v}" for k, v in env.items())]


def account_warning(cluster: dict) -> str | None:
    """Most production clusters refuse jobs without an account; say so before sbatch does, less cryptically."""
    if cluster["account"] or cluster["name"] == "local":
        return None
    return (
        f"warning: cluster profile '{cluster['name']}' has no account; most clusters refuse jobs without one. "
        f"Set 'account:' in clusters/{cluster['name']}.yaml (e.g. your project id)."
    )
