"""Where the lab's files live and how they are written.

The project root, the results home ($LAB_RESULTS, else <project>/results), and the
atomic write every record, checkpoint and table goes through: temporary file, fsync,
rename, with the mode the process umask allows (mkstemp alone gives 0600, which a
group's shared project directory cannot read). A leaf: it imports nothing of the lab.

A full disk: a run reserves RESERVE_BYTES in its directory at the start (.reserve,
incompressible bytes, really allocated). When a write fails for want of space, the
cause is written into that file in place (no new space needed), which frees the rest
for the record's last summary; failure.txt keeps the cause until a summary says it.
"""

from __future__ import annotations

import errno
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
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


def in_project(path: Path) -> str:
    """The path as a reader of the repository's documents should see it: relative to the repository where it
    lies inside it, else as given."""
    try:
        return str(Path(path).resolve().relative_to(PROJECT_ROOT))
    except ValueError:
        return str(path)


def atomic_write_bytes(path: Path, data: bytes, option: str = "") -> None:
    """Write `data` to `path` via a temporary file, fsync and rename: a reader never sees half a file.

    A failure (a full disk, a quota, a read-only file system) is a RecordError naming the path, and `option`, the
    setting that writes elsewhere.
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
        raise write_error(path, len(data), e, option) from None
    except BaseException:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str, option: str = "") -> None:
    atomic_write_bytes(path, text.encode("utf-8"), option)


def create(path: Path, mode: str = "w", **kw):
    """Open `path` as a new file for writing (text, or "wb"), whatever had the name removed first: a link planted
    there is removed, never written through (O_EXCL|O_NOFOLLOW). For files written as they grow (a monitor's
    samples); a file written whole goes through atomic_write_bytes."""
    path = Path(path)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    return os.fdopen(fd, mode, **kw)


def cannot_write(folder: Path) -> str | None:
    """Why no file can be written in `folder` (made if missing), or None: read-only, immutable, full, not yours.
    Tried with a real file, since modes do not tell (root ignores them; an immutable folder shows none)."""
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".write-test-", dir=folder)
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        return e.strerror or str(e)
    return None


def copy_file(src: Path, dest: Path, option: str = "") -> None:
    """Copy `src` to `dest` whole: into a new temporary beside it (see create) and renamed over `dest`. A full
    disk or a folder it may not write is the write error naming `dest` (and `option`, as atomic_write_bytes)."""
    import shutil

    dest = Path(dest)
    part = dest.with_name(f".{dest.name}.part")
    try:
        with open(src, "rb") as s:
            try:
                with create(part, "wb") as d:
                    shutil.copyfileobj(s, d, 1 << 20)
                os.replace(part, dest)
            except OSError as e:  # the writing side's: the source was opened above
                raise write_error(dest, os.fstat(s.fileno()).st_size, e, option) from None
    except BaseException:
        part.unlink(missing_ok=True)
        raise


@contextmanager
def replacing(path: Path):
    """A temporary name for a library that opens its output by name (PyTables, matplotlib, the profiler): inside
    a private new folder beside `path`, where nobody else can have planted a link, renamed over `path` when the
    block ends without an error. The folder goes either way."""
    import shutil

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield work / path.name
        os.replace(work / path.name, path)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def foreign(path: Path, own_link_ok: bool = False) -> str | None:
    """Why the lab must not write into the directory `path`, or None: it is a symbolic link (one of the user's
    own is accepted where own_link_ok: a results folder linked to scratch), or it (or where it leads) belongs to
    another user. A path that does not exist yet is fine: the lab makes it."""
    import stat

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    uid = os.getuid()
    if stat.S_ISLNK(st.st_mode):
        if not own_link_ok or st.st_uid != uid:
            return f"{path} is a symbolic link (to {os.readlink(path)}) owned by uid {st.st_uid}"
        st = os.stat(path)
    if st.st_uid != uid:
        return f"{path} belongs to another user (uid {st.st_uid}; you are {uid})"
    return None


def not_private(path: Path) -> str | None:
    """Why code the lab keeps at `path` (a cache folder or a library in it) could be another user's, or None: it
    is a symbolic link, belongs to another user, or others may write to it. A library loaded from there runs in
    every rank, so only the user's own, written by the user alone, is trusted. A path that does not exist is fine."""
    import stat

    why = foreign(path)  # a link, or another user's
    if why or not os.path.lexists(path):
        return why
    st = os.lstat(path)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def write_error(path: Path, nbytes: int, e: OSError, option: str = "") -> RecordError:
    """A failed write as a RecordError naming the file and the fix; its `path` is the file. `option`: what the
    user sets to write elsewhere (results_dir, --out, LAB_RESULTS); none named, the fix says "elsewhere"."""
    elsewhere = f"choose another {option}" if option else "write it elsewhere"
    fix = (
        f"free space there or {elsewhere}"
        if e.errno in DISK_FULL
        else f"the file or its directory is read-only, immutable or not yours: {elsewhere}"
    )
    err = RecordError(e.errno, f"cannot write {path} ({nbytes:,} bytes): {e.strerror or e}; {fix}")
    err.path = str(path)
    return err


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


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
RESERVE, FAILURE, RESERVE_BYTES = ".reserve", "failure.txt", 1 << 20
_MARK = b"failed: "


