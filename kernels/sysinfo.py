"""What machine and software this is: feeds every run record."""
from __future__ import annotations

import os
import platform
import socket
import subprocess
from pathlib import Path

from kernels.params import PROJECT_ROOT

SLURM_VARS = ("SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_NODELIST",
              "SLURM_JOB_NUM_NODES", "SLURM_NTASKS", "SLURM_JOB_PARTITION", "SLURM_JOB_ACCOUNT",
              "SLURM_CLUSTER_NAME", "SLURM_GPUS_ON_NODE", "SLURM_RESTART_COUNT")
LAB_VARS = ("LAB_STUDY_ID", "LAB_STUDY_POINT", "LAB_CONTAINER")


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


def software_versions() -> dict:
    import numpy
    import torch

    nccl = None
    if torch.cuda.is_available():
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            nccl = None
    return {
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


def device_name(device) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({cpu_name()})"


def slurm_ids(environ=None) -> dict:
    env = os.environ if environ is None else environ
    return {k.lower(): env[k] for k in SLURM_VARS if k in env}


def lab_ids(environ=None) -> dict:
    env = os.environ if environ is None else environ
    return {k.lower(): env[k] for k in LAB_VARS if k in env}


def host() -> str:
    return socket.gethostname()
