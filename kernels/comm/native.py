"""The MPI benchmark's timed loop in C (kernels/comm/mpi_loop.c): built once per MPI library, called through ctypes.

A Python loop around mpi4py pays about 0.5 us of interpreter and argument parsing per call, and on a
shared-memory link any gap between two calls also slows the next one: on the project's 2-core VM an
8-byte MPI_Allreduce between 2 ranks takes 0.45 us in a C loop and about 2 us from a Python loop.
nccl-tests and the OSU benchmarks time their loops in C; so does the lab, when it can build this file.

The library is built with the MPI library's own compiler wrapper ($LAB_MPICC, else `mpicc` on PATH) into
$XDG_CACHE_HOME/scaling-lab (default ~/.cache/scaling-lab), under a name that hashes the source, the MPI
library's version string and the wrapper, so a `module load` of another MPI builds its own. Ranks that build
at the same time each write a temporary file and rename it into place. `LAB_MPI_LOOP=python` keeps the
Python loop (to compare the two); a failed build also falls back to it, and the record says which loop timed.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from kernels.base.files import not_private

SOURCE = Path(__file__).with_name("mpi_loop.c")
OP_CODES = {
    "all_reduce": 0,
    "all_gather": 1,
    "reduce_scatter": 2,
    "broadcast": 3,
    "reduce": 4,
    "all_to_all": 5,
    "send_recv": 6,
    "gather": 7,
    "scatter": 8,
}  # the enum in mpi_loop.c
LOOP_CHOICES = ("auto", "python")


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "scaling-lab"


def requested_loop(env=None) -> str:
    """$LAB_MPI_LOOP: auto (the C loop when it builds, the default) or python."""
    value = (env if env is not None else os.environ).get("LAB_MPI_LOOP", "auto") or "auto"
    if value not in LOOP_CHOICES:
        from kernels.base.errors import ConfigError

        raise ConfigError(f"LAB_MPI_LOOP={value!r}: use auto (time in C when mpicc builds the loop) or python")
    return value


def load(library_version: str) -> tuple[ctypes.CDLL | None, str]:
    """(the loaded library, how it was found) or (None, why not): the caller falls back to its Python loop."""
    if requested_loop() == "python":
        return None, "python loop (LAB_MPI_LOOP=python)"
    mpicc = os.environ.get("LAB_MPICC") or shutil.which("mpicc")
    if not mpicc:
        return None, "python loop (no mpicc on PATH to build kernels/comm/mpi_loop.c; set LAB_MPICC)"
    key = hashlib.sha256(SOURCE.read_bytes() + library_version.encode() + mpicc.encode()).hexdigest()[:16]
    path = cache_dir() / f"mpi_loop-{key}.so"
    why = not_private(cache_dir()) or not_private(path)
    if why:  # another user's library would run in every rank
        return None, f"python loop ({why}: the built loop is not loaded from there; remove it or set XDG_CACHE_HOME)"
    if not path.exists():
        why = _build(mpicc, path)
        if why:
            return None, f"python loop ({why})"
    lib = ctypes.CDLL(str(path))
    fn = lib.lab_timed_loop
    fn.restype = ctypes.c_double
    fn.argtypes = [
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    return lib, f"C loop ({SOURCE.name} built with {mpicc})"


def _build(mpicc: str, path: Path) -> str | None:
    """Compile into `path` (atomically); None when it worked, else one line saying why not."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
        os.close(fd)
    except OSError as e:
        return f"cannot write {path.parent}: {e.strerror}"
    try:
        p = subprocess.run(
            [mpicc, "-O2", "-shared", "-fPIC", "-o", tmp, str(SOURCE)], capture_output=True, text=True, timeout=120
        )
        if p.returncode != 0:
            last = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]
            return f"{mpicc} failed to build {SOURCE.name}: {last[0][:200]}"
        os.replace(tmp, path)
        return None
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{mpicc} could not run: {e}"
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
