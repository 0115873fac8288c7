"""Which MPI library starts and serves the benchmark's MPI ranks: Open MPI or MPICH, side by side on one machine.

    lab comm bench --backend mpi --mpi_library mpich --gpus 2

auto takes the `mpirun` on PATH as it is (a cluster's `module load` picks the library) and asks it which one it
is, since the two take different options. openmpi and mpich name a library where both are installed (Debian's
mpirun.openmpi and mpirun.mpich); the ranks then get what makes them use it:
- mpi4py's ABI (MPI4PY_MPIABI), which otherwise loads whichever libmpi it finds first;
- the compiler wrapper of the C loop (LAB_MPICC, kernels/comm/native.py), so each library builds its own;
- on Debian, whose MPICH ships libmpich.so.12 without the libmpi.so.12 name that mpi4py's MPICH module
  links against, a folder holding that one name as a link to libmpich.so.12 (created here, in the lab's
  cache, never over a file that is not the lab's own link), prepended to LD_LIBRARY_PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from kernels.base.errors import ConfigError
from kernels.base.files import not_private
from kernels.comm.native import cache_dir

LIBRARIES = ("auto", "openmpi", "mpich")  # the comm bench's mpi_library choices
DEBIAN_PACKAGES = {"openmpi": "openmpi-bin libopenmpi-dev", "mpich": "mpich libmpich-dev"}
DEBIAN_MPICH = Path("/usr/lib/x86_64-linux-gnu/libmpich.so.12")


def flavour(mpirun: str) -> str:
    """'openmpi' or 'mpich' (Hydra), from the launcher's own --version; 'mpich' for anything else (Intel MPI,
    MVAPICH and Cray MPICH are MPICH's ABI and take its options)."""
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "mpich"
    return "openmpi" if "Open MPI" in out or "OpenRTE" in out else "mpich"


def mpirun_path(library: str) -> str:
    """The launcher of `library`, as PATH finds it: mpirun.<library> where the distribution names them apart,
    else `mpirun`."""
    if library != "auto" and shutil.which(f"mpirun.{library}"):
        return f"mpirun.{library}"
    found = "mpirun"
    if not shutil.which(found):
        raise ConfigError(
            "parameter 'launcher': mpirun is not on PATH; install an MPI (Debian: apt-get install openmpi-bin, "
            "or mpich) or use srun inside an allocation"
        )
    kind = flavour(found) if library != "auto" else library
    if kind != library:
        raise ConfigError(
            f"parameter 'mpi_library': {library} asked for, but neither mpirun.{library} nor an mpirun of it is on "
            f"PATH (mpirun is {kind}'s); install it (Debian: apt-get install {DEBIAN_PACKAGES[library]}) "
            f"or use mpi_library=auto"
        )
    return found


def command(library: str, ranks: int, argv: list[str]) -> list[str]:
    """The mpirun command line starting `ranks` processes of argv with `library` (auto: the one on PATH)."""
    mpirun = mpirun_path(library)
    kind = library if library != "auto" else flavour(mpirun)
    cmd = [mpirun, "-np", str(ranks)]
    if kind == "openmpi":
        cmd += ["--oversubscribe", "--bind-to", "none"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")  # Open MPI refuses root without it (containers, CI)
    return cmd + list(argv)


def rank_env(library: str) -> dict:
    """What the ranks need to use `library` (nothing for auto: the environment as the cluster set it)."""
    if library == "auto":
        return {}
    env = {"MPI4PY_MPIABI": library}
    mpicc = shutil.which(f"mpicc.{library}")
    if mpicc and not os.environ.get("LAB_MPICC"):
        env["LAB_MPICC"] = mpicc
    if library == "mpich" and DEBIAN_MPICH.exists() and not DEBIAN_MPICH.with_name("libmpi.so.12").exists():
        folder = abi_folder()
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(folder), os.environ.get("LD_LIBRARY_PATH")]))
    return env


def abi_folder() -> Path:
    """<cache>/mpich-abi holding libmpi.so.12 -> Debian's libmpich.so.12; made once, atomically."""
    folder = cache_dir() / "mpich-abi"
    link = folder / "libmpi.so.12"
    why = not_private(cache_dir()) or not_private(folder)
    if why:  # a library another user puts there would run in every rank (the folder goes on LD_LIBRARY_PATH)
        raise ConfigError(f"parameter 'mpi_library': {why}; remove it, or set XDG_CACHE_HOME to a folder of your own")
    if link.is_symlink() and os.readlink(link) == str(DEBIAN_MPICH):
        return folder
    if link.exists() or link.is_symlink():
        raise ConfigError(
            f"parameter 'mpi_library': {link} exists and is not the lab's link to {DEBIAN_MPICH}; remove it"
        )
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = folder / f".libmpi.so.12.{os.getpid()}"
    os.symlink(DEBIAN_MPICH, tmp)
    os.replace(tmp, link)  # rename: never writes through a link it finds
    return folder
