"""The command lines of the Nsight wrappers (slurm/profile_nsys.sbatch, slurm/profile_ncu.sbatch).

A wrapper puts a prefix before every rank's command (LAB_RANK_WRAPPER, read by the srun
line that kernels/launch/launchers.py builds) and runs the notebook with profile_with=external:
the loop then marks the active steps with cudaProfilerStart/Stop and NVTX ranges
(data, forward, backward, optimizer, communication) instead of running torch.profiler,
since CUPTI serves one profiler at a time.

nsys: every rank, one report per rank, named from the run directory, SLURM_PROCID and
the job id (nsys expands %q{VAR} itself, in the rank's environment), capturing only the
cudaProfilerApi range. ncu: one rank (LAB_NCU_RANK, default 0), kernels matching
LAB_NCU_KERNELS, skipping LAB_NCU_SKIP launches and profiling LAB_NCU_COUNT, counting from
the start of the same range (--profile-from-start off).

    python -m kernels.profiling wrapper nsys|ncu [--print]   # the prefix, or an error when the tool is missing
"""

from __future__ import annotations

import os
import shlex
import shutil

OUT = "%q{LAB_RUN_DIR}"  # set by the driver before it starts the ranks


def in_run_dir(folder: str, command: list[str]) -> str:
    """A shell line that makes the run directory's report folder (rather than rely on the tool to make a missing
    one) and then becomes `command` followed by the rank's own command ("$@")."""
    return f'mkdir -p "${{LAB_RUN_DIR:?set by the driver}}/{folder}" && exec {shlex.join(command)} "$@"'


def nsys_prefix(environ=None) -> list[str]:
    env = os.environ if environ is None else environ
    nsys = [
        "nsys",
        "profile",
        f"--trace={env.get('LAB_NSYS_TRACE', 'cuda,nvtx,osrt,cudnn,cublas')}",
        "--capture-range=cudaProfilerApi",
        "--capture-range-end=stop",
        "--cuda-memory-usage=false",
        "--sample=none",
        "--force-overwrite=true",
        f"--output={OUT}/nsys/rank%q{{SLURM_PROCID}}-j%q{{SLURM_JOB_ID}}",
    ]
    return ["bash", "-c", in_run_dir("nsys", nsys), "lab-nsys"]


def ncu_prefix(environ=None) -> list[str]:
    env = os.environ if environ is None else environ
    rank = env.get("LAB_NCU_RANK", "0")
    if not rank.isdigit():
        raise ValueError(f"LAB_NCU_RANK={rank!r}: give one rank number (ncu profiles one rank)")
    ncu = [
        "ncu",
        "--target-processes",
        "all",
        "--profile-from-start",
        "off",
        "--kernel-name",
        f"regex:{env.get('LAB_NCU_KERNELS', '.')}",
        "--launch-skip",
        env.get("LAB_NCU_SKIP", "0"),
        "--launch-count",
        env.get("LAB_NCU_COUNT", "400"),  # about one ResNet-18 step: the first 20 would be the input pipeline's
        "--set",
        env.get("LAB_NCU_SET", "full"),
        "--force-overwrite",
        "--export",
        f"{OUT}/ncu/rank{rank}-j%q{{SLURM_JOB_ID}}",
    ]
    for k in ("LAB_NCU_SKIP", "LAB_NCU_COUNT"):
        if not env.get(k, "0").isdigit():
            raise ValueError(f"{k}={env[k]!r}: a launch count, a whole number")
    # only rank `rank` runs under ncu; the others run as they are
    script = f'if [ "${{SLURM_PROCID:-0}}" = "{rank}" ]; then {in_run_dir("ncu", ncu)}; else exec "$@"; fi'
    return ["bash", "-c", script, "lab-ncu"]


def prefix(tool: str, environ=None) -> list[str]:
    if tool == "nsys":
        return nsys_prefix(environ)
    if tool == "ncu":
        return ncu_prefix(environ)
    raise ValueError(f"unknown profiler {tool!r}: nsys or ncu")


def missing(tool: str) -> str | None:
    """The error when `tool` is not on this node's PATH, else None."""
    if shutil.which(tool):
        return None
    what = {"nsys": "Nsight Systems", "ncu": "Nsight Compute"}[tool]
    return (
        f"{tool} ({what}) is not on PATH on {os.uname().nodename}; load it (e.g. `module load cuda` or "
        f"`module load nsight-{'systems' if tool == 'nsys' else 'compute'}`) or put its bin/ on PATH"
    )
