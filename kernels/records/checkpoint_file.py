"""Checkpoints: everything a run needs to continue as if never interrupted.

Model, optimizer, GradScaler, LR scheduler, position (epoch, step in epoch,
global step), every rank's RNG states, the config, and the record rows so far.

One checkpoint is one self-verifying file: a first line with the sha256 of the
bytes that follow (torch.save's zip), then those bytes. Loading reads the file once,
checks the sha256 before anything is unpickled, and only then loads it with
torch.load(weights_only=True), which builds tensors, numbers, strings and containers
and, from the allow-list SAFE_GLOBALS, numpy's arrays (the RNG states): a checkpoint
in a shared folder can be damaged or replaced, but reading it never runs code it
holds. Global rank 0 writes in an order that always leaves a complete checkpoint on
disk, with at most two checkpoints' worth of space:

  1. remove checkpoint.prev.pt (the oldest)   4. rename checkpoint.pt -> checkpoint.prev.pt
  2. write checkpoint.next.pt, fsync           5. rename checkpoint.next.pt -> checkpoint.pt
  3. (the new one is complete on disk)         6. fsync the directory

checkpoint.next.pt is created new (O_EXCL|O_NOFOLLOW, after removing whatever had
the name): a link planted there is removed, never written through; renames move
names, not what a link points to.

Loading tries checkpoint.next.pt (complete only when a write was interrupted after
step 3: the newest; the interrupted renames are then finished), checkpoint.pt, then
checkpoint.prev.pt, and uses the first that verifies; the others' problems come back
as notes. When none verifies it is a clear error naming the files and the fix.
Earlier formats: a file with its content's sha256 inside (`content_sha256`, over every
tensor's bytes and every value) is loaded as data only and then checked; a file with
no checksum is refused unless the run passes resume_unverified=true.

Fault injection (the fault suite): LAB_CHECKPOINT_FAULT=POINT[@N] kills the writing
process with SIGKILL at POINT of its N-th write (default 1); POINTS lists them.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import random
import signal
from pathlib import Path

import numpy as np
import torch

from kernels.base import files
from kernels.base.files import FILE_MODE, write_error

MAGIC = b"scaling-lab checkpoint 2 sha256="
FILENAME = "checkpoint.pt"
PREVIOUS = "checkpoint.prev.pt"
NEXT = "checkpoint.next.pt"
DIGEST_KEY = "content_sha256"
FAULT_ENV = "LAB_CHECKPOINT_FAULT"
# Where an injected fault can kill the writer, in the order of the write.
POINTS = ("start", "prev-removed", "next-half-written", "next-written", "rotated", "done")
_writes = 0  # this process's checkpoint writes, for FAULT_ENV's @N


def seed_everything(seed: int) -> None:
    """Python's, numpy's and torch's generators from one seed (a run's start; resume restores rng_state())."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


# ------------------------------------------------------------------ the content's checksum
def _feed(h, obj) -> None:
    """Hash `obj` as the checkpoint holds it: tensors and arrays by dtype, shape and bytes (no copy for a
    contiguous CPU tensor), containers by type, length and order, scalars by their exact repr."""
    if isinstance(obj, torch.Tensor) and obj.layout != torch.strided:  # sparse (DCRNN's supports): its parts
        h.update(f"S{obj.layout}{tuple(obj.shape)}".encode())
        t = obj.detach().cpu()
        parts = (
            (t.crow_indices(), t.col_indices(), t.values())
            if t.layout == torch.sparse_csr
            else (t.ccol_indices(), t.row_indices(), t.values())
            if t.layout == torch.sparse_csc
            else (t.coalesce().indices(), t.coalesce().values())
            if t.layout == torch.sparse_coo
            else None
        )
        if parts is None:
            raise TypeError(f"checkpoint: cannot checksum a tensor of layout {t.layout}")
        for part in parts:
            _feed(h, part)
    elif isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous().reshape(-1)
        h.update(f"T{t.dtype}{tuple(obj.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().data)
    elif isinstance(obj, np.ndarray):
        a = np.ascontiguousarray(obj)
        h.update(f"A{a.dtype.str}{a.shape}".encode())
        h.update(a.view(np.uint8).reshape(-1).data if a.size else b"")
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)}".encode())
        for k, v in obj.items():
            _feed(h, k)
            _feed(h, v)
    elif isinstance(obj, (list, tuple)):
        h.update(f"{type(obj).__name__}{len(obj)}".encode())
        for v in obj:
            _feed(h, v)
    elif obj is None or isinstance(obj, (bool, int, float, str, bytes, np.generic, torch.dtype, torch.device)):
        h.update(f"{type(obj).__name__}:{obj!r};".encode())
    else:  # an optimizer's or plug-in's own object: its pickle (deterministic for plain objects)
        h.update(f"P{type(obj).__qualname__}".encode())
        h.update(pickle.dumps(obj, protocol=4))