def _disk_full(exc: BaseException | None) -> OSError | None:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_FULL:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def disk_full_at(exc: BaseException | None) -> str | None:
    """The path a full disk (or a quota) refused, from `exc` or the exceptions behind it; None when no write
    failed for want of space."""
    full = _disk_full(exc)
    return None if full is None else str(getattr(full, "path", None) or full.filename or "an unnamed file")


def failure_text(exc: BaseException) -> str:
    """What a record says of a failure: 'disk full at <path> (<the system's words>)' when it was that."""
    full = _disk_full(exc)
    if full is None:
        return f"{type(exc).__name__}: {exc}"
    return f"disk full at {disk_full_at(full)} ({os.strerror(full.errno)})"


def reserve_space(run_dir: Path) -> None:
    """Hold RESERVE_BYTES in the run directory for the record of a failure on a full disk (replaces a
    failure.txt of an earlier attempt: its cause is known to the caller by then)."""
    atomic_write_bytes(Path(run_dir) / RESERVE, os.urandom(RESERVE_BYTES))  # random: no file system compresses it
    (Path(run_dir) / FAILURE).unlink(missing_ok=True)


def record_failure(run_dir: Path, cause: str) -> bool:
    """Write 'failed: <cause>' into the reserved space in place and free the rest, then name it failure.txt.
    False when there was no reserve and no room for the marker either."""
    res, mark = Path(run_dir) / RESERVE, Path(run_dir) / FAILURE
    data = (_MARK + cause.encode() + b"\n")[:RESERVE_BYTES]
    try:
        if not res.exists():
            atomic_write_bytes(mark, data)
            return True
        with open(res, "r+b") as f:
            f.write(data)
            f.truncate(len(data))
            f.flush()
            os.fsync(f.fileno())
        os.replace(res, mark)  # if even the name finds no room, .reserve holds the cause (failure_cause reads it)
        return True
    except OSError:
        return False


def failure_cause(run_dir: Path) -> str | None:
    """The cause an attempt wrote into its reserved space before it ended, if one did."""
    for name in (FAILURE, RESERVE):
        try:
            with open(Path(run_dir) / name, "rb") as f:
                head = f.read(4096)
        except OSError:
            continue
        if head.startswith(_MARK):
            return head[len(_MARK) :].decode(errors="replace").strip()
    return None


def clear_reserve(run_dir: Path) -> None:
    """The run's record is final (its summary says how it ended): neither the reserve nor a marker is needed."""
    for name in (RESERVE, FAILURE):
        (Path(run_dir) / name).unlink(missing_ok=True)
