"""What machine and software this is: feeds every run record."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from kernels.base.files import PROJECT_ROOT, sizes

SLURM_VARS = (
    "SLURM_JOB_ID",
    "SLURM_JOB_NAME",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_JOB_NODELIST",
    "SLURM_JOB_NUM_NODES",
    "SLURM_NTASKS",
    "SLURM_JOB_PARTITION",
    "SLURM_JOB_ACCOUNT",
    "SLURM_CLUSTER_NAME",
    "SLURM_GPUS_ON_NODE",
    "SLURM_RESTART_COUNT",
)
LAB_VARS = ("LAB_STUDY_ID", "LAB_STUDY_POINT", "LAB_STUDY_REPEATS", "LAB_STUDY_BATCH", "LAB_CONTAINER", "LAB_NOTEBOOK")


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity (what Slurm's binding or taskset left it), not the
    machine's count, which overstates it inside an allocation."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def threads_per_rank(ranks_here: int) -> str:
    """OMP threads for each of `ranks_here` CPU ranks on this node: OMP_NUM_THREADS when set, else the usable
    cores shared out, as Slurm's --cpus-per-task would give them (never oversubscribed). A string, as OpenMP
    reads it (it may hold a list, e.g. "4,2")."""
    return os.environ.get("OMP_NUM_THREADS") or str(max(1, usable_cores() // ranks_here))


def git_info(root: Path = PROJECT_ROOT) -> dict:
    def git(*args):
        try:
            p = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return ""
        return p.stdout.strip() if p.returncode == 0 else ""

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {"commit": None, "dirty": None}
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return {"commit": commit, "dirty": dirty}


def software_versions(import_torch: bool = True) -> dict:
    """Versions a record keeps. import_torch=False (a process that never uses torch, e.g. an MPI rank): torch's
    version from its installed metadata, and no CUDA, cuDNN or NCCL, which only an imported torch can tell."""
    import numpy

    from kernels import __version__ as lab

    if not import_torch:
        from importlib import metadata

        try:
            torch_version = metadata.version("torch")
        except metadata.PackageNotFoundError:
            torch_version = None
        return {
            "lab": lab,
            "python": platform.python_version(),
            "torch": torch_version,
            "numpy": numpy.__version__,
            "cuda": None,
            "cudnn": None,
            "nccl": None,
        }
    import torch

    nccl = None
    if torch.cuda.is_available():
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            nccl = None
    return {
        "lab": lab,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": nccl,
    }


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_device_name() -> str:
    """The name benchmark tables give this host's CPU as a device, without importing torch."""
    return f"CPU ({cpu_name()})"


def device_name(device) -> str:
    """The GPU's name for a CUDA device, else this host's CPU; `device` a torch.device or its string ("cpu",
    "cuda:1"). Only a CUDA device imports torch, so a process that never uses torch (an MPI rank) can ask."""
    if str(device).split(":")[0] == "cuda":
        import torch

        return torch.cuda.get_device_name(device)
    return cpu_device_name()


def slurm_ids(environ=None) -> dict:
    env = os.environ if environ is None else environ
    return {k.lower(): env[k] for k in SLURM_VARS if k in env}


def job_tag(environ=None) -> str:
    """<job id> (<array job>_<task> in an array) under Slurm, else local-<time>-<pid>: names executed notebooks
    and traces."""
    env = os.environ if environ is None else environ
    if "SLURM_ARRAY_JOB_ID" in env and "SLURM_ARRAY_TASK_ID" in env:
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    if "SLURM_JOB_ID" in env:
        return env["SLURM_JOB_ID"]
    return "local-" + datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


def lab_ids(environ=None) -> dict:
    env = os.environ if environ is None else environ
    return {k.lower(): env[k] for k in LAB_VARS if k in env}


def host() -> str:
    return socket.gethostname()


def memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def gpus() -> list[dict]:
    """GPUs with model, memory and driver (nvidia-smi when present, else what torch sees)."""
    import shutil

    if shutil.which("nvidia-smi"):
        p = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        out = []
        for line in p.stdout.strip().splitlines():
            idx, name, mem, driver = [x.strip() for x in line.split(",")]
            out.append({"index": int(idx), "name": name, "memory_gib": round(int(mem) / 1024, 1), "driver": driver})
        if out:
            return out
    import torch

    if torch.cuda.is_available():
        return [
            {
                "index": i,
                "name": torch.cuda.get_device_name(i),
                "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1),
                "driver": None,
            }
            for i in range(torch.cuda.device_count())
        ]
    return []


def network_interfaces() -> list[dict]:
    """Interfaces with state and speed (Mb/s, when the kernel reports it); InfiniBand devices too."""
    out = []
    base = Path("/sys/class/net")
    for d in sorted(base.iterdir()) if base.is_dir() else []:

        def read(name):
            try:
                return (d / name).read_text().strip()
            except OSError:
                return None

        speed = read("speed")
        out.append(
            {
                "name": d.name,
                "state": read("operstate"),
                "mtu": read("mtu"),
                "speed_mbps": int(speed) if speed and speed.lstrip("-").isdigit() and int(speed) > 0 else None,
            }
        )
    ib = Path("/sys/class/infiniband")
    for d in sorted(ib.iterdir()) if ib.is_dir() else []:
        out.append({"name": d.name, "state": "infiniband", "mtu": None, "speed_mbps": None})
    return out


def slurm_version() -> str | None:
    import shutil

    for tool in ("sinfo", "srun", "scontrol"):
        if shutil.which(tool):
            p = subprocess.run([tool, "--version"], capture_output=True, text=True)
            if p.returncode == 0 and p.stdout.strip():
                return p.stdout.strip()
    # the tools exit before printing their version when no slurm.conf is reachable
    return "installed, not configured on this machine" if shutil.which("sinfo") else None