def content_digest(state: dict) -> str:
    """sha256 over everything in a checkpoint's state except the digest itself."""
    h = hashlib.sha256()
    _feed(h, {k: v for k, v in state.items() if k != DIGEST_KEY})
    return h.hexdigest()


def serialise(rng: list[dict], **payload) -> bytes:
    """The checkpoint's bytes: the line with the sha256 of the rest, then torch.save's zip. rng: every rank's RNG
    state, by global rank (each resumes its own stream)."""
    buf = io.BytesIO()
    torch.save({**payload, "rng": rng}, buf)
    body = buf.getvalue()
    return MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def safe_globals() -> list:
    """What a checkpoint may hold beyond tensors, numbers, strings and containers: numpy's RNG state (an
    array of uint32 and its dtype), under numpy 2's module names and numpy 1's."""
    reconstruct = (getattr(np, "_core", None) or np.core).multiarray._reconstruct
    return [
        np.ndarray,
        np.dtype,
        type(np.dtype(np.uint32)),
        (reconstruct, "numpy._core.multiarray._reconstruct"),
        (reconstruct, "numpy.core.multiarray._reconstruct"),
    ]


def load_bytes(data: bytes, what: str) -> dict:
    """torch.load of a checkpoint's zip as data only (tensors, containers, SAFE globals): a pickle naming anything
    else is refused before it is called. Raises ValueError naming `what` and the global it asked for."""
    try:
        with torch.serialization.safe_globals(safe_globals()):
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        import re

        named = re.search(r"GLOBAL ([\w.]+)", str(e))
        what_it_asks = f"it asks for {named.group(1)}" if named else str(e).splitlines()[0][:200]
        raise ValueError(
            f"{what} holds something other than data ({what_it_asks}); it was not written by the lab, "
            f"or by a plug-in that saves objects in it rather than state_dicts"
        ) from None


# ------------------------------------------------------------------ writing
def _fault(point: str) -> None:
    want = os.environ.get(FAULT_ENV)
    if want:
        name, _, nth = want.partition("@")
        if name == point and _writes == int(nth or 1):
            os.kill(os.getpid(), signal.SIGKILL)


def _write_file(path: Path, data: bytes) -> None:
    view = memoryview(data)
    half = len(data) // 2 if os.environ.get(FAULT_ENV, "").startswith("next-half-written") else 0
    with files.create(path, "wb") as f:  # a link planted at the name is removed, never written through
        os.fchmod(f.fileno(), FILE_MODE)
        if half:  # the fault suite: a writer killed with half the file on disk
            f.write(view[:half])
            f.flush()
            os.fsync(f.fileno())
            _fault("next-half-written")
        f.write(view[half:])
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(run_dir: Path, data: bytes) -> None:
    """Write `data` as the current checkpoint, keeping the one before as the previous (the module's order). A
    failure (a full disk, a quota) is a RecordError naming the file; the checkpoint before stays whole."""
    global _writes
    _writes += 1
    run_dir = Path(run_dir)
    cur, prev, nxt = run_dir / FILENAME, run_dir / PREVIOUS, run_dir / NEXT
    _fault("start")
    prev.unlink(missing_ok=True)
    _fault("prev-removed")
    try:
        _write_file(nxt, data)
    except OSError as e:
        nxt.unlink(missing_ok=True)
        raise write_error(nxt, len(data), e, "results_dir") from None
    _fault("next-written")
    if cur.exists():
        os.replace(cur, prev)
    _fault("rotated")
    os.replace(nxt, cur)
    for old in (cur, prev):  # checksums beside the files, from before the checksum moved inside: stale now
        old.with_name(old.name + ".sha256").unlink(missing_ok=True)
    _fsync_dir(run_dir)
    _fault("done")


