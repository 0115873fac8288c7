"""Where the lab's files live and how they are written.

The project root, the results home ($LAB_RESULTS, else <project>/results), and the
atomic write every record, checkpoint and table goes through: temporary file, fsync,
rename, with the mode the process umask allows (mkstemp alone gives 0600, which a
group's shared project directory cannot read). A leaf: it imports nothing of the lab.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
RESULTS_ENV = "LAB_RESULTS"


def results_home() -> Path:
    """The results folder: $LAB_RESULTS, else <project>/results. Records go to its runs/."""
    return Path(os.environ.get(RESULTS_ENV) or PROJECT_ROOT / "results")


def _process_umask() -> int:
    # Read once at import (single-threaded then): os.umask can only be read by setting it.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# mkstemp creates files 0600 whatever the umask; records in a group's shared project
# directory must be readable by the group, so the final file gets the mode the umask allows.
FILE_MODE = 0o666 & ~_process_umask()


class RecordError(OSError):
    """A record file cannot be written or read back; the message names the file and the fix."""


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` via a temporary file, fsync and rename: a reader never sees half a file.

    A failure (a full disk, a quota, a read-only file system) is a RecordError naming the path.
    """
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
        raise RecordError(e.errno, f"cannot write {path} ({len(data):,} bytes): {e.strerror or e}; free space "
                                   f"there or choose another results_dir") from None
    except BaseException:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
        raise


def sizes(*nbytes: float) -> list[str]:
    """Byte counts in one unit, precise enough that different counts never print alike ("20 MiB free, needs
    about 20 MiB" explains nothing): KiB below 100 MiB, MiB below 100 GiB, else GiB."""
    top = max(nbytes)
    unit, scale = ("KiB", 2**10) if top < 100 * 2**20 else ("MiB", 2**20) if top < 100 * 2**30 else ("GiB", 2**30)
    for digits in range(4):
        out = [f"{b / scale:,.{digits}f} {unit}" for b in nbytes]
        if len(set(out)) == len(set(nbytes)):
            return out
    return out