def container() -> str | None:
    return (
        os.environ.get("APPTAINER_CONTAINER")
        or os.environ.get("SINGULARITY_CONTAINER")
        or os.environ.get("LAB_CONTAINER")
        or None
    )


def node_facts() -> dict:
    """This node's hardware, network, Slurm and container: what every run record adds to its versions."""
    return {
        "host": host(),
        "slurm_node": os.environ.get("SLURMD_NODENAME"),
        "os": platform.platform(),
        "cpu": cpu_name(),
        "cpu_cores": os.cpu_count(),
        "memory_gib": memory_gib(),
        "gpus": gpus(),
        "network": network_interfaces(),
        "slurm": slurm_version(),
        "container": container(),
    }


def system_facts() -> dict:
    """Everything SYSTEM.md says about this node."""
    return {**node_facts(), "software": software_versions(), "git": git_info()}


def node_sections(nodes: list[dict], heading: str = "###") -> list[str]:
    """Markdown lines describing one or more nodes: every host is named; identical nodes share one table."""
    groups: list[tuple[list[dict], dict]] = []
    for f in nodes:  # identical hardware and software: one table, all their host names
        key = {k: f.get(k) for k in ("os", "cpu", "cpu_cores", "memory_gib", "gpus", "software", "slurm", "container")}
        for hosts, k in groups:
            if k == key:
                hosts.append(f)
                break
        else:
            groups.append(([f], key))
    lines = []
    for members, _ in groups:
        f = members[0]
        sw = f["software"]
        names = ", ".join(m["host"] + (f" ({m['slurm_node']})" if m.get("slurm_node") else "") for m in members)
        lines += [
            f"{heading} {names}" + (" (identical nodes)" if len(members) > 1 else ""),
            "",
            "| item | value |",
            "|---|---|",
            f"| OS | {f['os']} |",
            f"| CPU | {f['cpu']}, {f['cpu_cores']} logical cores |",
            f"| memory | {f['memory_gib']} GiB |",
            f"| GPUs | {len(f['gpus'])}"
            + (f" x {f['gpus'][0]['name']} ({f['gpus'][0]['memory_gib']} GiB)" if f["gpus"] else " (none)")
            + " |",
            f"| GPU driver | {f['gpus'][0]['driver'] if f['gpus'] and f['gpus'][0]['driver'] else 'none'} |",
            f"| Python | {sw['python']} |",
            f"| PyTorch | {sw['torch']} |",
            f"| CUDA / cuDNN / NCCL | {sw['cuda'] or 'none'} / {sw['cudnn'] or 'none'} / {sw['nccl'] or 'none'} |",
            f"| NumPy | {sw['numpy']} |",
            f"| Slurm | {f['slurm'] or 'not installed'} |",
            f"| container | {f['container'] or 'none (virtual environment)'} |",
            f"| code | {(f['git'].get('commit') or 'unknown')[:12]}{' (dirty)' if f['git'].get('dirty') else ''} |",
            "",
            "Network interfaces:",
            "",
            "| interface | state | MTU | speed |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {n['name']} | {n['state']} | {n['mtu'] or ''} | "
            f"{str(n['speed_mbps']) + ' Mb/s' if n['speed_mbps'] else ''} |"
            for n in f["network"]
        ]
        lines.append("")
    return lines


def host_names(nodes: list[dict]) -> str:
    return ", ".join(f["host"] + (f" (Slurm node {f['slurm_node']})" if f.get("slurm_node") else "") for f in nodes)


def read_node(path: Path, option: str = "--merge") -> dict:
    """A node description `lab sysinfo --json` wrote; `option` names where the file came from (--merge, or
    --systems-dir for a target system's nodes)."""
    import json

    from kernels.base.errors import ConfigError

    try:
        facts = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"{option}: {path} is not a node description written by `lab sysinfo --json` ({e}); "
            f"write one file per node with `srun --ntasks-per-node=1 lab sysinfo --json --out-dir DIR`"
        ) from None
    keys = ("host", "cpu", "software", "gpus", "network", "git")
    missing = [k for k in keys if k not in facts] if isinstance(facts, dict) else keys
    if not isinstance(facts, dict) or missing:
        lacks = ", ".join(missing) if isinstance(facts, dict) else "a node's facts (it is not a JSON object)"
        raise ConfigError(f"{option}: {path} lacks {lacks}; regenerate it with `lab sysinfo --json`")
    return facts


def free_space(path: Path) -> tuple[Path, int]:
    """(the nearest existing directory at or above `path`, its free bytes): room on the disk a path will go to."""
    import shutil

    probe = Path(path)
    while not probe.exists():
        probe = probe.parent
    return probe, shutil.disk_usage(probe).free


def short_of_room(path: Path, need: int) -> tuple[Path, str, str] | None:
    """(the nearest existing directory at or above `path`, its free space, `need`: both in one unit) when the disk
    `path` goes to has less than `need` bytes free; None when it has room. Each caller words its own refusal."""
    probe, free = free_space(path)
    if free >= need:
        return None
    has, needs = sizes(free, need)
    return probe, has, needs


def cpu_list(cpus: list[int]) -> str:
    """0,1,2,3,8,9 -> '0-3,8-9' (the form of taskset and Slurm's cpu lists)."""
    out, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


def cpu_set(text: str | None) -> set[int]:
    """'0-3,8' -> {0, 1, 2, 3, 8}: the inverse of cpu_list (Slurm's and taskset's cpu list form)."""
    out: set[int] = set()
    for part in (text or "").split(","):
        if "-" in part:
            a, b = part.split("-")
            out |= set(range(int(a), int(b) + 1))
        elif part.strip():
            out.add(int(part))
    return out