# ------------------------------------------------------------------ reading
def exists(run_dir: Path) -> bool:
    return any((Path(run_dir) / name).exists() for name in (FILENAME, PREVIOUS, NEXT))


def read_state(path: Path, allow_unverified: bool = False) -> tuple[dict | None, str | None]:
    """(state, None) when the file verifies and loads as data, else (None, the problem). The file is read once:
    its checksum is checked on the bytes that are then loaded."""
    if Path(path).is_symlink():
        return None, f"is a symbolic link (to {os.readlink(path)}): the lab writes checkpoints as files, never links"
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        return None, f"cannot be read ({e.strerror or e})"
    if not data.startswith(MAGIC):
        return _earlier_format(Path(path), data, allow_unverified)
    end = data.find(b"\n", len(MAGIC), len(MAGIC) + 80)
    if end < 0:
        return None, "has a damaged first line (no checksum to check it by)"
    want, body = data[len(MAGIC) : end].decode("ascii", "replace"), memoryview(data)[end + 1 :]
    got = hashlib.sha256(body).hexdigest()
    if got != want:
        return None, f"checksum mismatch (sha256 {got[:12]}... of its bytes, its first line says {want[:12]}...)"
    return _as_state(body)


def _as_state(data) -> tuple[dict | None, str | None]:
    try:
        state = load_bytes(data, "it")
    except ValueError as e:
        return None, str(e)
    except Exception as e:  # truncated, torn, or not a checkpoint at all
        return None, f"cannot be loaded ({type(e).__name__}: {str(e)[:120]})"
    if not isinstance(state, dict):
        return None, f"holds a {type(state).__name__}, not a checkpoint"
    return state, None


def _earlier_format(path: Path, data: bytes, allow_unverified: bool) -> tuple[dict | None, str | None]:
    """A checkpoint of an earlier version: a checksum beside it (checked before loading), or its content's
    checksum inside (checked after loading as data only), or none (refused unless the run allows it)."""
    side = path.with_name(path.name + ".sha256")
    if side.exists():
        want, got = side.read_text().strip(), hashlib.sha256(data).hexdigest()
        if got != want:
            return None, f"checksum mismatch (sha256 {got[:12]}..., {side.name} says {want[:12]}...)"
    state, problem = _as_state(data)
    if state is None:
        return None, problem
    want = state.get(DIGEST_KEY)
    if want is not None:
        got = content_digest(state)
        if got != want:
            return None, f"content checksum mismatch (sha256 {got[:12]}... of what it holds, it says {want[:12]}...)"
    elif not side.exists() and not allow_unverified:
        return None, (
            "carries no checksum (a lab before checksums wrote it, or something else did): nothing "
            "vouches for it. If it is your own run's, resume with resume_unverified=true"
        )
    return state, None


def load(run_dir: Path, allow_unverified: bool = False) -> tuple[dict, Path, list[str]]:
    """(state, the file it came from, notes on the files passed over). Raises ConfigError when none verifies.
    A complete checkpoint.next.pt (a write killed between its fsync and its renames) is the newest: its renames
    are finished here, so it is loaded as checkpoint.pt."""
    from kernels.base.errors import ConfigError

    run_dir, notes = Path(run_dir), []
    cur, prev, nxt = run_dir / FILENAME, run_dir / PREVIOUS, run_dir / NEXT
    if nxt.exists():
        state, problem = read_state(nxt, allow_unverified)
        if state is not None:
            if cur.exists():
                os.replace(cur, prev)
            os.replace(nxt, cur)
            _fsync_dir(run_dir)
            return (
                state,
                cur,
                [f"a checkpoint write was interrupted after {NEXT} was complete; its renames are finished now"],
            )
        notes.append(f"{nxt} is an interrupted write ({problem}); passed over")
    for path in (cur, prev):
        if not path.exists():
            continue
        state, problem = read_state(path, allow_unverified)
        if state is not None:
            return state, path, notes
        notes.append(f"{path} is unusable: {problem}")
    raise ConfigError(
        f"no usable checkpoint in {run_dir}: {'; '.join(notes) or 'none found'}. To start the run "
        f"over, remove {run_dir} (or pass another run_id)"
    )
